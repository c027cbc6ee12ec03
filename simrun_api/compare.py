"""The comparison of runs: their provenance and the summaries of their tasks side by side."""

from __future__ import annotations

import os
from typing import Any

import msgspec

from simrun_api.beneath import open_beneath
from simrun_core.fold import RunRecord
from simrun_core.store import RunPaths
from simrun_core.store_layout import OUT, TASKS
from simrun_core.wire import CompareTable

BASE_COLUMNS = ("run", "group", "agent", "state")
MAX_CELLS = 1_000_000
"""The most cells (rows times columns) of a table: a run of 2,000 summary keys asked 5,000
times took 1.8 GiB of the service's memory, from a body of 100 KiB."""


class TableTooLarge(ValueError):
    """A comparison whose table would pass `MAX_CELLS`; the message names both numbers."""


def read_summary(paths: RunPaths, task: str) -> dict[str, Any]:
    """The `out/summary.json` of a task, empty when it has none (or it is no JSON object).

    No link is followed, neither the summary nor a directory on the way to it (`out/`, the
    task's directory): it could name any file of the service.
    """
    try:
        fd = open_beneath(paths.dir, (TASKS, task, OUT, "summary.json"), is_dir=False)
        with os.fdopen(fd, "rb") as file:
            value = msgspec.json.decode(file.read())
    except (OSError, msgspec.DecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def compare_runs(runs: list[tuple[RunRecord, RunPaths]]) -> CompareTable:
    """One row per run, in the order given: `run`, `group`, `agent`, `state`, then per source
    `<source>.changed_files` (its changed files as porcelain status lines, e.g. `M model.py`),
    `<source>.diff_sha256` (the tree hash of its files) and, for a source of a run that has a
    snapshot, `<source>.snapshot` (its directory below the store), then every key of every
    task's summary as `<task>.<key>`; the columns in the order they first appear, None where a
    run has no value."""
    rows: dict[str, dict[str, Any]] = {}
    sources: dict[str, None] = {}
    summaries: dict[str, None] = {}
    for record, paths in runs:
        if record.id in rows:  # a run asked again: its row again, read once
            continue
        row: dict[str, Any] = {
            "run": record.id,
            "group": record.group,
            "agent": record.agent,
            "state": record.state.value,
        }
        for source in record.sources:
            values = [
                (f"{source.name}.changed_files", list(source.changed)),
                (f"{source.name}.diff_sha256", source.diff_sha256),
            ]
            if source.snapshot:
                values.append((f"{source.name}.snapshot", source.snapshot))
            for key, value in values:
                sources[key] = None
                row[key] = value
        for task in record.workflow.tasks:
            for key, value in read_summary(paths, task.id).items():
                column = f"{task.id}.{key}"
                summaries[column] = None
                row[column] = value
        rows[record.id] = row
    columns = [*BASE_COLUMNS, *sources, *summaries]
    if len(runs) * len(columns) > MAX_CELLS:
        raise TableTooLarge(
            f"{len(runs)} runs of {len(columns)} columns make a table of "
            f"{len(runs) * len(columns)} cells, at most {MAX_CELLS}: compare fewer runs"
        )
    return CompareTable(
        columns=columns,
        rows=[{column: rows[record.id].get(column) for column in columns} for record, _ in runs],
    )
