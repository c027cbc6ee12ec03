"""The git provenance of a source: the state of a working tree, as a run records it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from simrun_core.provenance import SourceProvenance


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


def git_provenance(name: str, path: Path) -> SourceProvenance:
    """The provenance of a working tree: branch, commit and its uncommitted changes.

    `changed` are the paths `git status --porcelain` lists (untracked files one by one),
    `dirty` whether there are any, and `diff_sha256` the sha256 of `git diff HEAD --binary`
    followed by the path and the bytes of every untracked file, None for a clean tree.

    Raises:
        SourceError: The path is no git working tree, or git failed; the message names it.
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
    changed, untracked = _status_paths(status)
    diff_sha256 = None
    if changed:
        diff_sha256 = _diff_hash(absolute, name, commit is not None, untracked)
    return SourceProvenance(
        name=name,
        path=str(absolute),
        branch=branch,
        commit=commit,
        dirty=bool(changed),
        changed=changed,
        diff_sha256=diff_sha256,
    )


def _status_paths(status: bytes) -> tuple[list[str], list[str]]:
    """The changed paths of `git status --porcelain -z` and, of them, the untracked ones."""
    changed: list[str] = []
    untracked: list[str] = []
    entries = iter(status.split(b"\0"))
    for entry in entries:
        if len(entry) < 4:
            continue
        code, path = entry[:2], os.fsdecode(entry[3:])
        changed.append(path)
        if code == b"??":
            untracked.append(path)
        if code[:1] in (b"R", b"C"):
            next(entries, None)  # the path the entry was renamed or copied from
    return sorted(set(changed)), sorted(untracked)


def _diff_hash(tree: Path, name: str, has_commit: bool, untracked: list[str]) -> str:
    """sha256 of the diff against HEAD (of the index without a commit) and the untracked files."""
    digest = hashlib.sha256()
    base = ["diff", "HEAD"] if has_commit else ["diff", "--cached"]
    digest.update(_git(tree, *base, "--binary", "--no-ext-diff", "--no-color").stdout)
    toplevel = Path(os.fsdecode(_git(tree, "rev-parse", "--show-toplevel").stdout.strip()))
    for relative in untracked:  # porcelain paths are relative to the top of the repository
        file = toplevel / relative
        digest.update(b"\0untracked\0" + os.fsencode(relative) + b"\0")
        try:
            content = os.fsencode(os.readlink(file)) if file.is_symlink() else file.read_bytes()
        except OSError as error:
            raise SourceError(f"source {name!r}: cannot read {file}: {error.strerror}") from None
        digest.update(content)
    return digest.hexdigest()


def _optional(result: subprocess.CompletedProcess[bytes]) -> str | None:
    text = result.stdout.decode().strip()
    return text if result.returncode == 0 and text else None


def _git(tree: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
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
