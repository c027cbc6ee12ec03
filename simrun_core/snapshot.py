"""Snapshots of working trees: what a scan lists, the checks of a file list, the hash that names
a snapshot, and where snapshots live in the store. Pure: no file is read here.

A snapshot is a read-only copy of the files git knows of a working tree (tracked and untracked,
not ignored, uncommitted changes included) in `snapshots/<name>/<tree hash>/` of the store. It
is named by its content (`tree_hash`: paths, types, modes and contents), so it never changes;
beside it `<tree hash>.files.json` lists its files (what the next snapshot of the name links
to and an upload need not send), and `patches/<sha256>.patch` keeps `git diff HEAD --binary`
as provenance. `.latest` names the latest snapshot of the name. Entries starting with `.` are
the store's own (the pointer, assemblies in progress) and never snapshots.

Every path that could escape the tree is refused (`check_files`) before anything is written,
with a message naming the path: absolute, not normalised, `..` or `.git` components, NUL,
listed twice or below another file, a link out of the tree, write or special mode bits.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import stat
from pathlib import Path
from typing import Final

import msgspec

READ_EXECUTE: Final = 0o555
"""The mode bits a file of a snapshot may have: a snapshot is read-only, special bits are
refused."""
DIRECTORY_BITS: Final = 0o7777 & ~stat.S_ISUID & ~stat.S_ISVTX
"""The mode bits a directory of a scan may have: permissions and setgid."""
OWNER_BITS: Final = 0o700
"""Added to every directory of a snapshot, so the store can remove it again."""
MANIFEST_SUFFIX: Final = ".files.json"
LATEST: Final = ".latest"
PATCHES: Final = "patches"
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_SHA256: Final = re.compile(r"[0-9a-f]{64}")
_COMMIT: Final = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class SnapshotError(ValueError):
    """A file list, a scan or an upload that cannot become a snapshot; the message names the
    path (or the field) and what is wrong."""


class MissingContent(SnapshotError):
    """A file of an upload whose content neither the upload nor the store has: the latest
    snapshot changed since the client asked what is missing; the client asks again."""


class FileEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A file of a working tree as a snapshot holds it: its path below the tree (with `/`), its
    mode bits (read and execute only), and the sha256 of a regular file's content or the
    target of a symbolic link."""

    path: str
    mode: int
    sha256: str | None = None
    link: str | None = None


class Scan(msgspec.Struct, frozen=True, kw_only=True):
    """What a snapshot of a working tree is made of, before it is copied: the git state
    (branch, None for a detached HEAD; commit; dirty; `changed_files`, porcelain status lines
    such as `M src/a.py`; `patch`, `git diff HEAD --binary`, base64 in JSON), the files in the
    order of git and the mode bits of the directories that hold them."""

    branch: str | None
    commit: str
    dirty: bool
    changed_files: list[str] = msgspec.field(default_factory=list)
    patch: bytes = b""
    files: list[FileEntry] = msgspec.field(default_factory=list)
    dirs: dict[str, int] = msgspec.field(default_factory=dict)


class MissingAsked(msgspec.Struct, frozen=True, kw_only=True):
    """The body of `POST /snapshots/{name}/missing`: the files of a scan."""

    files: list[FileEntry]


class MissingFound(msgspec.Struct, frozen=True, kw_only=True):
    """The answer of `POST /snapshots/{name}/missing`: the paths of the regular files whose
    content the latest snapshot of the source lacks, to send in the upload's tar."""

    missing: list[str]


def check_name(name: str) -> None:
    """Refuse a source name that is no directory name of `snapshots/`: letters, digits, `-`,
    `_` and `.`, starting with a letter or digit."""
    if not _NAME.fullmatch(name):
        raise SnapshotError(
            f"source name {name!r}: use letters, digits, '-', '_' and '.', "
            "starting with a letter or digit"
        )


def check_path(path: str) -> None:
    """Refuse a path that is not a normalised relative path inside a tree."""
    if not path or "\0" in path:
        raise SnapshotError(f"path {path!r}: empty or has a NUL character")
    if path.startswith("/"):
        raise SnapshotError(f"path {path!r}: absolute")
    parts = path.split("/")
    if ".." in parts:
        raise SnapshotError(f"path {path!r}: has a '..' component")
    if any(part.lower() == ".git" for part in parts):
        raise SnapshotError(f"path {path!r}: has a '.git' component")
    if "\\" in path or posixpath.normpath(path) != path or "." in parts:
        raise SnapshotError(f"path {path!r}: not normalised")


