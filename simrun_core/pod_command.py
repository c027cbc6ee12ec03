"""The argv of a task's pods, or of its steps on another engine, the same everywhere: its harness
entry (`simrun-worker`, `simrun-merge`, `simrun-exec`), or a `command` task's args with its
settings file, its output and its inputs below the store as the pod sees it (spec 31)."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Final

from simrun_core import launch as contract
from simrun_core.argv import TemplateError, expand_argv
from simrun_core.errors import Problem, WorkflowError
from simrun_core.plugins import TaskType
from simrun_core.workflow import TaskSpec

COMMAND_TYPE: Final = "command"


def pod_command(
    task: TaskSpec, task_type: TaskType, launch: contract.Launch, store: PurePosixPath
) -> list[str]:
    """The argv of a pod of `task` launched as `launch`, the store at `store`; WorkflowError
    naming the task (and `settings.args`) for a type with neither an entry nor a command, or
    args that are no list of strings or no template."""
    if launch.entry is not None:
        return [f"simrun-{launch.entry}"]
    if task_type.name != COMMAND_TYPE:
        message = f"its type {task_type.name!r} is neither split nor has a command"
        raise WorkflowError(Problem(message, task.id))
    args = getattr(task_type.decode_settings(task.settings), "args", None)
    if not isinstance(args, list) or not all(isinstance(part, str) for part in args):
        raise WorkflowError(Problem("not a list of strings", task.id, field="settings.args"))
    task_dir = PurePosixPath(launch.task_dir)
    inputs = {port: str(store / path) for port, path in launch.inputs.items()}
    try:
        return expand_argv(args, str(task_dir / "settings.json"), str(task_dir / "out"), inputs)
    except TemplateError as error:
        raise WorkflowError(Problem(str(error), task.id, field="settings.args")) from None
