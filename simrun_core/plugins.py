"""The plugin interface: task types, their resource hints and their discovery."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import msgspec

from simrun_core.argv import template_problems
from simrun_core.errors import Problem, WorkflowError, field_name, validation_problem
from simrun_core.workflow import (
    TaskSpec,
    Workflow,
    checkable_workflow,
    struct_problems,
    structural_problems,
)

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint, EntryPoints

ENTRY_POINT_GROUP = "simrun.task_types"
MAX_UNITS = 10_000_000
"""The most units a split task may have (10^7): each unit is an entry of the ledger and an event
of the run's log, so a count beyond this is no run a machine finishes; bigger units (fewer of
them) do the same work."""


class ResourceHint(msgspec.Struct, frozen=True):
    """Default resources of a task type, used while none are learned."""

    memory_base_gb: float = 2.0
    memory_per_worker_gb: float = 6.0
    scratch_gb: float = 0.0
    gpus: int = 0


@dataclasses.dataclass(frozen=True)
class TaskPaths:
    """The locations a task works in: the store, its run and task directories, out, inputs."""

    store: Path
    run_dir: Path
    task_dir: Path
    out: Path
    inputs: dict[str, Path]
    scratch: Path


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskTypeMetadata:
    """What a task type declares besides its settings model: its name, ports, resource hint and
    how it runs. A `TaskType` has it with its settings model; a type of a run's snapshots, as
    the service knows it (`simrun_core.snapshot_types.ProbedType`), with the model's fields."""

    name: str = dataclasses.field(kw_only=False)
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ("out",)
    hint: ResourceHint = dataclasses.field(default_factory=ResourceHint)
    checkpoints: bool = False
    command: tuple[str, ...] | None = None
    uses_cores: bool = False
    count_units: str | None = None
    setup: str | None = None
    compute_unit: str | None = None
    merge: str | None = None
    plan: str | None = None
    image: str | None = None
    cost_setting: str | None = None
    description: str = ""


def metadata_of(task_type: TaskTypeMetadata) -> dict[str, Any]:
    """The fields of `TaskTypeMetadata` of a type, by name: what makes one kind of it of
    another (`TaskType(settings=..., **metadata_of(probed))`)."""
    return {
        field.name: getattr(task_type, field.name) for field in dataclasses.fields(TaskTypeMetadata)
    }


@dataclasses.dataclass(frozen=True)
class TaskType(TaskTypeMetadata):
    """A type of task, registered as an entry point of `ENTRY_POINT_GROUP`: its metadata and its
    settings model (`TaskType(name, settings, inputs=..., ...)`).

    The callables are `"module:function"` strings so a worker process resolves them by import:
    `count_units(settings) -> int`, `setup(settings, paths)` once per process,
    `compute_unit(settings, index, paths)`, `merge(settings, paths)`, `plan(settings) -> settings`.
    A type with `count_units`, `compute_unit` and `merge` is split; any other runs `command`,
    an argv template with `{settings}`, `{out}` and `{input}`, through `simrun-exec`.
    """

    settings: type[msgspec.Struct]

    @property
    def splittable(self) -> bool:
        """Whether the task splits into units claimed from a ledger."""
        return bool(self.count_units and self.compute_unit and self.merge)

    def decode_settings(self, settings: dict[str, Any]) -> msgspec.Struct:
        """The settings as the type's struct; WorkflowError with every problem: the unknown
        settings, and each invalid or missing field as written below the settings (`n`,
        `args[0]`). Decoding is strict, as of JSON: `n: "100"` is no int."""
        problems: list[Problem] = []
        unknown = unknown_settings(self.settings, settings)
        if unknown:
            problems.append(Problem(f"unknown setting {', '.join(map(repr, unknown))}"))
        known = {key: value for key, value in settings.items() if key not in unknown}
        try:
            decoded = msgspec.convert(known, self.settings, strict=True)
        except msgspec.ValidationError as error:
            # field by field, so every wrong one is named; the error itself when the fields
            # are fine one by one (a check of the struct as a whole, e.g. its __post_init__)
            problems.extend(struct_problems(known, self.settings) or [validation_problem(error)])
        if problems:
            raise WorkflowError(problems)
        return decoded

    def units(self, settings: msgspec.Struct) -> int | None:
        """The number of units of a split task, None for an unsplit one."""
        if not self.splittable:
            return None
        assert self.count_units is not None
        return int(resolve(self.count_units)(settings))


