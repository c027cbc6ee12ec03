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

import bisect
import dataclasses
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
STORED_DIRECTORY_BITS: Final = 0o755
"""The bits of a directory's mode of the scan a snapshot keeps: neither group nor others may
write into the store (nor setgid or sticky bits carry over), as its files are read-only."""
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


@dataclasses.dataclass(frozen=True)
class PathLimits:
    """The limits of a file list: what the file system of the store takes (`name_bytes`, the
    longest name of one component, `NAME_MAX`; `path_bytes`, the longest path, `PATH_MAX` with
    its terminating NUL), how deep a path may go (`depth` directories: deeper than working trees
    go, and it bounds the work of one path) and how many files and directories a list may make
    (`entries`). A list within them is checked in time linear in its size."""

    name_bytes: int = 255
    path_bytes: int = 4096
    depth: int = 256
    entries: int = 500_000


DEFAULT_LIMITS: Final = PathLimits()
"""The limits of a file list where the file system's own are not known."""


def shown(path: str) -> str:
    """A path as a message names it: its repr, cut after 80 characters."""
    return repr(path) if len(path) <= 80 else repr(path[:80]) + f"... ({len(path)} characters)"


def check_path(path: str, limits: PathLimits = DEFAULT_LIMITS) -> None:
    """Refuse a path that is not a normalised relative path inside a tree, or one the file
    system of the store could not hold (`limits`)."""
    size = len(path.encode("utf-8", "surrogatepass"))
    if size >= limits.path_bytes:
        raise SnapshotError(
            f"path {shown(path)}: {size} bytes long: a path of the store has fewer than "
            f"{limits.path_bytes} (PATH_MAX)"
        )
    if not path or "\0" in path:
        raise SnapshotError(f"path {path!r}: empty or has a NUL character")
    if path.startswith("/"):
        raise SnapshotError(f"path {path!r}: absolute")
    parts = path.split("/")
    if len(parts) - 1 > limits.depth:
        raise SnapshotError(
            f"path {shown(path)}: {len(parts) - 1} directories deep: at most {limits.depth}"
        )
    longest = max(parts, key=len)
    if len(longest.encode("utf-8", "surrogatepass")) > limits.name_bytes:
        raise SnapshotError(
            f"path {shown(path)}: the name {shown(longest)} is longer than the "
            f"{limits.name_bytes} bytes of a name of the store (NAME_MAX)"
        )
    if ".." in parts:
        raise SnapshotError(f"path {path!r}: has a '..' component")
    if any(part.lower() == ".git" for part in parts):
        raise SnapshotError(f"path {path!r}: has a '.git' component")
    if "\\" in path or posixpath.normpath(path) != path or "." in parts:
        raise SnapshotError(f"path {path!r}: not normalised")


