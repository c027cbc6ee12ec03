"""The units done that events record, for tests: a `unit-done` has one unit (logs written
before batches), a `units-done` a batch of them (what the harness writes now)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from simrun_core import events as ev

UNIT_TYPES = ("unit-done", "units-done")
"""The `type` of the JSON events that record units done."""


def unit_indices(events: Iterable[dict[str, Any]], task: str | None = None) -> list[int]:
    """The indices JSON events (`GET /runs/{run}/history`, a log's lines) record done, in
    order, repeats kept; only those of `task` when given."""
    found: list[int] = []
    for event in events:
        if task is not None and event.get("task") != task:
            continue
        if event.get("type") == "unit-done":
            found.append(event["index"])
        elif event.get("type") == "units-done":
            found += event["indices"]
    return found


def done_indices(events: Iterable[ev.Event | None], task: str | None = None) -> list[int]:
    """The indices typed events record done, in order, repeats kept; only `task`'s if given."""
    return [
        index
        for event in events
        if isinstance(event, ev.UNITS_EVENTS) and (task is None or event.task == task)
        for index, _ in ev.done_units(event)
    ]


def unit_lines(events: Iterable[dict[str, Any]]) -> list[tuple[int, float]]:
    """(index, seconds) of every unit JSON events record done, in order, repeats kept."""
    found: list[tuple[int, float]] = []
    for event in events:
        if event.get("type") == "unit-done":
            found.append((event["index"], event.get("seconds", 0.0)))
        elif event.get("type") == "units-done":
            found += zip(event["indices"], event["seconds"], strict=True)
    return found


def logged_units(path: Path) -> list[int]:
    """The indices the whole lines of a log (JSON, one event a line) record done so far."""
    lines = path.read_bytes().split(b"\n")[:-1]  # the last piece: a torn line or nothing
    return unit_indices(json.loads(line) for line in lines if line)
