"""The state of a source's working tree as a run records it: its git provenance and its scan.

`git_provenance` records a working tree without copying it (local mode): branch, commit, the
changed files and `diff_sha256`, the tree hash a snapshot of it would have. `scan` lists what a
snapshot of it holds (`simrun_cli.snapshots` writes or uploads it): the files git knows below
the source directory (tracked and untracked, not ignored; `git ls-files -z --cached --others
--exclude-standard`), regular files with the sha256 of their content and their mode without the
write bits, symbolic links with their target, the modes of the directories that hold them, and
the patch `git diff HEAD --binary --no-ext-diff --no-color`.

`changed_files` (`SourceProvenance.changed`) are the entries of `git status --porcelain=v1 -z
--untracked-files=all` in the order of git, each as one line: the two status letters with their
blanks removed, a space, and the path relative to the top of the repository; for a rename or a
copy the path it came from, ` -> ` and the path. E.g. `M src/a.py` (changed in the working tree,
or staged: ` M` and `M ` alike), `MM src/a.py` (staged and changed again), `A new.py`, `D
gone.py`, `R old.py -> new.py`, and `?? notes.txt` for an untracked file, one line per file.
Paths are as git has them, never quoted. The git state is the one of the repository, also for a
source that is a directory inside it.

Git runs with `GIT_OPTIONAL_LOCKS=0`, so recording a source never takes the index lock of a
repository someone works in. A path that is gone between the listing of git and its hash is left
out, as is anything that is neither a regular file nor a link (a submodule, a nested repository)
and a file below a directory that became a link.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from simrun_core.provenance import SourceProvenance
from simrun_core.snapshot import DIRECTORY_BITS, READ_EXECUTE, FileEntry, Scan, parents, tree_hash


class SourceError(ValueError):
    """A source that cannot be recorded; the message names the source and its path."""


def parse_source(option: str) -> tuple[str, Path]:
    """`NAME=PATH` of a `--source` option as the name and the path (`~` expanded)."""
    name, sep, path = option.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise SourceError(f"--source {option!r}: expected NAME=PATH, e.g. model=.")
    return name.strip(), Path(path.strip()).expanduser()


def source_provenances(options: list[str]) -> list[SourceProvenance]:
    """The provenance of `--source NAME=PATH` options, in their order, each name once."""
    sources: list[SourceProvenance] = []
    for option in options:
        name, path = parse_source(option)
        if any(known.name == name for known in sources):
            raise SourceError(f"--source {option!r}: the source {name!r} is given twice")
        sources.append(git_provenance(name, path))
    return sources


@dataclass(frozen=True)
class GitState:
    """The git state of a working tree: its absolute path, branch (None detached), commit (None
    before the first), the changed files (see the module) and whether there are any."""

    path: Path
    branch: str | None
    commit: str | None
    changed_files: list[str]

    @property
    def dirty(self) -> bool:
        return bool(self.changed_files)


def git_state(name: str, path: Path) -> GitState:
    """The git state of the working tree of a source.

    Raises:
        SourceError: The path is no directory or no git working tree, or git failed.
    """
    absolute = Path(path).expanduser().resolve()
    if not absolute.is_dir():
        raise SourceError(f"source {name!r}: {absolute} is no directory")
    inside = _git(absolute, "rev-parse", "--is-inside-work-tree", check=False)
    if inside.returncode != 0 or inside.stdout.strip() != b"true":
        raise SourceError(f"source {name!r}: {absolute} is no git working tree")
    branch = _optional(_git(absolute, "symbolic-ref", "--quiet", "--short", "HEAD", check=False))
    commit = _optional(_git(absolute, "rev-parse", "--quiet", "--verify", "HEAD", check=False))
    status = _git(absolute, "status", "--porcelain=v1", "-z", "--untracked-files=all").stdout
    return GitState(absolute, branch, commit, status_lines(status))


def git_provenance(name: str, path: Path) -> SourceProvenance:
    """The provenance of a working tree without copying it: branch, commit, the changed files
    and `diff_sha256`, the tree hash a snapshot of the tree would have.

    Raises:
        SourceError: The path is no git working tree, or git failed; the message names it.
    """
    state = git_state(name, path)
    files, _ = tree_files(name, state.path)
    return SourceProvenance(
        name=name,
        path=str(state.path),
        branch=state.branch,
        commit=state.commit,
        dirty=state.dirty,
        changed=state.changed_files,
        diff_sha256=tree_hash(files),
    )


def scan(repo: Path, name: str = "") -> Scan:
    """What a snapshot of the working tree of a source holds, before it is copied.

    Raises:
        SourceError: The path is no git working tree, the repository has no commit yet, or git
            failed; the message names the source (`name`) and its path.
    """
    label = name or str(repo)
    state = git_state(label, repo)
    if state.commit is None:
        raise SourceError(
            f"source {label!r}: {state.path} has no commit yet: commit once to snapshot it"
        )
    files, dirs = tree_files(label, state.path)
    patch = b""
    if state.dirty:
        patch = _git(state.path, "diff", "HEAD", "--binary", "--no-ext-diff", "--no-color").stdout
    return Scan(
        branch=state.branch,
        commit=state.commit,
        dirty=state.dirty,
        changed_files=state.changed_files,
        patch=patch,
        files=files,
        dirs=dirs,
    )


def status_lines(status: bytes) -> list[str]:
    """The changed files of `git status --porcelain=v1 -z` as lines (see the module)."""
    lines: list[str] = []
    entries = iter(status.split(b"\0"))
    for entry in entries:
        if len(entry) < 4:
            continue
        code, path = entry[:2].decode().replace(" ", ""), os.fsdecode(entry[3:])
        if code[:1] in ("R", "C"):
            source = os.fsdecode(next(entries, b""))  # the path it was renamed or copied from
            path = f"{source} -> {path}"
        lines.append(f"{code} {path}")
    return lines


def tree_files(name: str, root: Path) -> tuple[list[FileEntry], dict[str, int]]:
    """The files git knows below `root` in the order of git, and the modes of the directories
    that hold them (permission bits and setgid).

    Raises:
        SourceError: git failed, or a path is no UTF-8.
    """
    listing = _git(root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").stdout
    files: list[FileEntry] = []
    dirs: dict[str, int] = {}
    real_dirs: dict[str, bool] = {}
    seen: set[bytes] = set()
    for raw in listing.split(b"\0"):
        if not raw or raw in seen or raw.endswith(b"/"):  # an unmerged path is listed per stage
            continue
        seen.add(raw)
        try:
            path = raw.decode()
        except UnicodeDecodeError:
            raise SourceError(
                f"source {name!r}: the path {os.fsdecode(raw)!r} in {root} is not UTF-8"
            ) from None
        above = parents(path)
        if not all(_real_dir(root, parent, real_dirs, dirs) for parent in above):
            continue  # a directory on its way is gone or became a link: never read through it
        entry = _entry(name, root, path)
        if entry is not None:
            files.append(entry)
    held = {parent for entry in files for parent in parents(entry.path)}
    return files, {directory: mode for directory, mode in dirs.items() if directory in held}


def _real_dir(root: Path, directory: str, known: dict[str, bool], modes: dict[str, int]) -> bool:
    """Whether a directory of the tree is a directory (no link), its mode noted in `modes`."""
    found = known.get(directory)
    if found is None:
        try:
            info = os.lstat(root / directory)
        except OSError:
            found = False
        else:
            found = stat.S_ISDIR(info.st_mode)
            if found:
                modes[directory] = stat.S_IMODE(info.st_mode) & DIRECTORY_BITS
        known[directory] = found
    return found


def _entry(name: str, root: Path, path: str) -> FileEntry | None:
    """The entry of a path: a regular file with its hash, a link with its target; None for a
    path that is gone or is something else (a submodule, a nested repository)."""
    file = root / path
    try:
        info = os.lstat(file)
        mode = stat.S_IMODE(info.st_mode) & READ_EXECUTE
        if stat.S_ISLNK(info.st_mode):
            return FileEntry(path=path, mode=mode, link=os.readlink(file))
        if not stat.S_ISREG(info.st_mode):
            return None
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return None  # gone since git listed it
    except OSError as error:
        if error.errno == errno.ELOOP:
            return None  # it became a link since it was looked at: left out as a gone file
        raise SourceError(f"source {name!r}: cannot read {file}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as stream:
        digest = hashlib.file_digest(stream, "sha256")
    return FileEntry(path=path, mode=mode, sha256=digest.hexdigest())


def _optional(result: subprocess.CompletedProcess[bytes]) -> str | None:
    text = result.stdout.decode().strip()
    return text if result.returncode == 0 and text else None


def _git(tree: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        result = subprocess.run(
            ["git", "-C", str(tree), *args], capture_output=True, env=env, check=False
        )
    except FileNotFoundError:
        raise SourceError("git is not installed: it records the provenance of sources") from None
    if check and result.returncode != 0:
        message = result.stderr.decode(errors="replace").strip()
        raise SourceError(f"git {' '.join(args)} failed in {tree}: {message}")
    return result