class FileListCheck:
    """The checks of a file list, an entry at a time as it arrives (`add`), then those of the
    whole list (`finish`): a list that could write outside the tree of a snapshot, hold what a
    snapshot cannot, or pass the `limits`, is refused naming the first bad entry's path."""

    def __init__(self, limits: PathLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.paths: set[str] = set()

    def add(self, entry: FileEntry) -> None:
        """Check one entry (and that the list stays within its number of entries)."""
        if len(self.paths) >= self.limits.entries:
            raise SnapshotError(
                f"the file list has more than {self.limits.entries} entries: the most this "
                "service takes"
            )
        check_path(entry.path, self.limits)
        if entry.path in self.paths:
            raise SnapshotError(f"path {entry.path!r}: listed twice")
        self.paths.add(entry.path)
        if entry.mode & ~READ_EXECUTE:
            raise SnapshotError(
                f"path {entry.path!r}: mode {entry.mode:o} has more than read and execute bits"
            )
        if (entry.sha256 is None) == (entry.link is None):
            raise SnapshotError(f"path {entry.path!r}: needs either a sha256 or a link target")
        if entry.sha256 is not None and not _SHA256.fullmatch(entry.sha256):
            raise SnapshotError(f"path {entry.path!r}: sha256 {entry.sha256!r} is no hex digest")
        if entry.link is not None:
            _check_link(entry.path, entry.link, self.limits)

    def finish(self) -> None:
        """Check the whole list: no path below another file, and no more directories than
        `limits.entries`."""
        directories = _directories(self.paths)
        if directories > self.limits.entries:
            raise SnapshotError(
                f"the file list makes {directories} directories: at most {self.limits.entries}"
            )


def _directories(paths: set[str]) -> int:
    """The directories the paths make; SnapshotError for a path below another one (a file).

    Sorted with `/` as NUL (below every other character) the paths are in the order of their
    components: the directories of a path that an earlier path has, the path just before it has
    too, and a file above a path comes just before it or above the one just before it. So one
    pass over neighbours finds both, in time linear in the size of the list."""
    previous = ""
    count = 0
    for current in sorted(path.replace("/", "\0") for path in paths):
        if previous and current.startswith(previous + "\0"):
            raise SnapshotError(
                f"path {current.replace(chr(0), '/')!r}: below the file "
                f"{previous.replace(chr(0), '/')!r}"
            )
        shared = current.count("\0", 0, _common_length(previous, current))
        count += current.count("\0") - shared
        previous = current
    return count


def _common_length(first: str, second: str) -> int:
    """The length of the common start of two strings (a binary search of slices)."""
    low, high = 0, min(len(first), len(second))
    while low < high:
        middle = (low + high + 1) // 2
        if first[:middle] == second[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def check_files(files: list[FileEntry], limits: PathLimits = DEFAULT_LIMITS) -> None:
    """Refuse a file list that would write outside the tree of a snapshot, hold what a
    snapshot cannot, or pass the `limits`: every problem of the first bad entry named with its
    path."""
    check = FileListCheck(limits)
    for entry in files:
        check.add(entry)
    check.finish()


def _check_link(path: str, target: str, limits: PathLimits) -> None:
    """Refuse a link whose target is absolute, leaves the tree or is longer than a path."""
    if len(target.encode("utf-8", "surrogatepass")) >= limits.path_bytes:
        raise SnapshotError(
            f"link {path!r}: its target is longer than a path of the store ({limits.path_bytes} "
            "bytes, PATH_MAX)"
        )
    if not target or "\0" in target:
        raise SnapshotError(f"link {path!r}: empty target or a NUL character")
    if target.startswith("/"):
        raise SnapshotError(f"link {path!r}: absolute target {target!r}")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if resolved == ".." or resolved.startswith("../"):
        raise SnapshotError(f"link {path!r}: target {target!r} leaves the tree")
    if any(part.lower() == ".git" for part in resolved.split("/")):
        raise SnapshotError(f"link {path!r}: target {target!r} is in '.git'")


def check_scan(scan: Scan, limits: PathLimits = DEFAULT_LIMITS) -> None:
    """Refuse a scan that cannot become a snapshot: a file list `check_files` refuses, a commit
    that is no hexadecimal hash, more directories than `limits.entries`, or a directory that
    holds no file of the scan, is a file too, or has other mode bits than permissions and
    setgid."""
    if not _COMMIT.fullmatch(scan.commit):
        raise SnapshotError(f"commit {scan.commit!r}: not a hexadecimal hash")
    check_files(scan.files, limits)
    if len(scan.dirs) > limits.entries:
        raise SnapshotError(
            f"directory list: {len(scan.dirs)} directories: at most {limits.entries}"
        )
    paths = sorted(entry.path for entry in scan.files)
    files = set(paths)
    for directory, mode in scan.dirs.items():
        check_path(directory, limits)
        if directory in files:
            raise SnapshotError(f"directory {directory!r}: is a file of the scan too")
        first_below = bisect.bisect_left(paths, directory + "/")
        if first_below == len(paths) or not paths[first_below].startswith(directory + "/"):
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
