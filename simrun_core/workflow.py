"""The workflow model: tasks, the references between them and their order."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
import yaml

from simrun_core.errors import WorkflowError

TASK_ID = re.compile(r"[a-z][a-z0-9-]*")


class SplitMode(enum.StrEnum):
    """How the pieces of a task are placed on the nodes."""

    FASTEST = "fastest"
    SINGLE_SERVER = "single-server"


class Priority(enum.StrEnum):
    """The priority of a run in the queue, decided by the identity of its submitter."""

    OWNER = "owner"
    STANDARD = "standard"
    AGENT = "agent"


class ResourceOverride(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Resources of a task which replace the learned or default ones."""

    workers: int | None = None
    memory_per_worker_gb: float | None = None
    scratch_gb: float | None = None
    gpus: int | None = None


class TaskSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A task of a workflow: a type, its settings and the outputs it reads."""

    id: str
    type: str
    settings: dict[str, Any] = msgspec.field(default_factory=dict)
    inputs: dict[str, str] = msgspec.field(default_factory=dict)
    split: SplitMode | None = None
    resources: ResourceOverride | None = None
    stage: list[str] = msgspec.field(default_factory=list)

    def dependencies(self) -> list[str]:
        """Ids of the tasks this task reads from, in input order, without repeats."""
        return list(dict.fromkeys(ref.split(".", 1)[0] for ref in self.inputs.values()))


class Workflow(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A workflow: tasks which read the outputs of each other."""

    name: str
    tasks: list[TaskSpec]
    split: SplitMode = SplitMode.FASTEST
    reserve: str | None = None

    def task(self, task_id: str) -> TaskSpec:
        """The task with the given id; WorkflowError if there is none."""
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise WorkflowError(f"workflow {self.name!r} has no task {task_id!r}")

    def order(self) -> list[TaskSpec]:
        """The tasks in topological order, stable in file order; WorkflowError on a cycle."""
        remaining = {task.id: task for task in self.tasks}
        done: set[str] = set()
        ordered: list[TaskSpec] = []
        while remaining:
            ready = [
                task
                for task in remaining.values()
                if all(dep in done or dep not in remaining for dep in task.dependencies())
            ]
            if not ready:
                cycle = _cycle(_in_cycles(remaining))
                raise WorkflowError(f"the inputs of tasks {cycle} form a cycle")
            first = ready[0]
            ordered.append(first)
            done.add(first.id)
            del remaining[first.id]
        return ordered


def _in_cycles(remaining: dict[str, TaskSpec]) -> list[TaskSpec]:
    """The tasks left after removing, again and again, those no remaining task reads from."""
    left = dict(remaining)
    while True:
        read = {dep for task in left.values() for dep in task.dependencies() if dep in left}
        sinks = [task_id for task_id in left if task_id not in read]
        if not sinks:
            return list(left.values())
        for task_id in sinks:
            del left[task_id]


def _cycle(tasks: Iterable[TaskSpec]) -> str:
    return ", ".join(repr(task.id) for task in tasks)


def structural_errors(workflow: Workflow) -> list[str]:
    """The errors of a workflow that need no task type: ids, references, stage and order."""
    errors: list[str] = []
    if not workflow.tasks:
        errors.append("the workflow has no tasks")
    seen: set[str] = set()
    for task in workflow.tasks:
        if not TASK_ID.fullmatch(task.id):
            errors.append(f"task {task.id!r}: the id must match [a-z][a-z0-9-]*")
        if task.id in seen:
            errors.append(f"task {task.id!r}: the id is used twice")
        seen.add(task.id)
    ids = {task.id for task in workflow.tasks}
    for task in workflow.tasks:
        for port, ref in task.inputs.items():
            source, dot, out = ref.partition(".")
            if not dot or not source or not out:
                errors.append(
                    f"task {task.id!r}: input {port!r} is {ref!r}, expected '<task>.<port>'"
                )
            elif source not in ids:
                errors.append(f"task {task.id!r}: input {port!r} names unknown task {source!r}")
            elif source == task.id:
                errors.append(f"task {task.id!r}: input {port!r} reads the task itself")
        for port in task.stage:
            if port not in task.inputs:
                errors.append(f"task {task.id!r}: stage names {port!r}, which is no input")
    if not errors:
        try:
            workflow.order()
        except WorkflowError as error:
            errors.append(str(error))
    return errors


def parse_workflow(text: str | bytes, source: str = "workflow") -> Workflow:
    """A workflow from YAML text, structurally valid; WorkflowError naming `source` otherwise."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise WorkflowError(f"{source}: not valid YAML: {error}") from None
    return workflow_from_data(data, source)


def workflow_from_data(data: object, source: str = "workflow") -> Workflow:
    """A workflow from decoded YAML or JSON, structurally valid; WorkflowError otherwise."""
    if not isinstance(data, dict):
        raise WorkflowError(f"{source}: a workflow is a mapping with 'name' and 'tasks'")
    try:
        workflow = msgspec.convert(data, Workflow, strict=True)
    except msgspec.ValidationError as error:
        raise WorkflowError(f"{source}: {_describe(error, data)}") from None
    errors = structural_errors(workflow)
    if errors:
        raise WorkflowError(f"{source}: " + "; ".join(errors))
    return workflow


def _describe(error: msgspec.ValidationError, data: dict[str, Any]) -> str:
    """A msgspec error with `$.tasks[0]` replaced by the id of that task."""
    message = str(error)
    match = re.search(r"\$\.tasks\[(\d+)\]", message)
    tasks = data.get("tasks")
    if match and isinstance(tasks, list) and int(match.group(1)) < len(tasks):
        entry = tasks[int(match.group(1))]
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            message = message.replace(match.group(0), f"task {entry['id']!r}")
    return message


def load_workflow(path: Path) -> Workflow:
    """Read a workflow from a YAML file; WorkflowError naming the file if it is not valid."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise WorkflowError(f"{path}: cannot be read: {error.strerror}") from None
    return parse_workflow(text, str(path))


def workflow_yaml(workflow: Workflow) -> str:
    """The compact YAML of a workflow: `name`, `tasks` and the fields that differ from defaults."""
    data = msgspec.to_builtins(workflow)
    return yaml.dump(data, Dumper=_IndentedDumper, sort_keys=False, default_flow_style=False)


def dump_workflow(workflow: Workflow, path: Path) -> None:
    """Write a workflow as a YAML file."""
    Path(path).write_text(workflow_yaml(workflow))


class _IndentedDumper(yaml.SafeDumper):
    """Indents a sequence below its key, as the workflows of the docs are written."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)
