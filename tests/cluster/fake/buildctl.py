"""A stand-in of `buildctl build` (BuildKit's client) for the pods of the fake cluster.

Neither BuildKit nor a container runtime can run here, so the fake kubelet puts `bin/buildctl`
(which runs this module) first on the `PATH` of its pods: the Job of a build (spec 38,
`simrun_core.argo.build`) runs it with the argv it gives the real `buildctl`. It takes that
command line as buildctl's parser does (unknown options and subcommands fail as usage errors)
and does what a build does that can be checked without BuildKit:

- reads the local sources (`--local context=DIR --local dockerfile=DIR`) with their symbolic
  links resolved at the root, as BuildKit's `fsutil.NewFS` does (so `/context/..data` of a
  ConfigMap volume is the directory of its files, while `/context` would leave the Dockerfile
  a link out of what was sent);
- reads the Dockerfile (`--opt filename=`, `Dockerfile` by default; one that is a link fails,
  as BuildKit sends the Dockerfile alone, the link without its target) and goes through its
  instructions (continued lines and heredocs joined): the first must be `FROM`; `COPY`/`ADD`
  of a source missing from the context fails as BuildKit fails it (`not found`), a heredoc
  source (`COPY <<EOF /path`) is inline; `RUN false`
  and `RUN exit <n>` fail the build with BuildKit's message and exit code 1; `RUN sleep <s>`
  sleeps (a slow build); any other instruction succeeds at once;
- with `--output type=image,name=<ref>,push=true`, pushes to the registry of `<ref>` over plain
  HTTP (the cluster's registry is HTTP, `buildkitd.toml`): a config blob and one layer (a tar
  of the context) through the blob upload API, then an OCI image manifest under the tag or
  digest of `<ref>`; with the credentials of `$DOCKER_CONFIG/config.json` (`auths.<host>.auth`
  or `username`/`password`) when it has them, as buildctl sends them to the daemon.

Its output is the `--progress plain` output of BuildKit in form (`#1 [internal] load build
definition from Dockerfile`, ..., `ERROR: ...`, `error: failed to solve: ...`), so a test can
look for the end of a failed build's log in an error message.

Not done: the BuildKit daemon (`--addr` is checked for its form, never dialled), caches,
platforms, secrets and SSH forwarding, `--import-cache`/`--export-cache`, frontends other than
`dockerfile.v0`, outputs other than `image`, the semantics of instructions beyond the above.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "buildctl github.com/moby/buildkit v0.34.2 (fake: tests/cluster/fake/buildctl.py)"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
_HEREDOC = re.compile(r"<<-?([\"']?)([A-Za-z_][A-Za-z0-9_]*)\1")
_PROGRESS = ("auto", "plain", "tty", "quiet", "rawjson")


class UsageError(Exception):
    """A command line buildctl's parser refuses."""


class BuildError(Exception):
    """A build that failed: BuildKit's `error: failed to solve: ...`."""


@dataclass
class Options:
    addr: str = "unix:///run/buildkit/buildkitd.sock"
    frontend: str = ""
    locals: dict[str, str] = field(default_factory=dict)
    output: dict[str, str] = field(default_factory=dict)
    opts: dict[str, str] = field(default_factory=dict)
    progress: str = "auto"


def _value(args: list[str], index: int, flag: str) -> tuple[str, int]:
    """The value of a flag given as `--flag value` or `--flag=value`, and the next index."""
    arg = args[index]
    if "=" in arg and arg.startswith("--"):
        return arg.split("=", 1)[1], index + 1
    if index + 1 >= len(args):
        raise UsageError(f"flag needs an argument: {flag}")
    return args[index + 1], index + 2


def _pairs(text: str, flag: str) -> dict[str, str]:
    found = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise UsageError(f"invalid value {text!r} for flag {flag}: {part!r} is no key=value")
        found[key.strip()] = value.strip()
    return found


def parse(argv: Sequence[str]) -> Options:
    """The options of `buildctl [--addr A] build ...`; UsageError for anything else."""
    args = list(argv)
    options = Options()
    index = 0
    while index < len(args) and args[index].startswith("-"):
        flag = args[index].split("=", 1)[0]
        if flag == "--addr":
            options.addr, index = _value(args, index, flag)
        elif flag in ("--version", "-v"):
            print(VERSION)
            raise SystemExit(0)
        else:
            raise UsageError(f"flag provided but not defined: {flag}")
    if index >= len(args) or args[index] != "build":
        command = args[index] if index < len(args) else ""
        raise UsageError(f"No help topic for '{command}'" if command else "no command given")
    if not re.match(r"^(tcp|unix|kube-pod|docker-container|podman-container)://.+", options.addr):
        raise UsageError(f"invalid --addr {options.addr!r}")
    index += 1
    while index < len(args):
        flag = args[index].split("=", 1)[0]
        if not flag.startswith("-"):
            raise UsageError(f"unexpected argument {args[index]!r}")
        value, index = _value(args, index, flag)
        if flag == "--frontend":
            options.frontend = value
        elif flag == "--local":
            name, sep, directory = value.partition("=")
            if not sep or not name or not directory:
                raise UsageError(f"invalid value {value!r} for flag --local: want name=path")
            options.locals[name] = directory
        elif flag in ("--output", "-o"):
            options.output = _pairs(value, flag)
        elif flag == "--opt":
            key, _, opt = value.partition("=")
            options.opts[key] = opt
        elif flag == "--progress":
            if value not in _PROGRESS:
                raise UsageError(f"invalid progress mode {value!r}")
            options.progress = value
        else:
            raise UsageError(f"flag provided but not defined: {flag}")
    if options.frontend != "dockerfile.v0":
        raise UsageError(f"the fake buildctl builds with dockerfile.v0, not {options.frontend!r}")
    for name in ("context", "dockerfile"):
        if name not in options.locals:
            raise BuildError(f"failed to solve: no local source {name!r} (--local {name}=DIR)")
    return options


