"""The workflow model: tasks, the references between them and their order."""

from __future__ import annotations

import enum
import heapq
import re
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from simrun_core.errors import Problem, WorkflowError, field_name, validation_problem

if TYPE_CHECKING:
    import yaml

TASK_ID = re.compile(r"[a-z][a-z0-9-]*")
TASK_ID_MAX_CHARS = 63
"""The longest task id, a DNS label's: an id names the directory of its task in the store and
the files and jobs of its workers (a longer one passed the check and failed on the store)."""


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
        """The tasks in topological order, stable in file order (of the tasks whose inputs are
        done, the first in the file comes next); WorkflowError on a cycle. Linear in the tasks
        and inputs, but for the log of a heap: a workflow may have thousands of tasks."""
        remaining = {task.id: task for task in self.tasks}
        ids = list(remaining)
        position = {task_id: index for index, task_id in enumerate(ids)}
        waits_for = {
            task_id: {dep for dep in task.dependencies() if dep in remaining}
            for task_id, task in remaining.items()
        }
        readers: dict[str, list[str]] = {}
        for task_id, deps in waits_for.items():
            for dep in deps:
                readers.setdefault(dep, []).append(task_id)
        ready = [position[task_id] for task_id, deps in waits_for.items() if not deps]
        heapq.heapify(ready)
        ordered: list[TaskSpec] = []
        while ready:
            task_id = ids[heapq.heappop(ready)]
            ordered.append(remaining.pop(task_id))
            for reader in readers.get(task_id, ()):
                waits_for[reader].discard(task_id)
                if not waits_for[reader]:
                    heapq.heappush(ready, position[reader])
        if remaining:
            cycle = _cycle(_in_cycles(remaining))
            raise WorkflowError(f"the inputs of tasks {cycle} form a cycle")
        return ordered


def _in_cycles(remaining: dict[str, TaskSpec]) -> list[TaskSpec]:
    """The tasks left after removing, again and again, those no remaining task reads from."""
    reads = {
        task_id: [dep for dep in task.dependencies() if dep in remaining]
        for task_id, task in remaining.items()
    }
    read_by = dict.fromkeys(remaining, 0)
    for deps in reads.values():
        for dep in deps:
            read_by[dep] += 1
    unread = [task_id for task_id, count in read_by.items() if count == 0]
    removed: set[str] = set()
    while unread:
        task_id = unread.pop()
        removed.add(task_id)
        for dep in reads[task_id]:
            read_by[dep] -= 1
            if read_by[dep] == 0:
                unread.append(dep)
    return [task for task_id, task in remaining.items() if task_id not in removed]


def _cycle(tasks: Iterable[TaskSpec]) -> str:
    return ", ".join(repr(task.id) for task in tasks)


def structural_problems(workflow: Workflow) -> list[Problem]:
    """The problems of a workflow that need no task type: ids, references, stage and order."""
    problems: list[Problem] = []
    if not workflow.tasks:
        problems.append(Problem("a workflow needs at least one task", field="tasks"))
    seen: set[str] = set()
    for task in workflow.tasks:
        if not TASK_ID.fullmatch(task.id):
            problems.append(Problem("must match [a-z][a-z0-9-]*", task=task.id, field="id"))
        if len(task.id) > TASK_ID_MAX_CHARS:
            problems.append(
                Problem(
                    f"{len(task.id)} characters, at most {TASK_ID_MAX_CHARS}",
                    task=task.id,
                    field="id",
                )
            )
        if task.id in seen:
            problems.append(Problem("used twice", task=task.id, field="id"))
        seen.add(task.id)
    ids = {task.id for task in workflow.tasks}
    for task in workflow.tasks:
        for port, ref in task.inputs.items():
            source, dot, out = ref.partition(".")
            field = f"inputs.{field_name(port)}"
            if not dot or not source or not out:
                message = f"{ref!r} is not of the form '<task>.<port>'"
            elif source not in ids:
                message = f"names unknown task {source!r}"
            elif source == task.id:
                message = "reads the task itself"
            else:
                continue
            problems.append(Problem(message, task=task.id, field=field))
        for port in task.stage:
            if port not in task.inputs:
                problems.append(
                    Problem(f"names {port!r}, which is no input", task.id, field="stage")
                )
    if not problems:
        try:
            workflow.order()
        except WorkflowError as error:
            problems.extend(error.problems)
    return problems


MAX_NESTING = 64
"""The deepest a workflow may nest its mappings and sequences (a file of 64 levels is no
workflow anyone writes; far deeper ones would exhaust the recursion of the YAML loader)."""
MAX_VALUES = 1_000_000
"""The values a workflow may hold, every alias of YAML counted as the copy it stands for."""


def parse_workflow(text: str | bytes, source: str | None = None) -> Workflow:
    """A workflow from YAML text (bytes must be UTF-8), structurally valid.

    WorkflowError lists every problem, each with `source` (the file) in front: text that is
    not UTF-8 or not YAML, nesting deeper than `MAX_NESTING`, more than `MAX_VALUES` values,
    fields of the wrong type, unknown or missing, and the problems of `structural_problems`.
    """
    return workflow_from_data(workflow_data(text, source), source)


def workflow_data(text: str | bytes, source: str | None = None) -> object:
    """The decoded YAML of a workflow's text (bytes must be UTF-8), not yet checked as one;
    WorkflowError (`source` in front) for text that is not UTF-8 or not YAML, or nests deeper
    than `MAX_NESTING`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            byte = error.object[error.start]
            message = f"not UTF-8 text: byte 0x{byte:02x} at offset {error.start}"
            raise WorkflowError(message, source) from None
    import yaml  # here, not at the top: most imports of this module read no YAML

    try:
        _check_nesting(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise WorkflowError(_yaml_problem(error, text), source) from None
    except WorkflowError as error:
        raise error.naming(source) if source else error from None
    except RecursionError:  # a guard: `_check_nesting` keeps the loader's recursion short
        message = f"not a workflow: nested deeper than {MAX_NESTING} levels"
        raise WorkflowError(message, source) from None
    return data


def workflow_from_data(data: object, source: str | None = None) -> Workflow:
    """A workflow from decoded YAML or JSON, structurally valid; WorkflowError listing every
    problem (see `decode_workflow`) otherwise."""
    workflow, problems = decode_workflow(data)
    if workflow is None or problems:
        raise WorkflowError(problems, source)
    return workflow


def decode_workflow(data: object) -> tuple[Workflow | None, list[Problem]]:
    """The workflow of decoded data and every problem of it, None when it does not decode.

    Every field of every task is checked, so a refusal lists them all, not the first; the
    structural problems are those of a workflow that decoded.
    """
    shape = data_problem(data)
    if shape is not None:
        return None, [shape]
    if not isinstance(data, dict):
        return None, [Problem("a workflow is a mapping with 'name' and 'tasks'")]
    problems = struct_problems(data, Workflow, skip=("tasks",))
    tasks = data.get("tasks")
    if "tasks" not in data:
        problems.append(Problem("missing, it is required", field="tasks"))
    elif not isinstance(tasks, list):
        problems.append(Problem(f"expected a sequence of tasks, got {_kind(tasks)}", field="tasks"))
    else:
        for index, entry in enumerate(tasks):
            if not isinstance(entry, dict):
                message = f"a task is a mapping with 'id' and 'type', got {_kind(entry)}"
                problems.append(Problem(message, index=index))
                continue
            task_id = entry.get("id") if isinstance(entry.get("id"), str) else None
            problems.extend(p.of_task(task_id, index) for p in struct_problems(entry, TaskSpec))
    if problems:
        return None, problems
    try:
        workflow = msgspec.convert(data, Workflow, strict=True)
    except msgspec.ValidationError as error:  # a guard: the fields were checked one by one
        return None, [validation_problem(error)]
    return workflow, structural_problems(workflow)


CHECKED_TASK_FIELDS = ("id", "type", "settings", "inputs")
"""The fields of a task the checks of its type read: without them it cannot be checked."""


def checkable_workflow(data: object) -> Workflow | None:
    """The workflow of decoded data that does not decode, with each wrong field left out (at
    its default), so the checks that need its tasks' types can still find their problems
    beside the field problems of `decode_workflow`: a wrong setting is named together with a
    wrong field of `resources`. None when that is no workflow to check: data of the wrong
    shape, or a task whose `CHECKED_TASK_FIELDS` are missing or wrong.
    """
    if data_problem(data) is not None or not isinstance(data, dict):
        return None
    tasks = data.get("tasks")
    if not isinstance(tasks, list):
        return None
    entries: list[dict[str, Any]] = []
    for entry in tasks:
        if not isinstance(entry, dict):
            return None
        wrong = _wrong_fields(entry, TaskSpec)
        if wrong.intersection(CHECKED_TASK_FIELDS):
            return None
        entries.append(_without(entry, TaskSpec, wrong))
    top = _without(data, Workflow, _wrong_fields(data, Workflow, skip=("tasks",)) | {"tasks"})
    top.setdefault("name", "")
    try:
        return msgspec.convert({**top, "tasks": entries}, Workflow, strict=True)
    except msgspec.ValidationError:  # a guard: every field kept decoded on its own
        return None


def _wrong_fields(
    data: dict[Any, Any], model: type[msgspec.Struct], skip: tuple[str, ...] = ()
) -> set[str]:
    """The fields of a mapping as a `model` with a problem of their own or inside them: wrong,
    or missing though required (`struct_problems`)."""
    problems = struct_problems(data, model, skip=skip)
    return {(problem.field or "").split(".")[0].split("[")[0] for problem in problems}


def _without(data: dict[Any, Any], model: type[msgspec.Struct], wrong: set[str]) -> dict[str, Any]:
    """The fields of a mapping that are fields of `model` and not `wrong`."""
    names = {field.encode_name for field in msgspec.structs.fields(model)}
    return {key: value for key, value in data.items() if key in names and key not in wrong}


def struct_problems(
    data: dict[Any, Any], model: type[msgspec.Struct], skip: tuple[str, ...] = ()
) -> list[Problem]:
    """The problems of a mapping as a struct: every unknown, missing or invalid field (those of
    a nested struct one by one too), each field named as written."""
    fields = {field.encode_name: field for field in msgspec.structs.fields(model)}
    problems = [
        Problem("unknown field", field=field_name(key)) for key in data if key not in fields
    ]
    for name, field in fields.items():
        if name in skip:
            continue
        if name not in data:
            if field.required:
                problems.append(Problem("missing, it is required", field=name))
            continue
        value = data[name]
        nested = _struct_of(field.type)
        if nested is not None and isinstance(value, dict):
            problems.extend(problem.under(name) for problem in struct_problems(value, nested))
        elif typing.get_origin(field.type) is dict and isinstance(value, dict):
            key_type, value_type = typing.get_args(field.type)
            for key, item in value.items():
                for is_key, checked, of in ((True, key, key_type), (False, item, value_type)):
                    try:
                        msgspec.convert(checked, of, strict=True)
                    except msgspec.ValidationError as error:
                        problem = validation_problem(error).under(f"{name}.{field_name(key)}")
                        problems.append(problem.key() if is_key else problem)
        else:
            try:
                msgspec.convert(value, field.type, strict=True)
            except msgspec.ValidationError as error:
                problems.append(validation_problem(error).under(name))
    return problems


def _struct_of(annotation: Any) -> type[msgspec.Struct] | None:
    """The struct a field holds (`X` or `X | None`), None for any other type."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


