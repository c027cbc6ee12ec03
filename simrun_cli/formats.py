"""Plain-text formats of times, durations, counts, sizes and units, without rich: the lines a
command prints while it follows a run need no more (rich is imported only for tables and live
views). Every count and every duration a command prints goes through one helper here."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simrun_core.wire import TaskProgressView, TaskView


def format_time(value: datetime | None) -> str:
    """A time in the local zone to the second, empty for None."""
    return "" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def format_duration(seconds: float) -> str:
    """A duration as `0.4 s`, `42 s`, `3 min 5 s` or `2 h 7 min` (two significant digits
    below 10 s, whole seconds below a minute, whole minutes from an hour)."""
    seconds = max(0.0, seconds)
    if seconds < 9.5:
        return f"{seconds:.2g} s" if seconds >= 0.001 else "0 s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, rest = divmod(round(seconds / 60), 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def format_count(number: int, noun: str, plural: str | None = None) -> str:
    """A count with its noun, singular for 1: `1 file`, `0 files`, `2 processes`."""
    if number == 1:
        return f"{number} {noun}"
    return f"{number} {plural or noun + 's'}"


def format_bytes(count: int) -> str:
    """A size in B, KiB, MiB, GiB or TiB (powers of 1024, as the memory of tasks is in GiB)."""
    if count < 1024:
        return f"{max(0, count)} B"
    value = count / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if round(value, 1) < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def units_text(task: TaskView | TaskProgressView | None) -> str:
    """`done/units` of a split task, empty for a task without units."""
    if task is None or task.units is None:
        return ""
    return f"{task.done}/{task.units}"
