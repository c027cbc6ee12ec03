"""Tiny plugin types for the tests of the harness, found by `module:ATTRIBUTE`.

The tests put this directory on `PYTHONPATH` and set `SIMRUN_TASK_TYPE` to
`harness_test_plugin:COPY` (an unsplit type, `:BROKEN` for a command that cannot start,
`:POOL` for one with `uses_cores`) or `:GATED` (the squares of `demo.squares`, each unit
waiting until the file `<task_dir>/gate` exists, so a test decides when units end).
"""

import sys
import time
from pathlib import Path

import msgspec

from simrun_core.plugins import ResourceHint, TaskPaths, TaskType
from simrun_core.task_types import demo

COMMAND = Path(__file__).with_name("copy_command.py")


class CopySettings(msgspec.Struct, forbid_unknown_fields=True):
    """What the command does: `copy` its inputs, `fail`, `kill` itself, or `sleep` first."""

    mode: str = "copy"
    sleep_s: float = 0.0
    ignore_sigterm: bool = False
    memory_mb: int = 0


COPY = TaskType(
    name="test.copy",
    settings=CopySettings,
    inputs=("data",),
    outputs=("copied",),
    hint=ResourceHint(memory_base_gb=0.0, memory_per_worker_gb=0.5),
    command=(sys.executable, str(COMMAND), "{settings}", "{out}", "--input={input}"),
)

BROKEN = TaskType(
    name="test.broken",
    settings=CopySettings,
    command=("/nonexistent/simrun-test-command", "{settings}"),
)

POOL = TaskType(
    name="test.pool",
    settings=CopySettings,
    hint=ResourceHint(memory_base_gb=0.0, memory_per_worker_gb=0.5),
    uses_cores=True,
    command=(sys.executable, str(COMMAND), "{settings}", "{out}", "--input={input}"),
)

GATE_TIMEOUT_S = 60.0


class GatedSettings(msgspec.Struct, forbid_unknown_fields=True):
    """As many units as `n`."""

    n: int


def compute_gated(settings: GatedSettings, index: int, paths: TaskPaths) -> None:
    """Wait for `<task_dir>/gate`, then write the square of the index as `demo.squares` does."""
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not (paths.task_dir / "gate").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate of unit {index} never opened")
        time.sleep(0.01)
    demo.write_json_atomic(
        paths.out / "squares" / f"{index}.json", {"index": index, "square": index**2}
    )


GATED = TaskType(
    name="test.gated",
    settings=GatedSettings,
    outputs=("squares",),
    hint=ResourceHint(memory_base_gb=0.0, memory_per_worker_gb=0.25),
    count_units="simrun_core.task_types.demo:count_units",
    setup="simrun_core.task_types.demo:setup",
    compute_unit="harness_test_plugin:compute_gated",
    merge="simrun_core.task_types.demo:merge",
)