# --- the build -------------------------------------------------------------------------------


@dataclass
class Step:
    number: int
    text: str


class Progress:
    """BuildKit's `plain` progress in form: numbered vertices."""

    def __init__(self) -> None:
        self.vertex = 0
        self.started = time.monotonic()

    def start(self, text: str) -> int:
        self.vertex += 1
        print(f"#{self.vertex} {text}", flush=True)
        return self.vertex

    def line(self, vertex: int, text: str) -> None:
        print(f"#{vertex} {self.elapsed()} {text}", flush=True)

    def done(self, vertex: int) -> None:
        print(f"#{vertex} DONE {self.elapsed()}", flush=True)
        print(flush=True)

    def error(self, vertex: int, message: str) -> None:
        print(f"#{vertex} ERROR: {message}", flush=True)

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.started:.1f}s"


def source(directory: str) -> Path:
    """A local source as `fsutil.NewFS` opens it: the links of its root resolved."""
    root = Path(os.path.realpath(directory))
    if not root.is_dir():
        raise BuildError(f"failed to solve: resolve : lstat {directory}: no such file or directory")
    return root


def instructions(text: str) -> list[str]:
    """The instructions of a Dockerfile: comments dropped, continued lines and heredocs joined."""
    found: list[str] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\") and index < len(lines):
            line = line[:-1] + " " + lines[index].strip()
            index += 1
        for match in _HEREDOC.finditer(line):
            end = match.group(2)
            body = []
            while index < len(lines) and lines[index].strip() != end:
                body.append(lines[index])
                index += 1
            index += 1
            line += "\n" + "\n".join(body)
        found.append(line.strip())
    return found


def run_step(progress: Progress, steps: int, number: int, instruction: str, context: Path) -> None:
    keyword, _, rest = instruction.partition(" ")
    keyword = keyword.upper()
    first_line = instruction.splitlines()[0]
    vertex = progress.start(f"[{number}/{steps}] {first_line}")
    if keyword in ("COPY", "ADD"):
        # the sources of the first line; a heredoc (`COPY <<EOF dest`) is one inline, no file
        words = [w for w in rest.splitlines()[0].split() if not w.startswith("--")]
        for item in words[:-1]:
            if item.startswith("<<"):
                continue
            if not (context / item.lstrip("/")).exists():
                message = f'failed to calculate checksum of ref: "/{item.lstrip("/")}": not found'
                progress.error(vertex, message)
                raise BuildError(f"failed to solve: failed to compute cache key: {message}")
    elif keyword == "RUN":
        command = rest.strip()
        shell = f'process "/bin/sh -c {command}"'
        if command == "false" or re.fullmatch(r"exit\s+[1-9][0-9]*", command):
            code = 1 if command == "false" else int(command.split()[1])
            message = f"{shell} did not complete successfully: exit code: {code}"
            progress.error(vertex, message)
            raise BuildError(f"failed to solve: {message}")
        if match := re.fullmatch(r"sleep\s+([0-9.]+)", command):
            time.sleep(float(match.group(1)))
    progress.done(vertex)


