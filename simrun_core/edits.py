"""The task-type catalogue of the Editor and the shapes of its edit sessions, defined once.

An edit session joins three parties through the service: `simrun edit` on the machine of the
working trees (it reads and writes the workflow file, snapshots the trees and submits), the
service (it keeps the session under `edits/<id>/` of the store and passes requests on) and the
browser (it edits a draft of the workflow and asks for saves and runs). The command opens the
session (`OpenEdit`), sends what it read from disk when it changed (`EditState`), long-polls
the requests of the browser (`EditRequest`) and answers each (`EditResult`); the browser sees
the session as `EditSession` and asks with `EditAsk`.

A file is named by its `version`, the sha256 of its bytes (None while it does not exist): a
save names the version its draft started from (`base`), and the command refuses it when the
file on disk has another one (`conflict`, with what is on disk now), unless it is `force`d.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any, Literal

import msgspec

from simrun_core.plugins import TaskType
from simrun_core.provenance import SourceProvenance
from simrun_core.workflow import Workflow

CONNECTED_S = 30.0
"""A session is connected while its command asked the service within this many seconds."""
ASK_WAIT_S = 60.0
"""How long a save or a run of the browser waits for the answer of the command."""


class HintView(msgspec.Struct, kw_only=True):
    """The default resources of a task type: base memory, memory per worker, scratch, GPUs."""

    memory_base_gb: float
    memory_per_worker_gb: float
    scratch_gb: float
    gpus: int


class TaskTypeView(msgspec.Struct, kw_only=True):
    """A task type for the Editor: its ports, how it runs, its default resources, what it does
    and the JSON Schema of its settings (`settings_schema`: the settings struct's own schema,
    the structs it refers to under `$defs`; a field the type's `plan` sets is `readOnly`, as the
    plugin marks it with `msgspec.Meta(extra_json_schema={"readOnly": True})`)."""

    name: str
    description: str
    settings_schema: dict[str, Any]
    inputs: list[str]
    outputs: list[str]
    splittable: bool
    uses_cores: bool
    has_plan: bool
    cost_setting: str | None
    hint: HintView


def settings_schema(model: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON Schema of a settings struct, self-contained: the struct's object schema with the
    structs and enums it refers to under `$defs` (`#/$defs/<name>`)."""
    (reference,), components = msgspec.json.schema_components(
        [model], ref_template="#/$defs/{name}"
    )
    name = str(reference["$ref"]).rsplit("/", 1)[-1]
    schema = dict(components.pop(name))
    if components:
        schema["$defs"] = components
    return schema


def task_type_view(task_type: TaskType) -> TaskTypeView:
    """The catalogue entry of a task type."""
    hint = task_type.hint
    return TaskTypeView(
        name=task_type.name,
        description=task_type.description,
        settings_schema=settings_schema(task_type.settings),
        inputs=list(task_type.inputs),
        outputs=list(task_type.outputs),
        splittable=task_type.splittable,
        uses_cores=task_type.uses_cores,
        has_plan=task_type.plan is not None,
        cost_setting=task_type.cost_setting,
        hint=HintView(
            memory_base_gb=hint.memory_base_gb,
            memory_per_worker_gb=hint.memory_per_worker_gb,
            scratch_gb=hint.scratch_gb,
            gpus=hint.gpus,
        ),
    )


def catalogue(types: dict[str, TaskType]) -> list[TaskTypeView]:
    """The catalogue of task types, by name."""
    return [task_type_view(types[name]) for name in sorted(types)]


def file_version(text: str | bytes | None) -> str | None:
    """The version of a file's content: the sha256 of its bytes, None for no file."""
    if text is None:
        return None
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


class TreeState(msgspec.Struct, kw_only=True):
    """The git state of the working tree of a source as the command read it: its path, branch
    (None detached), commit (None before the first) and the uncommitted files (`git status`)."""

    name: str
    path: str
    branch: str | None = None
    commit: str | None = None
    changed: list[str] = msgspec.field(default_factory=list)
    error: str | None = None


class DiskState(msgspec.Struct, kw_only=True):
    """The workflow file as read from disk: its version (None: no file), the workflow it holds
    (None when it is none: not YAML, fields of the wrong type) and its problems as a workflow
    (`task 'ID': field: what is wrong`), e.g. a task that reads an unknown one."""

    version: str | None
    workflow: Workflow | None
    problems: list[str] = msgspec.field(default_factory=list)


class OpenEdit(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The opening of an edit session by `simrun edit`: the absolute path of the file on its
    machine, the machine's name, the file as read, the snapshots of the sources (the model
    first), the state of their trees, and the group of the runs that name none."""

    path: str
    machine: str
    disk: DiskState
    sources: list[SourceProvenance] = msgspec.field(default_factory=list)
    trees: list[TreeState] = msgspec.field(default_factory=list)
    group: str | None = None


class EditState(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the command read from disk: the file and the trees; the new snapshots of the sources
    after a run took them (None: as before). Sent when it changed, and as a sign of life."""

    disk: DiskState
    trees: list[TreeState] = msgspec.field(default_factory=list)
    sources: list[SourceProvenance] | None = None


class EditSession(msgspec.Struct, kw_only=True):
    """An edit session as the browser sees it: the file (`path` on `machine`, its `file` name
    and `directory`), who opened it, what is on disk, the snapshots and trees of the sources,
    the group of its runs, when it was opened, last seen and closed, and whether its command is
    connected (it asked within `CONNECTED_S`, and the session is not closed)."""

    id: str
    path: str
    file: str
    directory: str
    machine: str
    opened_by: str
    disk: DiskState
    sources: list[SourceProvenance]
    trees: list[TreeState]
    group: str | None
    created: datetime
    seen: datetime
    closed: datetime | None
    connected: bool


class EditSessionSummary(msgspec.Struct, kw_only=True):
    """An edit session as `GET /edits` lists it: what `EditSession` says of it but what it
    holds (the name of the workflow on disk, None when there is none, instead of the file's
    content, trees and snapshots)."""

    id: str
    path: str
    file: str
    directory: str
    machine: str
    opened_by: str
    workflow: str | None
    created: datetime
    seen: datetime
    closed: datetime | None
    connected: bool


EditKind = Literal["save", "run"]


class EditAsk(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A save or a run the browser asks of the command of a session: the draft, for a save the
    version of the file it started from (`base`) and whether to write it over a file that
    changed since (`force`), for a run its group (None: the session's)."""

    kind: EditKind
    workflow: Workflow
    base: str | None = None
    force: bool = False
    group: str | None = None


class EditRequest(msgspec.Struct, kw_only=True):
    """A request of the browser as the command gets it: its id (the command carries a request
    out once, also when it sees it again), what is asked, by whom and when."""

    id: str
    kind: EditKind
    workflow: Workflow
    base: str | None
    force: bool
    group: str | None
    asked_by: str
    asked: datetime


EditOutcome = Literal["saved", "conflict", "submitted", "refused", "failed"]


class EditResult(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The answer of the command to a request: `saved` (with the file as written), `conflict`
    (the file changed on disk since `base`: what is on disk now, nothing written), `submitted`
    (the `run`), `refused` (the service refused the workflow: `errors`, each `task 'ID': field:
    what is wrong`) or `failed` (`message` says why, e.g. a source that cannot be read)."""

    outcome: EditOutcome
    message: str = ""
    disk: DiskState | None = None
    run: str | None = None
    errors: list[str] = msgspec.field(default_factory=list)


class WorkflowText(msgspec.Struct, kw_only=True):
    """A workflow as the YAML text `simrun` writes (the fields that differ from the defaults)."""

    text: str
