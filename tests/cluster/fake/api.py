"""The HTTP server of the fake Kubernetes API: litestar routes on uvicorn, in a thread.

`FakeKubernetes` serves a `Store` on 127.0.0.1 at an ephemeral port, so kubernetes-asyncio
(or anything that speaks the Kubernetes REST protocol, e.g. a service in another process
given `write_kubeconfig`) talks to it unchanged. The server runs in a background thread with
its own event loop: it keeps answering while a test blocks, a test may be sync or async, and
emulators in other threads write through the same thread-safe store.

Routes (core under `/api/v1`, groups under `/apis/{group}/{version}`, namespaced kinds under
`namespaces/{ns}/`): list (and `?watch=true`) / create on collections, get / put / patch /
delete on items, `/status` of the kinds with a status subresource, `pods/{name}/log`;
discovery at `/version`, `/api`, `/apis`, `/api/v1`, `/apis/{group}[/{version}]`, and
`/healthz`, `/readyz`, `/livez`. Errors are `Status` objects with the codes, reasons and
messages of the real server (404 NotFound, 409 AlreadyExists / Conflict, 410 Expired, 422
Invalid, 400 BadRequest, 405, 413, 415).

Watches are newline-delimited JSON events over a chunked response: from `resourceVersion`
(exclusive) out of the store's history, BOOKMARKs every `bookmark_interval_s` when
`allowWatchBookmarks` is true, the stream ended after `timeoutSeconds`; an expired
resourceVersion answers 200 with one ERROR event carrying a 410 Status, as the watch cache
does. Test hooks: `cut_watches()` (clean or abrupt), `store.bookmark()`, `store.compact()`.

Not done: TLS and authentication (a kubeconfig token is accepted and ignored), RBAC, the
watch path form `/api/v1/watch/...`, `follow`/`previous`/`sinceSeconds`/`timestamps` of logs,
`deletecollection`, protobuf/CBOR/YAML bodies, server-side apply, the `Warning` header of
`fieldValidation=Warn` (unknown fields are then kept, not dropped); a list is always served
at the newest resourceVersion (its `resourceVersion`/`resourceVersionMatch` are ignored).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn
import yaml
from litestar import Litestar, Request, Response, get, route
from litestar.enums import HttpMethod
from litestar.response import Stream

from .store import (
    CLOSED,
    CUT_ABRUPT,
    CUT_CLEAN,
    JSON,
    ApiError,
    Kind,
    Store,
    Watcher,
    bad_request,
    ensure_items,
)

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 3 * 1024 * 1024  # the API server's limit of a request body
_METHODS = [HttpMethod.GET, HttpMethod.POST, HttpMethod.PUT, HttpMethod.PATCH, HttpMethod.DELETE]
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}

VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.4+k3s1",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-08-01T00:00:00Z",
    "goVersion": "go1.24.4",
    "compiler": "gc",
    "platform": "linux/amd64",
}


class _AbruptCut(Exception):
    """Raised inside a watch stream to drop its connection without ending the body."""


class _QuietAbruptCuts(logging.Filter):
    """Keep the tracebacks of deliberate abrupt cuts out of uvicorn's error log."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        while error is not None:
            if isinstance(error, _AbruptCut):
                return False
            error = error.__cause__ or error.__context__
        return True


def _bool(query: dict[str, str], key: str) -> bool:
    value = query.get(key)
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise bad_request(f'{key}: Invalid value: "{value}": must be a boolean')


def _int(query: dict[str, str], key: str) -> int | None:
    value = query.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise bad_request(f'{key}: Invalid value: "{value}": must be an integer') from None


def _json_response(body: Any, code: int = 200) -> Response[bytes]:
    return Response(
        content=json.dumps(body, separators=(",", ":")).encode(),
        status_code=code,
        media_type="application/json",
    )


def _line(event_type: str, obj: JSON) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


