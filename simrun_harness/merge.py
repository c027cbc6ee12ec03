"""The merge of a split task once its ledger is complete, marked by `out/.simrun-merged`."""

from __future__ import annotations

import json
import threading
import time

from simrun_core.events import Merged
from simrun_core.plugins import resolve
from simrun_core.store import MERGED_MARKER, write_atomic
from simrun_harness.env import LoadedTask
from simrun_harness.errors import ConfigurationError, MergeError, Terminated
from simrun_harness.ledger import Ledger
from simrun_harness.report import EventLog, say


def describe_indices(indices: list[int], limit: int = 20) -> str:
    """Sorted indices for a message, runs collapsed (`0-4, 7`) and cut after `limit` parts."""
    parts: list[str] = []
    start = previous = None
    for index in [*sorted(indices), None]:
        if previous is not None and index == previous + 1:
            previous = index
            continue
        if start is not None:
            parts.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = index
    if len(parts) > limit:
        return ", ".join(parts[:limit]) + f" and {len(parts) - limit} more"
    return ", ".join(parts)


def ledger_of(task: LoadedTask) -> Ledger:
    """The ledger of a split task, `<task_dir>/ledger`, sized by the type's `count_units`.

    Raises ConfigurationError when the type is not split, its `count_units` fails, or the
    ledger exists with another number of units.
    """
    task_type = task.task_type
    if not task_type.splittable:
        raise ConfigurationError(
            f"SIMRUN_TASK_TYPE: {task_type.name!r} is not split into units "
            "(it needs count_units, compute_unit and merge)"
        )
    try:
        n_units = task_type.units(task.settings)
    except Exception as error:
        raise ConfigurationError(
            f"{task_type.count_units}: cannot count the units: {type(error).__name__}: {error}"
        ) from error
    assert n_units is not None
    try:
        return Ledger(task.paths.task_dir / "ledger", n_units)
    except ValueError as error:
        raise ConfigurationError(str(error)) from None


def run_merge(
    task: LoadedTask, ledger: Ledger, worker: str, log: EventLog, stop: threading.Event
) -> None:
    """Merge the units of a complete ledger in this process; write the marker and `Merged`, and
    say in the log of the process how many units it merged in how many seconds.

    Raises Terminated when a SIGTERM came before the merge began; MergeError when units are
    not done (the message names them) or the type's merge function raised.
    """
    if stop.is_set():
        raise Terminated("stopped on SIGTERM before the merge")
    missing = ledger.missing()
    if missing:
        raise MergeError(
            f"cannot merge: {len(missing)} of {ledger.n_units} units are not done: "
            f"{describe_indices(missing)}"
        )
    assert task.task_type.merge is not None
    began = time.monotonic()
    try:
        resolve(task.task_type.merge)(task.settings, task.paths)
    except Exception as error:
        raise MergeError(f"merge failed: {type(error).__name__}: {error}") from error
    marker = {"task": task.paths.task_dir.name, "worker": worker, "units": ledger.n_units}
    write_atomic(task.paths.out / MERGED_MARKER, json.dumps(marker).encode() + b"\n")
    log.append(Merged(task=task.paths.task_dir.name, worker=worker))
    say(worker, f"merged the {ledger.n_units} units in {time.monotonic() - began:.2f} s")
