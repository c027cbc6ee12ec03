"""The demo plugin: sums of squares, split into one unit per number."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Annotated

import msgspec

from simrun_core.plugins import ResourceHint, TaskPaths, TaskType


class SquaresSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Settings of the squares demo: units, seconds per unit, a unit that fails, memory per unit."""

    n: Annotated[
        int, msgspec.Meta(description="The number of units: the squares of 0 to n - 1 are summed.")
    ]
    sleep_s: Annotated[
        float, msgspec.Meta(description="Seconds each unit sleeps, to stand for its work.")
    ] = 0.0
    fail_at: Annotated[
        int | None,
        msgspec.Meta(description="The index of a unit that fails (to try a failure), or null."),
    ] = None
    memory_mb: Annotated[
        int,
        msgspec.Meta(description="MiB each unit allocates while it runs, to stand for its memory."),
    ] = 0


def count_units(settings: SquaresSettings) -> int:
    """One unit per number."""
    return settings.n


def setup(settings: SquaresSettings, paths: TaskPaths) -> None:
    """Create the directory of the output port, once per process."""
    (paths.out / "squares").mkdir(parents=True, exist_ok=True)


def compute_unit(settings: SquaresSettings, index: int, paths: TaskPaths) -> None:
    """Write the square of the index atomically; RuntimeError for the unit set to fail."""
    ballast = bytearray(settings.memory_mb * 1024 * 1024) if settings.memory_mb else None
    if settings.sleep_s:
        time.sleep(settings.sleep_s)
    if index == settings.fail_at:
        raise RuntimeError(f"unit {index} fails as fail_at asks")
    del ballast
    write_json_atomic(paths.out / "squares" / f"{index}.json", {"index": index, "square": index**2})


def merge(settings: SquaresSettings, paths: TaskPaths) -> None:
    """Write the sum of the squares into the summary of the task."""
    total = 0
    for index in range(settings.n):
        total += json.loads((paths.out / "squares" / f"{index}.json").read_text())["square"]
    write_json_atomic(paths.out / "summary.json", {"n": settings.n, "sum": total})


def write_json_atomic(path: Path, value: object) -> None:
    """Write JSON through a temporary file in the same directory and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as file:
            json.dump(value, file)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


SQUARES = TaskType(
    name="demo.squares",
    settings=SquaresSettings,
    # `after`: an output of another task, which the squares do not read; the task waits for it,
    # so demo tasks make a chain (its only input port: any other is refused at submission).
    inputs=("after",),
    outputs=("squares",),
    hint=ResourceHint(memory_base_gb=0.125, memory_per_worker_gb=0.25),
    # A unit's seconds are its `sleep_s`: runs of other values learn apart.
    cost_setting="sleep_s",
    count_units="simrun_core.task_types.demo:count_units",
    setup="simrun_core.task_types.demo:setup",
    compute_unit="simrun_core.task_types.demo:compute_unit",
    merge="simrun_core.task_types.demo:merge",
    description="Sums of squares, one unit per number",
)
