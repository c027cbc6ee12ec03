"""A fake OCI registry: the part of the distribution API simrun and BuildKit use, over real HTTP.

It stands in for Zot (deploy/cluster/zot.yaml), which cannot run here (no container runtime,
no network), so `has_image` asks it over HTTP exactly as it asks the cluster's registry and the
stand-in of `buildctl` (`buildctl.py`, which stands in for BuildKit) pushes to it as BuildKit
pushes. `FakeRegistry` serves on 127.0.0.1 at an ephemeral port (`host`, the registry host of
image references; `url`, its API) from a thread (`http.server`), so a test may be sync or async.

Served (OCI distribution spec v1.1, the subset):

- `GET /v2/`: 200 `{}` with `Docker-Distribution-API-Version: registry/2.0`;
- `HEAD`/`GET /v2/<name>/manifests/<tag or digest>`: 200 with the manifest (GET), its
  `Content-Type` (its media type), `Content-Length` and `Docker-Content-Digest`; 404 with the
  OCI error body, `MANIFEST_UNKNOWN` (or `NAME_UNKNOWN` for a repository without manifests;
  a HEAD has the headers only);
- `PUT /v2/<name>/manifests/<reference>`: an image manifest or index of a known media type
  whose config and layers (or manifests) are in the registry; 201 with `Location` and
  `Docker-Content-Digest`; 400 `MANIFEST_INVALID`, `MANIFEST_BLOB_UNKNOWN`, `DIGEST_INVALID`;
- `HEAD /v2/<name>/blobs/<digest>`, `POST /v2/<name>/blobs/uploads/` (202 with a `Location`, or
  201 for a monolithic upload with `?digest=`), `PUT <location>?digest=` (201; 400
  `DIGEST_INVALID` for a body of another digest).

`credentials=(user, password)` makes the writes (POST, PUT) ask for HTTP basic authentication
(401 `UNAUTHORIZED` with `WWW-Authenticate: Basic realm=...`), reads stay anonymous, as Zot's
`accessControl` with an `anonymousPolicy` of `read`. `answer_with = status` makes every request
answer that status (a registry that is down or broken). `requests` records every request:
(method, path, headers).

Not done: chunked uploads (PATCH), cross-repository mounts, DELETE, tags/list, the catalog,
referrers, token authentication, the `Accept` negotiation of manifests (any manifest is answered
whatever the client accepts), garbage collection.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

MANIFEST_TYPES = {
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
_NAME = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
_MANIFEST = re.compile(rf"^/v2/(?P<name>{_NAME})/manifests/(?P<reference>[^/]+)$")
_BLOB = re.compile(rf"^/v2/(?P<name>{_NAME})/blobs/(?P<digest>[^/]+)$")
_UPLOADS = re.compile(rf"^/v2/(?P<name>{_NAME})/blobs/uploads/(?P<upload>[^/]*)$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Manifest:
    """A manifest as stored: its bytes and media type."""

    data: bytes
    media_type: str

    @property
    def digest(self) -> str:
        return digest_of(self.data)


@dataclass
class _State:
    manifests: dict[str, dict[str, Manifest]] = field(default_factory=dict)
    """By repository, by digest."""
    tags: dict[str, dict[str, str]] = field(default_factory=dict)
    """By repository: tag -> digest."""
    blobs: dict[str, bytes] = field(default_factory=dict)
    uploads: dict[str, str] = field(default_factory=dict)
    """Upload id -> repository."""
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)


class _ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.detail = status, code, message, detail


class FakeRegistry:
    """`with FakeRegistry() as registry:` serves a registry at `registry.url` (see the module)."""

    def __init__(self, *, credentials: tuple[str, str] | None = None) -> None:
        self.credentials = credentials
        self.answer_with: int | None = None
        self._state = _State()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle

    def start(self) -> FakeRegistry:
        registry = self

        class Handler(_Handler):
            owner = registry

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fake-registry", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._server = self._thread = None

    def __enter__(self) -> FakeRegistry:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses

    @property
    def host(self) -> str:
        """The registry host of image references, `127.0.0.1:<port>`."""
        assert self._server is not None, "the registry is not started"
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    # -- the content, for tests

    @property
    def requests(self) -> list[tuple[str, str, dict[str, str]]]:
        with self._lock:
            return list(self._state.requests)

    def has(self, repository: str, reference: str) -> bool:
        """Whether a manifest of a tag or digest is there."""
        with self._lock:
            return self._find(repository, reference) is not None

    def manifest(self, repository: str, reference: str) -> dict[str, Any]:
        with self._lock:
            found = self._find(repository, reference)
        if found is None:
            raise KeyError(f"{repository}:{reference}")
        loaded: dict[str, Any] = json.loads(found.data)
        return loaded

    def add_image(self, repository: str, tag: str, content: bytes = b"layer") -> str:
        """Put a small image (a config and one layer) under a tag; its manifest's digest."""
        config = json.dumps({"architecture": "amd64", "os": "linux"}).encode()
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": _descriptor("application/vnd.oci.image.config.v1+json", config),
            "layers": [_descriptor("application/vnd.oci.image.layer.v1.tar", content)],
        }
        data = json.dumps(manifest).encode()
        with self._lock:
            for blob in (config, content):
                self._state.blobs[digest_of(blob)] = blob
            self._put_manifest(repository, tag, data, manifest["mediaType"])
        return digest_of(data)

    # -- the API (under the lock)

    def _find(self, repository: str, reference: str) -> Manifest | None:
        manifests = self._state.manifests.get(repository) or {}
        digest = (
            reference
            if _DIGEST.match(reference)
            else self._state.tags.get(repository, {}).get(reference)
        )
        return manifests.get(digest or "")

    def _put_manifest(self, repository: str, reference: str, data: bytes, media_type: str) -> str:
        if media_type not in MANIFEST_TYPES:
            raise _ApiError(400, "MANIFEST_INVALID", "manifest invalid", {"mediaType": media_type})
        try:
            manifest = json.loads(data)
        except ValueError:
            raise _ApiError(400, "MANIFEST_INVALID", "manifest invalid") from None
        if not isinstance(manifest, dict) or manifest.get("schemaVersion") != 2:
            raise _ApiError(400, "MANIFEST_INVALID", "manifest invalid")
        declared = manifest.get("mediaType")
        if declared is not None and declared != media_type:
            raise _ApiError(400, "MANIFEST_INVALID", "media type does not match the content")
        if media_type in INDEX_TYPES:
            known = self._state.manifests.get(repository) or {}
            for item in manifest.get("manifests") or []:
                if item.get("digest") not in known:
                    raise _ApiError(
                        400, "MANIFEST_UNKNOWN", "manifest unknown", {"digest": item.get("digest")}
                    )
        else:
            for item in [manifest.get("config") or {}, *(manifest.get("layers") or [])]:
                if item.get("digest") not in self._state.blobs:
                    raise _ApiError(
                        400,
                        "MANIFEST_BLOB_UNKNOWN",
                        "blob unknown to registry",
                        {"digest": item.get("digest")},
                    )
        digest = digest_of(data)
        if _DIGEST.match(reference):
            if reference != digest:
                raise _ApiError(400, "DIGEST_INVALID", "provided digest did not match uploaded")
        elif not _TAG.match(reference):
            raise _ApiError(400, "MANIFEST_INVALID", "invalid tag", {"tag": reference})
        else:
            self._state.tags.setdefault(repository, {})[reference] = digest
        self._state.manifests.setdefault(repository, {})[digest] = Manifest(data, media_type)
        return digest


