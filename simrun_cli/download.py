"""Downloading the output files of a task into a directory, never outside of it."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from simrun_cli.client import Client
from simrun_cli.errors import CliError
from simrun_core.wire import OutputFile


def output_target(directory: Path, path: str) -> Path:
    """Where an output file goes below `directory`; CliError for a path that would leave it."""
    relative = PurePosixPath(path)
    if not path or relative.is_absolute() or ".." in relative.parts or not relative.parts:
        raise CliError(
            f"the service named the output file {path!r}, which is no path inside the output "
            "directory: nothing was downloaded"
        )
    return directory.joinpath(*relative.parts)


def download_outputs(
    client: Client, run: str, task: str, files: list[OutputFile], directory: Path
) -> list[tuple[Path, int]]:
    """Download the files into `directory`: each path is checked before any is written.

    Returns:
        The files written and their sizes, in the order of `files`.
    """
    targets = [(file.path, output_target(directory, file.path)) for file in files]
    return [_download(client, run, task, path, target) for path, target in targets]


def _download(client: Client, run: str, task: str, path: str, target: Path) -> tuple[Path, int]:
    """Download one file atomically: into a temporary file beside it, then a rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.part")
    try:
        with open(partial, "wb") as handle:
            size = client.download(run, task, path, handle.write)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return target, size
