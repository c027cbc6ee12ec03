"""Plain-text formats of times, durations, sizes and units, without rich: the lines a command
prints while it follows a run need no more (rich is imported only for tables and live views)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simrun_core.wire import TaskProgressView, TaskView


def format_time(value: datetime | None) -> str:
    """A time in the local zone to the second, empty for None."""
    return "" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def format_duration(seconds: float) -> str:
    """A duration as `42s`, `3m05s` or `2h07m`."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_bytes(count: int) -> str:
    """A size in bytes, kB, MB, GB or TB (powers of 1000)."""
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def units_text(task: TaskView | TaskProgressView | None) -> str:
    """`done/units` of a split task, empty for a task without units."""
    if task is None or task.units is None:
        return ""
    return f"{task.done}/{task.units}"