def _kind(value: object) -> str:
    """What a value of YAML or JSON is, in the words of a workflow's author."""
    if value is None:
        return "nothing (null)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a sequence"
    return f"{type(value).__name__} {value!r}"[:80]


def data_problem(data: object) -> Problem | None:
    """A problem of the size of decoded data: nesting deeper than `MAX_NESTING`, more than
    `MAX_VALUES` values (a shared value counted at each place it appears, as the aliases of
    YAML make it), or a value inside itself (a recursive alias). Iterative, so data of any
    depth is measured without recursion; None when the data is fine."""
    heights: dict[int, int] = {}
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[object, bool]] = [(data, False)]
    while stack:
        node, closing = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        key = id(node)
        children = list(node.values()) if isinstance(node, dict) else node
        if closing:
            open_.discard(key)
            inner = [child for child in children if isinstance(child, (dict, list))]
            heights[key] = 1 + max((heights[id(child)] for child in inner), default=0)
            sizes[key] = 1 + len(children) - len(inner) + sum(sizes[id(c)] for c in inner)
            if heights[key] > MAX_NESTING:
                return Problem(f"not a workflow: nested deeper than {MAX_NESTING} levels")
            if sizes[key] > MAX_VALUES:
                message = f"not a workflow: more than {MAX_VALUES:,} values"
                return Problem(f"{message} (an alias of YAML counts as the values it repeats)")
            continue
        if key in heights:
            continue
        if key in open_:
            return Problem("not a workflow: a value contains itself (a recursive alias)")
        open_.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children)
    return None