def unknown_settings(model: type[msgspec.Struct], settings: dict[str, Any]) -> list[str]:
    """The keys of settings that are no field of the model (by name or encoded name), sorted."""
    known = set(model.__struct_fields__) | set(model.__struct_encode_fields__)
    return sorted(key for key in settings if key not in known)


def resolve(ref: str) -> Callable[..., Any]:
    """Import the function a `"module:function"` string names."""
    module_name, colon, attribute = ref.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"{ref!r} is no reference of the form 'module:function'")
    target: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    # What an import names is known only at run time: the reference promises a callable (or,
    # for `SIMRUN_TASK_TYPE`, a TaskType its caller checks with isinstance), so no check here.
    return cast("Callable[..., Any]", target)


class PluginFailure(Exception):
    """An error a plugin's function raised in another process (the environment of a run's
    snapshots), reported as its text: `TypeName: message`."""


class UnknownTaskType(LookupError):
    """No entry point registers a task type of this name; `known` are the names there are."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown task type {name!r}")
        self.name = name
        self.known = known


def _entry_points(name: str | None = None) -> EntryPoints:
    """The entry points of task types (only those called `name` when given)."""
    from importlib.metadata import entry_points  # here: only a scan needs it (~10 ms import)

    if name is None:
        return entry_points(group=ENTRY_POINT_GROUP)
    return entry_points(group=ENTRY_POINT_GROUP, name=name)


def load_task_types() -> dict[str, TaskType]:
    """The task types of all entry points by name; ValueError if a name is registered twice."""
    types: dict[str, TaskType] = {}
    for entry in _entry_points():
        task_type = _loaded(entry)
        if task_type.name in types:
            raise ValueError(f"task type {task_type.name!r} is registered twice")
        types[task_type.name] = task_type
    return types


_scanned: tuple[EntryPoint, ...] | None = None
"""The task types' entry points as `scan_task_types` found them, None before."""


def scan_task_types() -> None:
    """Find the task types' entry points now, for a later `load_task_type` of this process: a
    spare harness does it while it waits for its task, since a scan reads every installed
    distribution's metadata (tens of milliseconds with a few hundred of them)."""
    global _scanned
    _scanned = tuple(_entry_points())


def load_task_type(name: str) -> TaskType:
    """The task type `name`, importing only the entry point of that name (a harness runs one).

    An entry point is named as its type is, so the others are neither imported nor checked (the
    service checks them all, `load_task_types`). Should no entry point have the name, or its
    type be named otherwise, every entry point is loaded as `load_task_types` does, with its
    errors; `UnknownTaskType` (with the known names) if none is of type `name`. A name found by
    `scan_task_types` before is not looked up again.
    """
    entries = [entry for entry in _scanned or () if entry.name == name]
    if not entries:
        entries = list(_entry_points(name=name))
    if len(entries) > 1:
        raise ValueError(f"task type {name!r} is registered twice")
    if entries:
        task_type = _loaded(entries[0])
        if task_type.name == name:
            return task_type
    types = load_task_types()
    if name not in types:
        raise UnknownTaskType(name, sorted(types))
    return types[name]


def installed_task_types(names: Iterable[str]) -> dict[str, TaskType]:
    """The task types of these names installed here, importing only their entry points (an
    entry point is named as its type is); a name without one, or whose entry point does not
    load or names another type, is left out. What a client plans with (`plan_workflow`): a
    type it cannot load is submitted as written and checked by the service."""
    wanted = set(names)
    registered = [entry for entry in _entry_points() if entry.name in wanted]
    found: dict[str, TaskType] = {}
    for name in sorted(wanted):
        entries = [entry for entry in registered if entry.name == name]
        if len(entries) != 1:
            continue
        try:
            task_type = _loaded(entries[0])
        except Exception:  # a broken plugin: the service says what is wrong with it
            continue
        if task_type.name == name:
            found[name] = task_type
    return found


class PlanError(WorkflowError):
    """The settings of a task could not be planned: invalid for the type installed here, a
    `plan` that raised or returned no settings of its type; every problem names the task."""


