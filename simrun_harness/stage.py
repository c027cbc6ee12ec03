"""Staging: copy input ports into the local scratch directory before the work starts."""

from __future__ import annotations

import dataclasses
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from simrun_harness.env import LoadedTask
from simrun_harness.errors import ConfigurationError, Terminated


def stage(sources: dict[str, Path], scratch: Path, stop: threading.Event) -> dict[str, Path]:
    """Copy each input (a directory tree or a file) to `<scratch>/<port>`; the copies by port.

    An existing copy (a restart) is refreshed in place. A SIGTERM is noticed between two files
    (Terminated). Raises ConfigurationError when an input does not exist or cannot be copied.
    """
    copies: dict[str, Path] = {}

    def copy_unless_stopped(source: str, target: str) -> object:
        if stop.is_set():
            raise Terminated("stopped on SIGTERM while staging the inputs")
        return shutil.copy2(source, target)

    for port, source in sorted(sources.items()):
        target = scratch / port
        if stop.is_set():
            raise Terminated("stopped on SIGTERM while staging the inputs")
        try:
            if source.is_dir():
                shutil.copytree(
                    source, target, dirs_exist_ok=True, copy_function=copy_unless_stopped
                )
            elif source.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                copy_unless_stopped(str(source), str(target))
            else:
                raise ConfigurationError(
                    f"SIMRUN_INPUTS: input {port!r} ({source}) does not exist, cannot stage it"
                )
        except (OSError, shutil.Error) as error:
            raise ConfigurationError(
                f"SIMRUN_STAGE: cannot stage input {port!r} from {source} to {target}: {error}"
            ) from None
        copies[port] = target
    return copies


def staged_task(task: LoadedTask, ports: Iterable[str], stop: threading.Event) -> LoadedTask:
    """The task with its input `ports` (`SIMRUN_STAGE`) copied into its scratch directory
    (`stage`) and read there: the inputs of its paths name the copies, so the setup, the units
    and the merge of a split task read the local copies instead of the store. The task as it
    is without ports to stage."""
    ports = list(ports)
    if not ports:
        return task
    copies = stage({port: task.paths.inputs[port] for port in ports}, task.paths.scratch, stop)
    paths = dataclasses.replace(task.paths, inputs={**task.paths.inputs, **copies})
    return dataclasses.replace(task, paths=paths)
