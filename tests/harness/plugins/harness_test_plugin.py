"""A tiny unsplit plugin type for the tests of `simrun-exec`, found by `module:ATTRIBUTE`.

The tests put this directory on `PYTHONPATH` and set `SIMRUN_TASK_TYPE` to
`harness_test_plugin:COPY` (or `:BROKEN` for a command that cannot start).
"""

import sys
from pathlib import Path

import msgspec

from simrun_core.plugins import ResourceHint, TaskType

COMMAND = Path(__file__).with_name("copy_command.py")


class CopySettings(msgspec.Struct, forbid_unknown_fields=True):
    """What the command does: `copy` its inputs, `fail`, `kill` itself, or `sleep` first."""

    mode: str = "copy"
    sleep_s: float = 0.0
    ignore_sigterm: bool = False


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