def plan_workflow(workflow: Workflow, types: Mapping[str, TaskType]) -> Workflow:
    """The workflow with the settings of its tasks planned by their types (`TaskType.plan`).

    A task whose type is in `types` and has a `plan` gets the settings the plan returns for its
    decoded settings: the fields which were given or which the plan set (changed), as JSON, so
    the defaults stay with the plugin that validates the settings where the task runs. Every
    other task is kept as written, e.g. one of a type not installed here. The workflow given is
    not changed. Raises PlanError with a problem per task whose settings do not decode, whose
    plan raised (its error named) or returned anything but the settings of its type.
    """
    tasks: list[TaskSpec] = []
    problems: list[Problem] = []
    for task in workflow.tasks:
        task_type = types.get(task.type)
        if task_type is None or task_type.plan is None:
            tasks.append(task)
            continue
        try:
            settings = planned_settings(task_type, task.settings)
        except WorkflowError as error:
            problems.extend(problem.of_task(task.id) for problem in error.problems)
            continue
        tasks.append(msgspec.structs.replace(task, settings=settings))
    if problems:
        raise PlanError(problems)
    return msgspec.structs.replace(workflow, tasks=tasks)


def planned_settings(task_type: TaskType, given: dict[str, Any]) -> dict[str, Any]:
    """The settings `task_type.plan` makes of `given`: the fields given or changed by the plan,
    each as JSON by its name in the settings. WorkflowError (located below `settings`) for
    settings that do not decode, before or after the plan, or a plan that fails."""
    assert task_type.plan is not None
    field = "settings"
    try:
        before = task_type.decode_settings(given)
        settings = task_type.decode_settings(given)  # the plan may change it in place
    except WorkflowError as error:
        raise WorkflowError([problem.under(field) for problem in error.problems]) from None
    what = f"the plan of {task_type.name!r} ({task_type.plan})"
    try:
        planned = resolve(task_type.plan)(settings)
    except Exception as error:
        detail = str(error) if isinstance(error, PluginFailure) else _error_text(error)
        raise WorkflowError(Problem(f"{what} failed: {detail}", field=field)) from None
    if not isinstance(planned, task_type.settings):
        returned = type(planned).__name__
        message = f"{what} returned a {returned}, not the settings ({task_type.settings.__name__})"
        raise WorkflowError(Problem(message, field=field))
    names = zip(planned.__struct_fields__, planned.__struct_encode_fields__, strict=True)
    result = {
        encoded: msgspec.to_builtins(getattr(planned, name))
        for name, encoded in names
        if name in given or encoded in given or getattr(planned, name) != getattr(before, name)
    }
    try:
        task_type.decode_settings(result)
    except WorkflowError as error:
        problems = [problem.under(field) for problem in error.problems]
        raise WorkflowError(
            [msgspec.structs.replace(p, message=f"{what} set: {p.message}") for p in problems]
        ) from None
    return result


def _error_text(error: BaseException) -> str:
    """An error as `TypeName: message` (the name alone without a message)."""
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _loaded(entry: EntryPoint) -> TaskType:
    """The task type of an entry point; ValueError if it is none."""
    task_type = entry.load()
    if not isinstance(task_type, TaskType):
        raise ValueError(f"entry point {entry.name!r} ({entry.value}) is no TaskType")
    return task_type


@dataclasses.dataclass(frozen=True)
class TaskCheck:
    """A task of a known type that passed its own checks: its decoded settings and its units
    (None unsplit), what planning it needs."""

    spec: TaskSpec
    task_type: TaskType
    settings: msgspec.Struct
    units: int | None


def check_workflow(
    workflow: Workflow, types: dict[str, TaskType]
) -> tuple[list[TaskCheck], list[Problem]]:
    """Every problem of a workflow beyond its structure, and its tasks that passed their own
    checks (in file order).

    Checked are the types, the settings, the units of split tasks (at least 1, at most
    `MAX_UNITS`), the argv of `command` tasks with their actual input ports, the input ports of
    each task (a type without input ports takes none; `command` takes any), the output ports
    they read and what `command` cannot do (stage its inputs, take `resources`).
    """
    checked: list[TaskCheck] = []
    problems: list[Problem] = []
    for task in workflow.tasks:
        task_type = types.get(task.type)
        if task_type is None:
            known = ", ".join(sorted(types)) or "none"
            message = f"unknown task type {task.type!r} (known: {known})"
            problems.append(Problem(message, task=task.id, field="type"))
            continue
        found = _task_problems(task, task_type)
        problems.extend(problem.of_task(task.id) for problem in found[1])
        if found[0] is not None:
            checked.append(found[0])
        problems.extend(_port_problems(workflow, task, task_type, types))
    return checked, problems


