"""The shapes that cross HTTP between the service and its clients, defined once."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

from simrun_core.fold import ProgressLine
from simrun_core.planner import TaskPlan
from simrun_core.provenance import SourceProvenance
from simrun_core.resources import ResolvedResources
from simrun_core.states import RunState, TaskState
from simrun_core.workflow import Priority, SplitMode, Workflow


class Identity(msgspec.Struct, frozen=True):
    """Who calls the service: a person, or an agent acting for a person (its owner).

    An identity is all of its parts: who may do what compares identities (`==`), never
    names, so an agent `root` acting for `someone` is not the person `root`."""

    name: str
    kind: Literal["person", "agent"]
    owner: str

    @classmethod
    def person(cls, name: str) -> Identity:
        """The person of a name (a person's owner is the person)."""
        return cls(name=name, kind="person", owner=name)

    @property
    def responsible(self) -> Identity:
        """The person responsible: the person itself, or the one an agent acts for."""
        return Identity.person(self.owner)


def submitter(submitted_by: str, owner: str, agent: str | None) -> Identity:
    """The identity that submitted a run, from what its `submitted` event records (and a
    `RunRecord`, `RunItem` or `RunView` repeats): the agent `agent` acting for `owner` when
    set, else the person `submitted_by`."""
    if agent is not None:
        return Identity(name=agent, kind="agent", owner=owner)
    return Identity(name=submitted_by, kind="person", owner=owner)


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


class LedgerCounts(msgspec.Struct, kw_only=True):
    """The units of a split task by the state of its ledger: `pending` (no worker holds
    them), `claimed` (held by a worker and not done: the claims of a worker that died count
    until they are released), `done` (as the run's log has them), and `total`."""

    pending: int
    claimed: int
    done: int
    total: int


class TaskProgressView(msgspec.Struct, kw_only=True):
    """The progress of a task: its state and, for a split task, its units done, the counts of
    its ledger (`counts`, None unsplit) and its first and last progress lines (`first`,
    `last`: the first and the last unit done, None before one is)."""

    state: TaskState
    units: int | None
    done: int
    first_done: datetime | None = None
    last_done: datetime | None = None
    message: str | None = None
    counts: LedgerCounts | None = None
    first: ProgressLine | None = None
    last: ProgressLine | None = None


class ProgressView(msgspec.Struct, kw_only=True):
    """The progress of every task of a run, by task id."""

    run: str
    state: RunState
    seq: int
    tasks: dict[str, TaskProgressView]


class PlanView(msgspec.Struct, kw_only=True):
    """What the plan of a task requests: its pods and the shape of each (cores, memory, worker
    processes, memory per process, the memory of a retry after a kill for memory), and where
    its resources come from (`source`: a plugin hint, past runs, the workflow) with the seconds
    of a unit and the runs they were learned from (`samples`)."""

    pods: int
    cores: int
    memory_gb: float
    processes: int
    per_worker_gb: float
    retry_memory_gb: float
    retry_per_worker_gb: float
    scratch_gb: float
    gpus: int
    source: str | None
    seconds_per_unit: float | None
    samples: int


class PodView(msgspec.Struct, kw_only=True):
    """A worker of a task (a pod; locally a process) at its last attempt: `state` (`pending`,
    `running`, `preempted`, `failed` or `succeeded`), its server, its exit, whether it was
    killed for memory, what its report measured (the peak memory and the memory limit it ran
    under, None before a report); `oom_kills` its attempts killed for memory; `gpus` its GPUs."""

    worker: str
    attempt: int
    state: str
    node: str | None
    exit_code: int | None
    oom: bool
    oom_kills: list[int]
    peak_memory_gb: float | None
    processes: int | None
    units_done: int
    memory_limit_gb: float | None = None
    gpus: list[str] | None = None
    """The GPUs it was given or reported, as `CUDA_VISIBLE_DEVICES` names them; None when
    unknown."""


class TaskView(msgspec.Struct, kw_only=True):
    """A task of a run: its type, state and message, the units of a split task (`units` None
    for a task without), what its plan requests and its workers."""

    type: str
    state: TaskState
    message: str | None
    units: int | None
    done: int
    first_done: datetime | None
    last_done: datetime | None
    plan: PlanView | None
    pods: list[PodView]


class RunView(msgspec.Struct, kw_only=True):
    """A run as its users see it (`GET /runs/{run}`), folded from its events up to `seq`: the
    workflow, who submitted it for whom, its sources, every task by id in workflow order, its
    progress (0..1, None once ended), the backend and its name for the run, the image."""

    id: str
    seq: int
    state: RunState
    workflow: Workflow
    submitted_by: str
    owner: str
    agent: str | None
    priority: Priority
    group: str | None
    sources: list[SourceProvenance]
    tasks: dict[str, TaskView]
    progress: float | None
    backend: str
    backend_name: str | None
    image: str | None
    reserve: str | None
    local_commands: str | None
    cancel_requested: str | None
    created: datetime
    built: datetime | None
    started: datetime | None
    finished: datetime | None
    message: str | None
    warnings: list[str] = msgspec.field(default_factory=list)
    """What is wrong with the run's log (events after its end: the log is damaged; its
    outcome is its first end's)."""

    @property
    def ended(self) -> bool:
        """Whether the run is over."""
        return self.state.ended


class OutputFile(msgspec.Struct):
    """A file of the output of a task, its path relative to the store
    (`runs/<run>/tasks/<task>/out/...`, `simrun_core.store.output_path`)."""

    path: str
    bytes: int


class OutputListing(msgspec.Struct):
    """The output files of a task as a listing shows them (`simrun_core.outputs`): the results
    first, those matching its glob, at most its limit; `left_out` counts the matching files
    beyond the limit."""

    files: list[OutputFile]
    left_out: int


class ErrorDetail(msgspec.Struct):
    """A refusal of the service: the status code and what was wrong."""

    status_code: int
    detail: str


class WorkflowRefusal(msgspec.Struct):
    """A refused workflow (422): every problem in `errors`, each `task 'ID': field: what is
    wrong` (`simrun_core.errors.Problem`), and the same one per line in `detail`."""

    status_code: int
    detail: str
    errors: list[str]


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


class CompareRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The runs to compare, one row each in this order."""

    runs: list[str]


class CompareTable(msgspec.Struct):
    """Runs side by side: `run`, `group`, `agent`, `state`, then per source
    `<source>.changed_files` and `<source>.diff_sha256`, then every key of every task's
    `out/summary.json` as `<task>.<key>`; each row has every column (None where missing)."""

    columns: list[str]
    rows: list[dict[str, Any]]


class CleanupRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Which ended runs a cleanup removes: ended at least `older_than_days` ago, of `group`,
    only failed ones; `dry_run` lists them and removes nothing."""

    older_than_days: Annotated[float, msgspec.Meta(ge=0)] = 30.0
    group: str | None = None
    failed_only: bool = False
    dry_run: bool = False


class CleanupResult(msgspec.Struct, kw_only=True):
    """What a cleanup or a deletion removed (or would), paths relative to the store."""

    runs: list[str]
    snapshots: list[str]
    bytes_freed: int
    dry_run: bool


class Usage(msgspec.Struct):
    """Bytes of the store per run and per group (`""` without a group); hard links count once."""

    runs: dict[str, int]
    groups: dict[str, int]


class PodUsage(msgspec.Struct, kw_only=True):
    """A pod (a local process) of a run on a server, with what it requests."""

    run_id: str | None
    task_id: str
    pod: str
    phase: str
    cores: float
    memory_gb: float
    gpus: int = 0


class ServerUsage(msgspec.Struct, kw_only=True):
    """A server with the cores, memory and GPUs the pods of runs may have, and the pods on it
    (what they use is the sum of what its pods request)."""

    name: str
    cores: float
    memory_gb: float
    gpus: int
    reserved_by: str | None
    pods: list[PodUsage]


class WorkerView(msgspec.Struct, kw_only=True):
    """A worker of a task, from its pod events and reports: where, how, how much it did."""

    worker: str
    node: str | None
    state: Literal["running", "done", "failed"]
    attempts: int
    processes: int | None
    units_done: int
    units_claimed: int
    peak_memory_gb: float | None
    memory_limit_gb: float | None
    oom_killed: bool
