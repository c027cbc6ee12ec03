"""Who records the sources of a submission how, and doing it: provenance, a snapshot written into
the mounted store, or a snapshot uploaded to the service. The CLI and the MCP tools share it.

`source_policy` decides (spec: concepts, local mode, command line):

| client | sources |
| --- | --- |
| the local service (`--local`) | provenance only: the working tree is recorded, not copied |
| the local service with `--snapshot` | snapshots written into `.simrun/store/` of the directory |
| a service, `SIMRUN_STORE` set | snapshots written into the store mounted there |
| a service without `SIMRUN_STORE` | snapshots uploaded: the files the store lacks, in a tar |

`prepare_sources` reads every working tree (the git provenance, or the scan of a snapshot) and
refuses a bad source before anything is written or sent; `send_sources` then writes or uploads
the snapshots. `record_sources` does both. An unchanged tree costs a scan only: its snapshot
exists already (or its files are hard links to the latest one) and its upload sends no file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final, Literal, Protocol

from simrun_cli.provenance import SourceError, git_provenance, scan
from simrun_core.local_layout import LOCAL_DIR, LOCAL_STORE
from simrun_core.provenance import SourceProvenance
from simrun_core.snapshot import Scan, SnapshotError, check_name, check_scan

if TYPE_CHECKING:
    from simrun_cli.client import Client
    from simrun_core.snapshot import FileEntry

SourceMode = Literal["provenance", "store", "upload"]
ATTEMPTS: Final = 3
"""Tries of a snapshot whose tree or store changed on the way (a file changed while it was
copied, the latest snapshot changed between `missing` and the upload: 409)."""
CONFLICT: Final = 409
STORE_VARIABLE: Final = "SIMRUN_STORE"


class Uploads(Protocol):
    """What an upload needs of a client (`simrun_cli.client.Client` has it)."""

    def snapshot_missing(self, name: str, files: list[FileEntry]) -> list[str]: ...

    def upload_snapshot(self, name: str, scan: Scan, tar: IO[bytes]) -> SourceProvenance: ...


@dataclass(frozen=True)
class SourcePolicy:
    """How the sources of a submission are sent: `provenance` only, a snapshot written into
    `store` (mounted here), or a snapshot `upload`ed to the service."""

    mode: SourceMode
    store: Path | None = None


PROVENANCE: Final = SourcePolicy("provenance")


def local_store(root: Path) -> Path:
    """The store of the local service of a project directory: `.simrun/store/`."""
    return Path(root).resolve() / LOCAL_DIR / LOCAL_STORE


def source_policy(
    local_root: Path | None, snapshot: bool = False, environ: Mapping[str, str] | None = None
) -> SourcePolicy:
    """How a client sends its sources (see the module): `local_root`, the project directory of
    the local service (None for a service of `SIMRUN_URL`); `snapshot`, whether the local
    service gets snapshots (`--snapshot`; a service always does)."""
    if local_root is not None:
        return SourcePolicy("store", local_store(local_root)) if snapshot else PROVENANCE
    env = os.environ if environ is None else environ
    store = env.get(STORE_VARIABLE, "").strip()
    if store:
        return SourcePolicy("store", Path(store).expanduser().resolve())
    return SourcePolicy("upload")


@dataclass(frozen=True)
class PreparedSource:
    """A source read and checked: its provenance (provenance only) or the scan to snapshot."""

    name: str
    path: Path
    provenance: SourceProvenance | None = None
    scan: Scan | None = None


def prepare_sources(sources: list[tuple[str, Path]], policy: SourcePolicy) -> list[PreparedSource]:
    """Read the working trees of named sources, the model first; nothing is written or sent.

    Raises:
        SourceError: A source has no name, is given twice, is no git working tree; for a
            snapshot also a name that is no directory name, a repository without a commit, a
            tree a snapshot cannot hold (a link out of it). The message names the source.
    """
    prepared: list[PreparedSource] = []
    for name, path in sources:
        if not name.strip():
            raise SourceError(f"the source of {path} has no name")
        if any(known.name == name for known in prepared):
            raise SourceError(f"the source {name!r} is given twice")
        path = Path(path).expanduser()
        if policy.mode == "provenance":
            prepared.append(PreparedSource(name, path, provenance=git_provenance(name, path)))
        else:
            prepared.append(PreparedSource(name, path, scan=_checked_scan(name, path)))
    return prepared


def send_sources(
    prepared: list[PreparedSource], policy: SourcePolicy, client: Client | None = None
) -> list[SourceProvenance]:
    """The provenance of prepared sources, their snapshots written into the store or uploaded
    through `client` (needed for `upload`) first.

    Raises:
        SourceError: A store that is no directory, a tree that kept changing while it was
            copied; the message names the source.
        ServiceError: The service refused an upload (its detail names the source).
    """
    found: list[SourceProvenance] = []
    for source in prepared:
        if source.provenance is not None:
            found.append(source.provenance)
        elif policy.mode == "store":
            assert policy.store is not None
            found.append(snapshot_source(source.name, source.path, policy.store, source.scan))
        else:
            if client is None:
                raise SourceError(f"source {source.name!r}: an upload needs a client")
            found.append(upload_source(client, source.name, source.path, source.scan))
    return found


def record_sources(
    sources: list[tuple[str, Path]], policy: SourcePolicy, client: Client | None = None
) -> list[SourceProvenance]:
    """The provenance of named sources as `policy` sends them (`prepare_sources`, then
    `send_sources`)."""
    return send_sources(prepare_sources(sources, policy), policy, client)


def snapshot_source(
    name: str, path: Path, store: Path, scanned: Scan | None = None
) -> SourceProvenance:
    """Write the snapshot of a working tree into a store mounted here (`snapshot_store.assemble`,
    the files copied from the tree) and return its provenance, `snapshot` and `patch` set.

    `scanned` is a scan of the tree made before; a tree that changes while it is copied is
    scanned again, up to `ATTEMPTS` times.

    Raises:
        SourceError: The store is no directory, the tree is no git working tree or kept
            changing, or the scan is refused; the message names the source.
    """
    from simrun_core.snapshot_store import assemble  # the store's code, only to write snapshots

    path = Path(path).expanduser()
    if not store.is_dir():
        raise SourceError(
            f"source {name!r}: the store {store} is no directory: mount it, or unset "
            f"{STORE_VARIABLE} to upload the snapshot to the service"
        )
    current = scanned if scanned is not None else _checked_scan(name, path)
    root = path.resolve()
    for attempt in range(ATTEMPTS):
        try:
            return assemble(store, name, current, _content_of(root))
        except (SnapshotError, FileNotFoundError):
            # The scan was checked: a file changed while it was copied, or went away.
            if attempt + 1 == ATTEMPTS:
                raise SourceError(
                    f"source {name!r}: {root} kept changing while it was copied "
                    f"({ATTEMPTS} times): submit again once it is still"
                ) from None
        current = _checked_scan(name, path)
    raise AssertionError("unreachable")


def upload_source(
    client: Uploads, name: str, path: Path, scanned: Scan | None = None
) -> SourceProvenance:
    """Upload the snapshot of a working tree to a service whose store is not mounted here and
    return its provenance, `snapshot` and `patch` set.

    The client asks which contents the store lacks (`Client.snapshot_missing`), writes only
    those files into a tar (a temporary file, never held in memory) and uploads it with the scan
    (`Client.upload_snapshot`). When the latest snapshot changed meanwhile (409) it asks again,
    and a file that changed since the scan is scanned again, up to `ATTEMPTS` times in all.

    Raises:
        SourceError: The tree is no git working tree or kept changing; the message names it.
        ServiceError: The service refused the upload; the detail names the source.
    """
    import tempfile

    from simrun_cli.client import ServiceError

    path = Path(path).expanduser()
    root = path.resolve()
    current = scanned if scanned is not None else _checked_scan(name, path)
    why = ""
    for _ in range(ATTEMPTS):
        try:
            asked = client.snapshot_missing(name, current.files)
            with tempfile.TemporaryFile(prefix="simrun-upload-") as archive:
                if not write_tar(archive, root, current, asked):
                    why = "its files kept changing while they were sent"
                    current = _checked_scan(name, path)
                    continue
                archive.seek(0)
                return client.upload_snapshot(name, current, archive)
        except ServiceError as error:
            if error.status != CONFLICT:
                detail = f"source {name!r} ({root}): {error.detail}"
                raise ServiceError(error.status, detail) from None
            why = "the store of the service changed while it was sent"
    raise ServiceError(
        CONFLICT,
        f"source {name!r} ({root}): its snapshot was not taken, {why} ({ATTEMPTS} times): "
        "submit again",
    )


def write_tar(archive: IO[bytes], root: Path, scanned: Scan, paths: list[str]) -> bool:
    """Write the regular files `paths` of a scan of `root` into an uncompressed tar, each read
    once and streamed; False when one is gone or its content is no longer the one scanned."""
    import tarfile

    entries = {entry.path: entry for entry in scanned.files if entry.sha256 is not None}
    with tarfile.open(fileobj=archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in paths:
            entry = entries.get(path)
            if entry is None:
                continue  # not a regular file of the scan: the service would refuse it
            try:
                fd = os.open(root / path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                return False
            with os.fdopen(fd, "rb") as stream:
                info = tarfile.TarInfo(path)
                info.size = os.fstat(fd).st_size
                info.mode = entry.mode
                hashed = _Hashing(stream)
                try:
                    tar.addfile(info, hashed)
                except OSError:
                    return False  # it shrank while it was read
                if hashed.digest.hexdigest() != entry.sha256:
                    return False
    return True


class _Hashing:
    """A stream that hashes what is read from it."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.digest.update(data)
        return data


def _checked_scan(name: str, path: Path) -> Scan:
    """The scan of a source, refused as a SourceError naming it when it cannot be a snapshot."""
    try:
        check_name(name)
    except SnapshotError as error:
        raise SourceError(f"source {name!r}: {error}") from None
    scanned = scan(path, name)
    try:
        check_scan(scanned)
    except SnapshotError as error:
        raise SourceError(f"source {name!r}: {Path(path).resolve()}: {error}") from None
    return scanned


def _content_of(root: Path) -> Callable[[str], Path]:
    """The file of a path of the tree for `assemble`; FileNotFoundError when it is gone."""

    def content(path: str) -> Path:
        file = root / path
        os.lstat(file)
        return file

    return content