def checkable_problems(data: object, types: Mapping[str, TaskType]) -> list[Problem]:
    """The problems of workflow data that does not decode beside its field problems (those of
    `decode_workflow`): the structural ones and those `check_workflow` finds in the tasks of
    the types in `types`, of its `checkable_workflow` (its wrong fields left out); none when
    that is no workflow. A task of another type is left unchecked: it may be a type of the
    run's snapshots, which only the checks of the whole submission know."""
    workflow = checkable_workflow(data)
    if workflow is None:
        return []
    known = [task for task in workflow.tasks if task.type in types]
    checked = msgspec.structs.replace(workflow, tasks=known)
    return [*structural_problems(workflow), *check_workflow(checked, dict(types))[1]]


def validate_workflow(workflow: Workflow, types: dict[str, TaskType]) -> list[Problem]:
    """The problems of a workflow beyond its structure (`check_workflow`)."""
    return check_workflow(workflow, types)[1]


def _task_problems(task: TaskSpec, task_type: TaskType) -> tuple[TaskCheck | None, list[Problem]]:
    """A task's settings decoded, its units counted and its argv checked; the problems are
    located in the task by the caller."""
    try:
        settings = task_type.decode_settings(task.settings)
    except WorkflowError as error:
        return None, [problem.under("settings") for problem in error.problems]
    problems: list[Problem] = []
    template = getattr(settings, "args", None) if task_type.name == "command" else None
    if task_type.name == "command" and isinstance(template, list):
        for index, message in template_problems(template, task.inputs):
            field = "settings.args" if index is None else f"settings.args[{index}]"
            problems.append(Problem(message, field=field))
    elif task_type.command is not None and not task_type.splittable:
        for index, message in template_problems(task_type.command, task.inputs):
            where = "" if index is None else f" (part {index})"
            problems.append(Problem(f"the command of {task_type.name!r}{where}: {message}"))
    try:
        units = task_type.units(settings)
    except Exception as error:
        detail = str(error)
        if not isinstance(error, PluginFailure):
            detail = f"{type(error).__name__}: {detail}"
        reason = f"counting its units failed: {detail}"
        return None, [*problems, Problem(reason, field="settings")]
    if units is not None and units < 1:
        problems.append(Problem(f"{units} units, at least 1 needed", field="settings"))
    elif units is not None and units > MAX_UNITS:
        message = f"{units:,} units, more than the {MAX_UNITS:,} a task may have (MAX_UNITS)"
        problems.append(Problem(message, field="settings"))
    if problems:
        return None, problems
    return TaskCheck(task, task_type, settings, units), []


def _port_problems(
    workflow: Workflow, task: TaskSpec, task_type: TaskType, types: dict[str, TaskType]
) -> list[Problem]:
    """The input ports a task names on its type, and the output ports it reads."""
    problems: list[Problem] = []
    is_command = task_type.name == "command"
    for port, ref in task.inputs.items():
        field = f"inputs.{field_name(port)}"
        if not is_command and port not in task_type.inputs:
            if task_type.inputs:
                ports = ", ".join(task_type.inputs)
                message = f"no input port of {task.type!r} (its input ports: {ports})"
            else:
                message = f"{task.type!r} has no input ports"
            problems.append(Problem(message, task=task.id, field=field))
        source_id, _, out_port = ref.partition(".")
        source = next((t for t in workflow.tasks if t.id == source_id), None)
        source_type = types.get(source.type) if source else None
        if (
            source_type is not None
            and source_type.name != "command"
            and out_port not in source_type.outputs
        ):
            ports = ", ".join(source_type.outputs)
            message = (
                f"reads {ref!r}, but {source_type.name!r} has no output port {out_port!r} "
                f"(its output ports: {ports})"
            )
            problems.append(Problem(message, task=task.id, field=field))
    if task.stage and is_command:
        message = "a 'command' task cannot stage its inputs"
        problems.append(Problem(message, task=task.id, field="stage"))
    if task.resources is not None and is_command:
        message = (
            "a 'command' task has the resources of its settings (cores, memory_gb, gpus, "
            "scratch_gb), not 'resources'"
        )
        problems.append(Problem(message, task=task.id, field="resources"))
    return problems