@dataclass(frozen=True)
class RecordedRequest:
    """A request the fake answered, for tests that check what a client sent."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str | None


class FakeKubernetes:
    """The fake API server: `with FakeKubernetes() as cluster:` serves at `cluster.url`."""

    def __init__(
        self,
        store: Store | None = None,
        *,
        bookmark_interval_s: float | None = 5.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.store = store or Store()
        self.bookmark_interval_s = bookmark_interval_s
        self.host = host
        self.port = port
        self.requests: collections.deque[RecordedRequest] = collections.deque(maxlen=10_000)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._filter = _QuietAbruptCuts()

    # -- life cycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeKubernetes:
        """Serve in a background thread; returns once the socket accepts connections."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app(),
            log_config=None,
            access_log=False,
            lifespan="off",
            # an idle pooled connection closed under aiohttp would make tests flaky
            timeout_keep_alive=300,
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        logging.getLogger("uvicorn.error").addFilter(self._filter)
        started = threading.Event()

        def run() -> None:
            assert self._server is not None
            try:
                asyncio.run(self._server.serve(sockets=[sock]))
            finally:
                started.set()
                sock.close()

        self._thread = threading.Thread(target=run, name="fake-kubernetes", daemon=True)
        self._thread.start()
        while not self._server.started and self._thread.is_alive():
            started.wait(0.005)
        if not self._server.started:
            raise RuntimeError("the fake Kubernetes API did not start")
        return self

    def stop(self) -> None:
        """End the watches, then the server and its thread."""
        if self._server is None or self._thread is None:
            return
        self.store.cut_watches()
        self._server.should_exit = True
        self._thread.join(10)
        logging.getLogger("uvicorn.error").removeFilter(self._filter)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeKubernetes:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- clients

    def configuration(self) -> Any:
        """A `kubernetes_asyncio.client.Configuration` for this server."""
        from kubernetes_asyncio import client

        return client.Configuration(host=self.url)

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig of this server (for a process started with `KUBECONFIG`)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def cut_watches(self, *, abrupt: bool = False, plural: str | None = None) -> int:
        """Test hook: end the open watches now (see `Store.cut_watches`)."""
        return self.store.cut_watches(abrupt=abrupt, plural=plural)

    def watch_requests(self, plural: str | None = None) -> list[RecordedRequest]:
        """The watch requests received so far (of a kind), oldest first."""
        return [
            r
            for r in list(self.requests)
            if r.query.get("watch") in _TRUE
            and (plural is None or r.path.rstrip("/").split("/")[-1] == plural)
        ]

    # -- the app

    def app(self) -> Litestar:
        server = self

        @route(["/api", "/api/{rest:path}"], http_method=_METHODS)
        async def core(request: Request[Any, Any, Any]) -> Any:
            return await server._handle(request, "api")

        @route(["/apis", "/apis/{rest:path}"], http_method=_METHODS)
        async def groups(request: Request[Any, Any, Any]) -> Any:
            return await server._handle(request, "apis")

        @get("/version")
        async def version() -> Response[bytes]:
            return _json_response(VERSION)

        @get(["/healthz", "/readyz", "/livez"])
        async def health() -> Response[bytes]:
            return Response(content=b"ok", status_code=200, media_type="text/plain")

        return Litestar(
            [core, groups, version, health],
            debug=False,
            logging_config=None,
            openapi_config=None,
            request_max_body_size=4 * MAX_BODY_BYTES,
        )

    async def _handle(self, request: Request[Any, Any, Any], prefix: str) -> Any:
        query = {k: request.query_params.get(k) for k in request.query_params}
        self.requests.append(
            RecordedRequest(
                request.method, request.url.path, query, request.headers.get("content-type")
            )
        )
        try:
            parts = [p for p in request.url.path.split("/") if p][1:]
            return await self._route(request, prefix, parts, query)
        except ApiError as error:
            return _json_response(error.status(), error.code)
        except Exception as error:  # a bug of the fake: answer as the server does, and say it
            log.exception("fake Kubernetes API failed on %s %s", request.method, request.url.path)
            status = ApiError(500, "InternalError", f"Internal error occurred: {error!r}").status()
            return _json_response(status, 500)

    # -- routing

    async def _route(
        self, request: Request[Any, Any, Any], prefix: str, parts: list[str], query: dict[str, str]
    ) -> Any:
        method = request.method
        if prefix == "api":
            if not parts:
                return _json_response(self._api_versions())
            group, version, parts = "", parts[0], parts[1:]
        else:
            if not parts:
                return _json_response(self._group_list())
            if len(parts) == 1:
                return _json_response(self._group(parts[0]))
            group, version, parts = parts[0], parts[1], parts[2:]
        if not parts:
            return _json_response(self._resource_list(group, version))
        namespace = None
        if parts[0] == "namespaces" and len(parts) >= 3:
            namespace, parts = parts[1], parts[2:]
        if len(parts) > 3:
            raise _no_resource()
        plural = parts[0]
        name = parts[1] if len(parts) > 1 else None
        sub = parts[2] if len(parts) > 2 else None
        kind = self.store.kinds.get(plural)
        if kind is None or kind.group != group or kind.version != version:
            raise _no_resource()
        if namespace is not None and not kind.namespaced:
            raise _no_resource()
        if name is None:
            if method == "GET":
                if _bool(query, "watch"):
                    return self._watch(kind, namespace, query)
                return self._list(kind, namespace, query)
            if method == "POST" and (namespace is not None or not kind.namespaced):
                body = await self._body(request)
                obj = self.store.create(
                    kind.plural,
                    body,
                    namespace,
                    field_validation=query.get("fieldValidation"),
                    dry_run=bool(query.get("dryRun")),
                )
                return _json_response(obj, 201)
            raise _method_not_allowed()
        if kind.namespaced and namespace is None:
            raise _no_resource()
        if sub is None or (sub == "status" and kind.status_subresource):
            return await self._item(request, kind, namespace, name, sub, query)
        if sub == "log" and kind.plural == "pods" and method == "GET":
            data = self.store.read_log(
                namespace or "",
                name,
                query.get("container") or None,
                tail_lines=_int(query, "tailLines"),
                limit_bytes=_int(query, "limitBytes"),
            )
            return Response(content=data, status_code=200, media_type="text/plain")
        raise _no_resource()

    async def _item(
        self,
        request: Request[Any, Any, Any],
        kind: Kind,
        namespace: str | None,
        name: str,
        sub: str | None,
        query: dict[str, str],
    ) -> Any:
        method = request.method
        options = {
            "field_validation": query.get("fieldValidation"),
            "dry_run": bool(query.get("dryRun")),
        }
        if method == "GET":
            return _json_response(self.store.get(kind.plural, name, namespace))
        if method == "PUT":
            body = await self._body(request)
            if not isinstance(body, dict) or (body.get("metadata") or {}).get("name") not in (
                None,
                name,
            ):
                raise bad_request(
                    f"the name of the object does not match the name on the URL ({name})"
                )
            body.setdefault("metadata", {})["name"] = name
            return _json_response(
                self.store.replace(kind.plural, body, namespace, subresource=sub, **options)
            )
        if method == "PATCH":
            body = await self._body(request)
            content_type = request.headers.get("content-type") or ""
            obj = self.store.patch(
                kind.plural, name, body, content_type, namespace, subresource=sub, **options
            )
            return _json_response(obj)
        if method == "DELETE" and sub is None:
            return self._delete(
                kind, namespace, name, query, await self._body(request, optional=True)
            )
        raise _method_not_allowed()

    def _delete(
        self, kind: Kind, namespace: str | None, name: str, query: dict[str, str], body: Any
    ) -> Any:
        options = body if isinstance(body, dict) else {}
        propagation = options.get("propagationPolicy") or query.get("propagationPolicy") or None
        orphan = options.get("orphanDependents")
        if orphan is None and query.get("orphanDependents"):
            orphan = _bool(query, "orphanDependents")
        if propagation is None and orphan is not None:
            propagation = "Orphan" if orphan else "Background"
        grace = options.get("gracePeriodSeconds")
        if grace is None:
            grace = _int(query, "gracePeriodSeconds")
        obj, gone = self.store.delete(
            kind.plural,
            name,
            namespace,
            propagation=propagation,
            grace_period=grace,
            preconditions=options.get("preconditions"),
        )
        if not gone or kind.return_deleted:
            return _json_response(obj)
        details: JSON = {"name": name}
        if kind.group:
            details["group"] = kind.group
        details.update({"kind": kind.plural, "uid": obj["metadata"].get("uid")})
        return _json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": details,
            }
        )

    async def _body(self, request: Request[Any, Any, Any], *, optional: bool = False) -> Any:
        raw = await request.body()
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(
                413, "RequestEntityTooLarge", f"Request entity too large: limit is {MAX_BODY_BYTES}"
            )
        if not raw.strip():
            if optional:
                return None
            raise bad_request("the body of the request was empty")
        try:
            return json.loads(raw)
        except ValueError as error:
            raise bad_request(f"couldn't get version/kind; json parse error: {error}") from None

    def _list(self, kind: Kind, namespace: str | None, query: dict[str, str]) -> Response[bytes]:
        items, rv = self.store.list(
            kind.plural,
            namespace,
            query.get("labelSelector") or None,
            query.get("fieldSelector") or None,
        )
        return _json_response(
            {
                "apiVersion": kind.api_version,
                "kind": f"{kind.kind}List",
                "metadata": {"resourceVersion": str(rv)},
                "items": ensure_items(items, kind),
            }
        )

    # -- watches

    def _watch(self, kind: Kind, namespace: str | None, query: dict[str, str]) -> Stream:
        watcher = self.store.watch(
            kind.plural,
            namespace,
            query.get("resourceVersion") or None,
            query.get("labelSelector") or None,
            query.get("fieldSelector") or None,
            bookmarks=_bool(query, "allowWatchBookmarks"),
            send_initial_events=_bool(query, "sendInitialEvents"),
            remote=True,
        )
        timeout = _int(query, "timeoutSeconds")
        return Stream(
            self._stream(watcher, timeout), status_code=200, media_type="application/json"
        )

    async def _stream(self, watcher: Watcher, timeout: int | None) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        interval = self.bookmark_interval_s if watcher.bookmarks else None
        next_bookmark = loop.time() + interval if interval else None
        try:
            while True:
                wakes = [t for t in (deadline, next_bookmark) if t is not None]
                wait = max(0.0, min(wakes) - loop.time()) if wakes else None
                item = await watcher.get(wait)
                if item is None:
                    moment = loop.time()
                    if deadline is not None and moment >= deadline:
                        return
                    if interval and next_bookmark is not None and moment >= next_bookmark:
                        self.store.send_bookmark(watcher)
                        next_bookmark = moment + interval
                    continue
                if item == CUT_ABRUPT:
                    raise _AbruptCut()
                if item in (CUT_CLEAN, CLOSED):
                    return
                event_type, obj = item
                yield _line(event_type, obj)
                if event_type == "ERROR":
                    return
        finally:
            watcher.close()

    # -- discovery

    def _api_versions(self) -> JSON:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}
            ],
        }

    def _group_versions(self) -> dict[str, list[str]]:
        versions: dict[str, list[str]] = {}
        for kind in self.store.kinds.values():
            if kind.group and kind.version not in versions.setdefault(kind.group, []):
                versions[kind.group].append(kind.version)
        return versions

    def _group(self, group: str) -> JSON:
        versions = self._group_versions().get(group)
        if not versions:
            raise _no_resource()
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def _group_list(self) -> JSON:
        groups = [self._group(g) for g in sorted(self._group_versions())]
        for entry in groups:
            entry.pop("kind")
            entry.pop("apiVersion")
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _resource_list(self, group: str, version: str) -> JSON:
        resources = []
        for kind in self.store.kinds.values():
            if kind.group != group or kind.version != version:
                continue
            resources.append(
                {
                    "name": kind.plural,
                    "singularName": kind.kind.lower(),
                    "namespaced": kind.namespaced,
                    "kind": kind.kind,
                    "verbs": list(kind.verbs),
                }
            )
            for sub in kind.subresources:
                verbs = ["get"] if sub == "log" else ["get", "patch", "update"]
                resources.append(
                    {
                        "name": f"{kind.plural}/{sub}",
                        "singularName": "",
                        "namespaced": kind.namespaced,
                        "kind": kind.kind,
                        "verbs": verbs,
                    }
                )
        if not resources:
            raise _no_resource()
        group_version = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }


def _no_resource() -> ApiError:
    return ApiError(
        404,
        "NotFound",
        "the server could not find the requested resource",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]},
    )


def _method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )
