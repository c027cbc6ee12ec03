"""Downloading the output files of a task into a directory, never outside of it.

The files come as one streamed tar (`Client.output_archive`), extracted with tarfile's `data`
filter into a hidden staging directory, which becomes the target directory once the whole archive
arrived (for a target that exists, its files are moved into it): a refused target, a broken
download or a refused member leaves nothing behind. The files get the modes of files this user
makes (the umask), executable where they were.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tarfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath

from simrun_cli.client import Client, ServiceUnreachable
from simrun_cli.errors import CliError
from simrun_core.wire import OutputFile

TAR_BLOCK = 512
READ_SIZE = 1024**2
STAGING_PREFIX = ".simrun-outputs-"


def output_target(directory: Path, path: str) -> Path:
    """Where an output file goes below `directory`; CliError for a path that would leave it."""
    relative = PurePosixPath(path)
    if not path or relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise CliError(
            f"the service named the output file {path!r}, which is no path inside the output "
            "directory: nothing was downloaded"
        )
    return directory.joinpath(*relative.parts)


def check_target(directory: Path) -> None:
    """CliError, naming `directory`, when it cannot take the files: it is no directory, a part
    of its path is no directory, or the directory that would hold it cannot be written."""
    refused = f"cannot download into {directory}"
    if os.path.lexists(directory) and not directory.is_dir():
        raise CliError(f"{refused}: it is a file, not a directory")
    existing = directory
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise CliError(f"{refused}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CliError(f"{refused}: {existing} is not writable")


def archive_size(files: Iterable[OutputFile]) -> int:
    """About the bytes of the tar of these files: a header and whole blocks each, and its end."""
    blocks = sum(1 + -(-file.bytes // TAR_BLOCK) for file in files)
    return (blocks + 2) * TAR_BLOCK


def download_outputs(
    client: Client,
    run: str,
    task: str,
    directory: Path,
    advance: Callable[[int], None] = lambda _: None,
    glob: str | None = None,
) -> list[tuple[Path, int]]:
    """Download the output files of a task (those matching `glob`, as the listing matches them)
    into `directory`, made if missing; `advance` is called with the bytes of every piece of the
    archive that arrives.

    Returns:
        The files written and their sizes, in the order of their paths.
    """
    check_target(directory)
    fresh = not os.path.lexists(directory)
    holder = directory.parent if fresh else directory
    created = _make_directories(holder)
    staging: Path | None = None
    try:
        staging = holder / f"{STAGING_PREFIX}{secrets.token_hex(4)}"
        staging.mkdir()
        sizes = _extract(client, run, task, staging, directory, advance, glob)
        paths = sorted(sizes)
        written = [(output_target(directory, path), sizes[path]) for path in paths]
        if fresh:
            os.rename(staging, directory)  # refused if it appeared meanwhile: nothing moved
            staging = None
        else:
            for path, target in _targets(directory, paths):
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(staging.joinpath(path), target)
    except OSError as error:
        _remove(staging, created)
        raise CliError(f"cannot download into {directory}: {error.strerror or error}") from None
    except BaseException:
        _remove(staging, created)
        raise
    _remove(staging, [])
    return written


def _make_directories(directory: Path) -> list[Path]:
    """Make `directory` and the missing directories above it; the ones made, deepest first."""
    missing = []
    existing = directory
    while not os.path.lexists(existing) and existing != existing.parent:
        missing.append(existing)
        existing = existing.parent
    made: list[Path] = []
    try:
        for path in reversed(missing):
            path.mkdir()
            made.insert(0, path)
    except OSError as error:
        _remove(None, made)
        raise CliError(f"cannot download into {directory}: {error.strerror or error}") from None
    return made


def _remove(staging: Path | None, created: list[Path]) -> None:
    """Remove the staging directory and the directories made for the download (if empty)."""
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)
    for path in created:
        try:
            path.rmdir()
        except OSError:
            break


def _extract(
    client: Client,
    run: str,
    task: str,
    staging: Path,
    directory: Path,
    advance: Callable[[int], None],
    glob: str | None = None,
) -> dict[str, int]:
    """Extract the archive of the outputs into `staging`; the size of every file by its path."""
    sizes: dict[str, int] = {}
    broken = f"the outputs of task {task!r} of run {run!r} did not arrive whole"
    with client.output_archive(run, task, glob) as chunks:
        try:
            reader = _ChunkReader(chunks, advance)
            with tarfile.open(fileobj=reader, mode="r|", bufsize=READ_SIZE) as archive:
                for member in archive:
                    if not member.isreg():
                        raise CliError(
                            f"the outputs of task {task!r} hold {member.name!r}, which is no "
                            f"regular file: nothing was written to {directory}"
                        )
                    output_target(staging, member.name)
                    archive.extract(member, staging, filter=_user_files)
                    sizes[member.name] = member.size
        except (tarfile.TarError, EOFError, ServiceUnreachable) as error:
            reason = error.reason if isinstance(error, ServiceUnreachable) else error
            raise CliError(f"{broken} ({reason}): nothing was written to {directory}") from None
    return sizes


def _user_files(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    """tarfile's `data` filter, and the mode of a new file of this user: read and write as the
    umask allows, executable too if it was for its owner."""
    checked = tarfile.data_filter(member, path)
    mode = 0o777 if member.mode & 0o100 else 0o666
    return checked.replace(mode=mode & ~_umask(), deep=False)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _targets(directory: Path, paths: list[str]) -> list[tuple[str, Path]]:
    """Where each file goes; CliError before anything moves when one cannot go there (a
    directory in its place, or a file in the place of one of its directories)."""
    targets = []
    for path in paths:
        target = output_target(directory, path)
        in_the_way = target if target.is_dir() else None
        place = target.parent
        while place != directory:
            if os.path.lexists(place) and not place.is_dir():
                in_the_way = place
            place = place.parent
        if in_the_way is not None:
            kind = "a directory" if in_the_way == target else "a file"
            raise CliError(
                f"cannot download into {directory}: {in_the_way} is {kind}, in the way of the "
                f"output file {path}; nothing was written"
            )
        targets.append((path, target))
    return targets


class _ChunkReader:
    """The chunks of a download as a file that tarfile reads in a stream."""

    def __init__(self, chunks: Iterator[bytes], advance: Callable[[int], None]) -> None:
        self._chunks = chunks
        self._advance = advance
        self._chunk = b""
        self._position = 0

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (all that are left for a negative size); b"" at the end."""
        parts = []
        while size != 0:
            if self._position >= len(self._chunk):
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._advance(len(chunk))
                self._chunk, self._position = chunk, 0
                continue
            end = len(self._chunk) if size < 0 else min(len(self._chunk), self._position + size)
            parts.append(self._chunk[self._position : end])
            if size > 0:
                size -= end - self._position
            self._position = end
        return b"".join(parts)