def _descriptor(media_type: str, data: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest_of(data), "size": len(data)}


class _Handler(BaseHTTPRequestHandler):
    owner: FakeRegistry
    protocol_version = "HTTP/1.1"
    server_version = "fake-registry/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    # -- dispatch

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        path, query = parts.path, parse_qs(parts.query)
        owner = self.owner
        with owner._lock:
            owner._state.requests.append((method, path, dict(self.headers.items())))
            broken = owner.answer_with
        if broken is not None:
            self._error(_ApiError(broken, "UNKNOWN", f"the fake registry answers {broken}"), method)
            return
        try:
            if method in ("PUT", "POST") and not self._authorised():
                raise _ApiError(401, "UNAUTHORIZED", "authentication required")
            self._route(method, path, query, body)
        except _ApiError as error:
            self._error(error, method)

    def _authorised(self) -> bool:
        credentials = self.owner.credentials
        if credentials is None:
            return True
        header = self.headers.get("Authorization") or ""
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(token).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return (user, password) == credentials

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> None:
        owner = self.owner
        if path in ("/v2", "/v2/"):
            if method not in ("GET", "HEAD"):
                raise _ApiError(405, "UNSUPPORTED", "the operation is unsupported")
            self._answer(200, b"{}", {"Content-Type": "application/json"}, method)
            return
        if match := _MANIFEST.match(path):
            name, reference = match["name"], match["reference"]
            with owner._lock:
                if method in ("GET", "HEAD"):
                    found = owner._find(name, reference)
                    if found is None:
                        if name not in owner._state.manifests:
                            raise _ApiError(
                                404,
                                "NAME_UNKNOWN",
                                "repository name not known to registry",
                                {"name": name},
                            )
                        raise _ApiError(
                            404, "MANIFEST_UNKNOWN", "manifest unknown", {"reference": reference}
                        )
                    headers = {
                        "Content-Type": found.media_type,
                        "Docker-Content-Digest": found.digest,
                    }
                    data = found.data
                elif method == "PUT":
                    media_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                    digest = owner._put_manifest(name, reference, body, media_type)
                    headers = {
                        "Location": f"/v2/{name}/manifests/{digest}",
                        "Docker-Content-Digest": digest,
                    }
                    self._answer(201, b"", headers, method)
                    return
                else:
                    raise _ApiError(405, "UNSUPPORTED", "the operation is unsupported")
            self._answer(200, data, headers, method)
            return
        if match := _UPLOADS.match(path):
            self._upload(method, match["name"], match["upload"], query, body)
            return
        if match := _BLOB.match(path):
            if method not in ("GET", "HEAD"):
                raise _ApiError(405, "UNSUPPORTED", "the operation is unsupported")
            with owner._lock:
                blob = owner._state.blobs.get(match["digest"])
            if blob is None:
                raise _ApiError(404, "BLOB_UNKNOWN", "blob unknown to registry")
            headers = {
                "Content-Type": "application/octet-stream",
                "Docker-Content-Digest": match["digest"],
            }
            self._answer(200, blob, headers, method)
            return
        raise _ApiError(404, "NAME_UNKNOWN", f"no route for {path}")

    def _upload(
        self, method: str, name: str, upload: str, query: dict[str, list[str]], body: bytes
    ) -> None:
        owner = self.owner
        digest = (query.get("digest") or [""])[0]
        if method == "POST" and not upload:
            if digest:  # monolithic
                self._store_blob(digest, body)
                self._answer(201, b"", {"Location": f"/v2/{name}/blobs/{digest}"}, method)
                return
            upload = uuid.uuid4().hex
            with owner._lock:
                owner._state.uploads[upload] = name
            headers = {"Location": f"/v2/{name}/blobs/uploads/{upload}", "Range": "0-0"}
            self._answer(202, b"", headers, method)
            return
        if method == "PUT" and upload:
            with owner._lock:
                known = owner._state.uploads.pop(upload, None)
            if known != name:
                raise _ApiError(404, "BLOB_UPLOAD_UNKNOWN", "blob upload unknown to registry")
            self._store_blob(digest, body)
            self._answer(201, b"", {"Location": f"/v2/{name}/blobs/{digest}"}, method)
            return
        raise _ApiError(405, "UNSUPPORTED", "the operation is unsupported")

    def _store_blob(self, digest: str, body: bytes) -> None:
        if not _DIGEST.match(digest) or digest != digest_of(body):
            raise _ApiError(400, "DIGEST_INVALID", "provided digest did not match uploaded content")
        with self.owner._lock:
            self.owner._state.blobs[digest] = body

    # -- answers

    def _answer(self, status: int, data: bytes, headers: dict[str, str], method: str) -> None:
        self.send_response(status)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method != "HEAD" and data:
            self.wfile.write(data)

    def _error(self, error: _ApiError, method: str) -> None:
        body = {"errors": [{"code": error.code, "message": error.message, "detail": error.detail}]}
        headers = {"Content-Type": "application/json"}
        if error.status == 401:
            headers["WWW-Authenticate"] = 'Basic realm="fake-registry"'
        self._answer(error.status, json.dumps(body).encode(), headers, method)