def check_files(files: list[FileEntry]) -> None:
    """Refuse a file list that would write outside the tree of a snapshot, or hold what a
    snapshot cannot: every problem of the first bad entry named with its path."""
    seen: set[str] = set()
    for entry in files:
        check_path(entry.path)
        if entry.path in seen:
            raise SnapshotError(f"path {entry.path!r}: listed twice")
        seen.add(entry.path)
        if entry.mode & ~READ_EXECUTE:
            raise SnapshotError(
                f"path {entry.path!r}: mode {entry.mode:o} has more than read and execute bits"
            )
        if (entry.sha256 is None) == (entry.link is None):
            raise SnapshotError(f"path {entry.path!r}: needs either a sha256 or a link target")
        if entry.sha256 is not None and not _SHA256.fullmatch(entry.sha256):
            raise SnapshotError(f"path {entry.path!r}: sha256 {entry.sha256!r} is no hex digest")
        if entry.link is not None:
            _check_link(entry.path, entry.link)
    for path in seen:
        parent = posixpath.dirname(path)
        while parent:
            if parent in seen:
                raise SnapshotError(f"path {path!r}: below the file {parent!r}")
            parent = posixpath.dirname(parent)


def _check_link(path: str, target: str) -> None:
    """Refuse a link whose target is absolute or leaves the tree."""
    if not target or "\0" in target:
        raise SnapshotError(f"link {path!r}: empty target or a NUL character")
    if target.startswith("/"):
        raise SnapshotError(f"link {path!r}: absolute target {target!r}")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == ".." or resolved.startswith("../"):
        raise SnapshotError(f"link {path!r}: target {target!r} leaves the tree")
    if any(part.lower() == ".git" for part in resolved.split("/")):
        raise SnapshotError(f"link {path!r}: target {target!r} is in '.git'")


def check_scan(scan: Scan) -> None:
    """Refuse a scan that cannot become a snapshot: a file list `check_files` refuses, a commit
    that is no hexadecimal hash, or a directory that holds no file of the scan, is a file too,
    or has other mode bits than permissions and setgid."""
    if not _COMMIT.fullmatch(scan.commit):
        raise SnapshotError(f"commit {scan.commit!r}: not a hexadecimal hash")
    check_files(scan.files)
    paths = {entry.path for entry in scan.files}
    holding = {parent for path in paths for parent in parents(path)}
    for directory, mode in scan.dirs.items():
        check_path(directory)
        if directory in paths:
            raise SnapshotError(f"directory {directory!r}: is a file of the scan too")
        if directory not in holding:
            raise SnapshotError(f"directory {directory!r}: holds no file of the scan")
        if mode & ~DIRECTORY_BITS:
            raise SnapshotError(f"directory {directory!r}: mode {mode:o} beyond permissions")


def parents(path: str) -> list[str]:
    """The directories above a path of a tree, innermost first (none for a top-level file)."""
    found = []
    parent = posixpath.dirname(path)
    while parent:
        found.append(parent)
        parent = posixpath.dirname(parent)
    return found


def tree_hash(files: list[FileEntry]) -> str:
    """The sha256 that names a snapshot: its paths, their types, modes and contents, in the
    order of their paths (the order of a scan does not count)."""
    digest = hashlib.sha256()
    for entry in sorted(files, key=lambda e: e.path):
        kind, content = ("link", entry.link) if entry.link is not None else ("file", entry.sha256)
        digest.update(f"{kind}\0{entry.path}\0{entry.mode:o}\0{content}\n".encode())
    return digest.hexdigest()


# -- the layout in the store ---------------------------------------------------------------------


def snapshots_dir(store: Path, name: str) -> Path:
    """The directory of the snapshots of a source."""
    return store / "snapshots" / name


def snapshot_dir(store: Path, name: str, digest: str) -> Path:
    """The directory of one snapshot of a source."""
    return snapshots_dir(store, name) / digest


def manifest_path(snapshot: Path) -> Path:
    """The manifest beside a snapshot: its files with the hashes of their contents."""
    return snapshot.with_name(snapshot.name + MANIFEST_SUFFIX)


def patch_path(store: Path, name: str, patch: bytes) -> Path:
    """Where the patch of a scan is kept, named by its content."""
    return snapshots_dir(store, name) / PATCHES / f"{hashlib.sha256(patch).hexdigest()}.patch"


def is_snapshot_name(entry: str) -> bool:
    """Whether an entry of `snapshots/<name>/` is a snapshot (not a manifest, the pointer, the
    patches or an assembly in progress)."""
    return bool(_SHA256.fullmatch(entry))


_manifest_encoder = msgspec.json.Encoder()
_manifest_decoder = msgspec.json.Decoder(list[FileEntry])


def encode_manifest(files: list[FileEntry]) -> bytes:
    """A manifest's content: the files of a snapshot, by path."""
    return _manifest_encoder.encode(sorted(files, key=lambda e: e.path))


def decode_manifest(data: bytes) -> list[FileEntry]:
    """The files of a manifest; SnapshotError when it is no manifest."""
    try:
        return _manifest_decoder.decode(data)
    except msgspec.DecodeError as error:
        raise SnapshotError(f"not a manifest of a snapshot: {error}") from None
