"""The shapes that cross HTTP between the service and its clients, defined once."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

import msgspec

from simrun_core.planner import TaskPlan
from simrun_core.provenance import SourceProvenance
from simrun_core.resources import ResolvedResources
from simrun_core.states import RunState, TaskState
from simrun_core.workflow import Priority, SplitMode, Workflow


class Identity(msgspec.Struct, frozen=True):
    """Who calls the service: a person, or an agent acting for a person (its owner)."""

    name: str
    kind: Literal["person", "agent"]
    owner: str


class SubmitRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A submission of a workflow with the provenance of its sources, the model first."""

    workflow: Workflow
    sources: list[SourceProvenance] = msgspec.field(default_factory=list)
    group: str | None = None
    split: SplitMode | None = None
    reserve: str | None = None
    local_commands: Literal["direct", "docker"] | None = None


class ValidationResult(msgspec.Struct):
    """The errors of a workflow, none when valid."""

    ok: bool
    errors: list[str]


class RunItem(msgspec.Struct, kw_only=True):
    """A run in a list: its summary with owner, workflow name and progress (0..1, None ended)."""

    id: str
    state: RunState
    workflow: str
    group: str | None
    submitted_by: str
    owner: str
    agent: str | None
    priority: Priority
    tasks: dict[str, TaskState]
    created: datetime
    finished: datetime | None
    message: str | None
    seq: int
    progress: float | None = None


class TaskProgressView(msgspec.Struct, kw_only=True):
    """The progress of a task: its state and, for a split task, its units done."""

    state: TaskState
    units: int | None
    done: int
    first_done: datetime | None = None
    last_done: datetime | None = None
    message: str | None = None


class ProgressView(msgspec.Struct, kw_only=True):
    """The progress of every task of a run, by task id."""

    run: str
    state: RunState
    seq: int
    tasks: dict[str, TaskProgressView]


class OutputFile(msgspec.Struct):
    """A file of the output of a task, its path relative to the output directory."""

    path: str
    bytes: int


class ErrorDetail(msgspec.Struct):
    """A refusal of the service: the status code and what was wrong."""

    status_code: int
    detail: str


class LocalServiceInfo(msgspec.Struct, kw_only=True):
    """A running local service, as `.simrun/service.json` (mode 0600) names it."""

    instance: str
    pid: int
    port: int
    token: str
    url: str
    python: str = ""
    version: str = ""
    types: str = ""
    background: bool = False


class InstanceAnswer(msgspec.Struct):
    """The answer of `GET /local/instance`: the random instance of this start of the service."""

    instance: str


class TaskEstimate(msgspec.Struct, kw_only=True):
    """The resources of a task with their source, its plan and its expected seconds (None
    without learned seconds per unit)."""

    resources: ResolvedResources
    plan: TaskPlan
    seconds: float | None


class EstimateRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A submission to estimate: the workflow, its sources (the model first) and split mode."""

    workflow: Workflow
    sources: list[SourceProvenance] = msgspec.field(default_factory=list)
    split: SplitMode | None = None
    reserve: str | None = None