def _check_nesting(text: str) -> None:
    """WorkflowError for YAML text nested deeper than `MAX_NESTING`, found from the events of
    the parser (iterative), before the loader's recursion meets it."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                mark = event.start_mark
                where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
                message = f"not a workflow: nested deeper than {MAX_NESTING} levels"
                raise WorkflowError(Problem(message, field=where))
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _yaml_problem(error: yaml.YAMLError, text: str) -> Problem:
    """The problem of a YAML error at its line and column, without the name of the stream the
    parser gives (`<unicode string>`)."""
    import yaml

    if isinstance(error, yaml.reader.ReaderError):
        lines = text[: error.position].split("\n")
        where = f"line {len(lines)}, column {len(lines[-1]) + 1}"
        character = error.character if isinstance(error.character, int) else ord(error.character)
        message = f"not valid YAML: the character #x{character:04x} is not allowed"
        return Problem(message, field=where)
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        what = f"{error.problem or error.context or 'not valid'}"
        if error.context and error.problem:
            what = f"{error.problem} ({error.context})"
        place = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        return Problem(f"not valid YAML: {what}", field=place)
    message = re.sub(r'\s*in "<[^>]*>".*', "", str(error), flags=re.S)
    return Problem(f"not valid YAML: {message}")


def load_workflow(path: Path) -> Workflow:
    """Read a workflow from a YAML file; WorkflowError naming the file with every problem."""
    return workflow_from_data(load_workflow_data(path), str(path))


def load_workflow_data(path: Path) -> object:
    """The decoded YAML of a workflow file (`workflow_data`); WorkflowError naming the file
    when it cannot be read or is no YAML."""
    try:
        text = Path(path).read_bytes()
    except OSError as error:
        raise WorkflowError(f"cannot be read: {error.strerror}", str(path)) from None
    return workflow_data(text, str(path))


def workflow_yaml(workflow: Workflow) -> str:
    """The compact YAML of a workflow: `name`, `tasks` and the fields that differ from defaults.

    WorkflowError when the workflow is larger than a workflow file may be (`data_problem`): its
    YAML would be refused when read back, and writing it could exhaust the recursion."""
    import yaml

    class IndentedDumper(yaml.SafeDumper):
        """Indents a sequence below its key, as the workflows of the docs are written."""

        def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
            super().increase_indent(flow, False)

    data = msgspec.to_builtins(workflow)
    problem = data_problem(data)
    if problem is not None:
        raise WorkflowError([problem])
    return yaml.dump(data, Dumper=IndentedDumper, sort_keys=False, default_flow_style=False)


def dump_workflow(workflow: Workflow, path: Path) -> None:
    """Write a workflow as a YAML file."""
    Path(path).write_text(workflow_yaml(workflow))