def build(options: Options) -> None:
    progress = Progress()
    context = source(options.locals["context"])
    dockerfile_dir = source(options.locals["dockerfile"])
    filename = options.opts.get("filename", "Dockerfile")
    vertex = progress.start("[internal] load build definition from " + filename)
    path = dockerfile_dir / filename
    if path.is_symlink():
        # BuildKit sends only the Dockerfile of the `dockerfile` source, a link as a link
        target = os.readlink(path)
        message = f"failed to read dockerfile: open {target}: no such file or directory"
        progress.error(vertex, message)
        raise BuildError(f"failed to solve: {message}")
    if not path.is_file():
        message = f"failed to read dockerfile: open {filename}: no such file or directory"
        progress.error(vertex, message)
        raise BuildError(f"failed to solve: {message}")
    text = path.read_text()
    progress.line(vertex, f"transferring dockerfile: {len(text.encode())}B done")
    progress.done(vertex)
    steps = instructions(text)
    if not steps or not steps[0].upper().startswith("FROM "):
        raise BuildError(
            "failed to solve: failed to parse dockerfile: no build stage in current context"
        )
    vertex = progress.start("[internal] load build context")
    files = sorted(p for p in context.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in files)
    progress.line(vertex, f"transferring context: {size}B done")
    progress.done(vertex)
    runnable = steps[1:]
    progress.start(f"[1/{len(runnable) + 1}] {steps[0]}")
    for number, instruction in enumerate(runnable, start=2):
        run_step(progress, len(runnable) + 1, number, instruction, context)
    if options.output.get("type", "image") != "image":
        raise BuildError(f"failed to solve: the fake buildctl exports images, not {options.output}")
    ref = options.output.get("name")
    if options.output.get("push") == "true":
        if not ref:
            raise BuildError("failed to solve: push needs an image name (name=...)")
        push(progress, ref, text, context, files)


# --- the push --------------------------------------------------------------------------------


def split_ref(ref: str) -> tuple[str, str, str]:
    """(host, repository, tag or digest) of an image reference with a registry host."""
    rest, at, digest = ref.partition("@")
    host, slash, path = rest.partition("/")
    if not slash or not ("." in host or ":" in host or host == "localhost"):
        raise BuildError(f"failed to solve: the fake buildctl pushes to a registry host: {ref}")
    repository, colon, tag = path.rpartition(":")
    if not colon:
        repository, tag = path, "latest"
    return host, repository, digest if at else tag


def credentials(host: str) -> str | None:
    """The `Authorization` of a registry host from `$DOCKER_CONFIG/config.json`, if any."""
    directory = os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    auths = (json.loads(path.read_text()).get("auths") or {}).get(host) or {}
    token = auths.get("auth")
    if not token and auths.get("username"):
        token = base64.b64encode(f"{auths['username']}:{auths.get('password', '')}".encode())
        token = token.decode()
    return f"Basic {token}" if token else None


def _request(
    method: str,
    url: str,
    auth: str | None,
    data: bytes | None = None,
    content_type: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    headers = {"User-Agent": "buildkit/v0.34 (fake)"}
    if auth:
        headers["Authorization"] = auth
    if content_type:
        headers["Content-Type"] = content_type
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers.items()), error.read()


def _expect(what: str, answer: tuple[int, dict[str, str], bytes], *codes: int) -> dict[str, str]:
    status, headers, body = answer
    if status not in codes:
        text = body.decode(errors="replace").strip()
        raise BuildError(
            f"failed to solve: failed to push: {what}: unexpected status {status}: {text}"
        )
    return headers


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def push(progress: Progress, ref: str, dockerfile: str, context: Path, files: list[Path]) -> None:
    host, repository, reference = split_ref(ref)
    base = f"http://{host}"
    auth = credentials(host)
    vertex = progress.start("exporting to image")
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as archive:
        for path in files:
            info = archive.gettarinfo(str(path), arcname=str(path.relative_to(context)))
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with path.open("rb") as handle:
                archive.addfile(info, handle)
    layer_data = layer.getvalue()
    config_data = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer_data)]},
            "history": [{"created_by": line.splitlines()[0]} for line in instructions(dockerfile)],
        },
        sort_keys=True,
    ).encode()
    for data in (config_data, layer_data):
        digest = _digest(data)
        status, _, _ = _request("HEAD", f"{base}/v2/{repository}/blobs/{digest}", auth)
        if status == 200:
            continue
        headers = _expect(
            f"{ref}: blob upload",
            _request("POST", f"{base}/v2/{repository}/blobs/uploads/", auth, b""),
            202,
        )
        location = headers.get("Location") or headers.get("location") or ""
        url = location if location.startswith("http") else base + location
        url += ("&" if "?" in url else "?") + f"digest={digest}"
        _expect(
            f"{ref}: blob {digest}",
            _request("PUT", url, auth, data, "application/octet-stream"),
            201,
        )
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": OCI_CONFIG,
                "digest": _digest(config_data),
                "size": len(config_data),
            },
            "layers": [
                {"mediaType": OCI_LAYER, "digest": _digest(layer_data), "size": len(layer_data)}
            ],
        },
        sort_keys=True,
    ).encode()
    digest = _digest(manifest)
    progress.line(vertex, f"exporting manifest {digest} done")
    _expect(
        f"{ref}: manifest",
        _request(
            "PUT", f"{base}/v2/{repository}/manifests/{reference}", auth, manifest, OCI_MANIFEST
        ),
        201,
    )
    progress.line(vertex, f"pushing manifest for {ref}@{digest} done")
    progress.done(vertex)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        options = parse(args)
        build(options)
    except UsageError as error:
        print(f"Incorrect Usage: {error}", file=sys.stderr, flush=True)
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
