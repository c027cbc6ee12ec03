"""The launch contract: everything a harness process (a pod, a local process) is started with.

A backend computes a `Launch` (`launch_for`) and turns it into a process (the local backend:
its environment is `os.environ | launch.to_env()`) or a pod template (the Argo backend); the
harness reads it back with `Launch.from_env`. The `SIMRUN_*` variables, their formats, their
defaults and the messages that refuse them are defined here once.

Imported by every harness process at its start: only the standard library, msgspec and light
core modules at import time.
"""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Final, Literal, TypeVar

import msgspec

from simrun_core.ledger_layout import WORKER_ID
from simrun_core.store_layout import PROVENANCE_FILE, RUNS, TASKS, output_path, task_path

if TYPE_CHECKING:
    from simrun_core.fold import RunRecord
    from simrun_core.planner import TaskPlan
    from simrun_core.plugins import TaskType
    from simrun_core.provenance import SourceProvenance

Entry = Literal["worker", "exec"]
"""The harness module a process runs, `python -m simrun_harness.<entry>`."""
Role = Literal["base", "extra"]
"""`base`: the coordinator of a split task (and the one pod of any other); `extra`: a helper."""
MemorySource = Literal["cgroup", "process"]
"""Where the harness reads its memory: its cgroup (a pod) or its process tree (local)."""
_T = TypeVar("_T")
_DIGITS: Final = re.compile(r"[0-9]+")

COORDINATOR: Final = "w0"
"""The worker id of a split task's coordinator."""

RUN: Final = "SIMRUN_RUN"
ENTRY: Final = "SIMRUN_ENTRY"
TASK_DIR: Final = "SIMRUN_TASK_DIR"
TASK_TYPE: Final = "SIMRUN_TASK_TYPE"
WORKER: Final = "SIMRUN_WORKER"
ATTEMPT: Final = "SIMRUN_ATTEMPT"
FIRST_ATTEMPTS: Final = "SIMRUN_FIRST_ATTEMPTS"
ROLE: Final = "SIMRUN_ROLE"
MERGE: Final = "SIMRUN_MERGE"
INPUTS: Final = "SIMRUN_INPUTS"
STAGE: Final = "SIMRUN_STAGE"
SCRATCH: Final = "SIMRUN_SCRATCH"
PROVENANCE: Final = "SIMRUN_PROVENANCE"
EDITABLE: Final = "SIMRUN_EDITABLE"
NODE: Final = "SIMRUN_NODE"
CORES: Final = "SIMRUN_CORES"
MEMORY_LIMIT_GB: Final = "SIMRUN_MEMORY_LIMIT_GB"
MEMORY_BASE_GB: Final = "SIMRUN_MEMORY_BASE_GB"
MEMORY_PER_WORKER_GB: Final = "SIMRUN_MEMORY_PER_WORKER_GB"
MEMORY_SOURCE: Final = "SIMRUN_MEMORY_SOURCE"
MEMORY_ENFORCED: Final = "SIMRUN_MEMORY_ENFORCED"
GRACE_S: Final = "SIMRUN_GRACE_S"
HEARTBEAT_S: Final = "SIMRUN_HEARTBEAT_S"
STALE_S: Final = "SIMRUN_STALE_S"
MEMORY_SAMPLE_S: Final = "SIMRUN_MEMORY_SAMPLE_S"
CGROUP_ROOT: Final = "SIMRUN_CGROUP_ROOT"
THREAD_VARIABLES: Final = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""Set to 1: the processes of a worker are its parallelism, not the threads of BLAS."""

DEFAULT_SCRATCH: Final = "/scratch"
DEFAULT_GRACE_S: Final = 60.0
DEFAULT_HEARTBEAT_S: Final = 30.0
DEFAULT_MEMORY_SAMPLE_S: Final = 0.2
DEFAULT_CGROUP_ROOT: Final = "/sys/fs/cgroup"
STALE_BEYOND_GRACE_S: Final = 60.0
"""A heartbeat is stale `grace_s` + this many seconds after it, unless `stale_s` says."""


class LaunchError(ValueError):
    """A launch variable that is missing or malformed; the message names the variable."""


class Launch(msgspec.Struct, frozen=True, kw_only=True):
    """What a harness process is started with (see the module). Paths are strings as the
    process sees them; `task_dir` is `<store>/runs/<run>/tasks/<task>`.

    None (and a default) means: the harness's default. `memory_base_gb` and
    `memory_per_worker_gb` default to the task type's hint, `stale_s` to `grace_s + 60`.
    """

    task_dir: str
    task_type: str
    """A registered task type name, or a `module:ATTRIBUTE` reference to a TaskType."""
    worker: str
    node: str
    entry: Entry | None = None
    """The harness module, None for a `command` task (its process is the user's argv)."""
    attempt: int = 0
    role: Role = "extra"
    merge: bool = False
    """Whether the coordinator merges the units once the ledger is complete."""
    inputs: dict[str, str] = msgspec.field(default_factory=dict)
    """The directory of each input port, relative to the store (or absolute)."""
    stage: tuple[str, ...] = ()
    """The input ports to copy into scratch before the work."""
    scratch: str = DEFAULT_SCRATCH
    provenance: str | None = None
    """The provenance file of the run's sources, passed on to the task's command."""
    editable: tuple[str, ...] = ()
    """The snapshots of the run's sources the harness installs as editable packages before
    its work (`SIMRUN_EDITABLE`, a line each; relative to the store, or absolute). Empty for a
    process whose environment has them installed already (the local backend's venv of a run)."""
    cores: int | None = None
    memory_limit_gb: float | None = None
    memory_base_gb: float | None = None
    memory_per_worker_gb: float | None = None
    memory_source: MemorySource = "cgroup"
    memory_enforced: bool = False
    """Whether `memory_limit_gb` is a limit the process must keep (a pod's, a Slurm job's):
    where no kernel enforces it (`memory_source` `process`), the harness kills a process above
    it. False (locally, spec 06): the limit only sizes the pool, and nothing kills a process
    above its share."""
    grace_s: float = DEFAULT_GRACE_S
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    stale_s: float | None = None
    memory_sample_s: float = DEFAULT_MEMORY_SAMPLE_S
    cgroup_root: str = DEFAULT_CGROUP_ROOT

    def __post_init__(self) -> None:
        _check_task_dir(self.task_dir)
        _check_worker(self.worker)

    @property
    def task(self) -> str:
        """The task id, the name of the task directory."""
        return PurePath(self.task_dir).name

    @property
    def run(self) -> str:
        """The run id, from the task directory."""
        return PurePath(self.task_dir).parents[1].name

    @property
    def store(self) -> str:
        """The store the task directory is in."""
        return str(PurePath(self.task_dir).parents[3])

    @property
    def stale_after_s(self) -> float:
        """Seconds until a heartbeat is stale: `stale_s`, else `grace_s + 60`."""
        return _stale_after(self.stale_s, self.grace_s)

    def to_env(self) -> dict[str, str]:
        """The environment variables of the launch (and the thread caps); an optional value
        left at its default is not written, so an inherited one stays in effect."""
        env = {
            RUN: self.run,
            TASK_DIR: self.task_dir,
            TASK_TYPE: self.task_type,
            INPUTS: "\n".join(f"{port}={path}" for port, path in self.inputs.items()),
            STAGE: "\n".join(self.stage),
            SCRATCH: self.scratch,
            WORKER: self.worker,
            ATTEMPT: str(self.attempt),
            ROLE: self.role,
            MERGE: "1" if self.merge else "0",
            NODE: self.node,
            MEMORY_SOURCE: self.memory_source,
            MEMORY_ENFORCED: "1" if self.memory_enforced else "0",
            GRACE_S: _number(self.grace_s),
        }
        optional: dict[str, str | None] = {
            ENTRY: self.entry,
            PROVENANCE: self.provenance,
            EDITABLE: "\n".join(self.editable) or None,
            CORES: None if self.cores is None else str(self.cores),
            MEMORY_LIMIT_GB: _optional_number(self.memory_limit_gb),
            MEMORY_BASE_GB: _optional_number(self.memory_base_gb),
            MEMORY_PER_WORKER_GB: _optional_number(self.memory_per_worker_gb),
            HEARTBEAT_S: _unless(self.heartbeat_s, DEFAULT_HEARTBEAT_S),
            STALE_S: _optional_number(self.stale_s),
            MEMORY_SAMPLE_S: _unless(self.memory_sample_s, DEFAULT_MEMORY_SAMPLE_S),
            CGROUP_ROOT: None if self.cgroup_root == DEFAULT_CGROUP_ROOT else self.cgroup_root,
        }
        env.update({name: value for name, value in optional.items() if value is not None})
        env.update(dict.fromkeys(THREAD_VARIABLES, "1"))
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str], default_worker: str | None = None) -> Launch:
        """The launch of an environment, with the defaults of the harness (the worker:
        `default_worker`, else the task id; the node: the hostname). Raises LaunchError naming
        the first variable that is missing or malformed."""
        return LaunchEnv(env, default_worker).launch()


class LaunchEnv:
    """The launch variables of an environment, each read and checked when asked.

    For a harness that needs a few before the whole (its identity first, so that it has a log
    to report the errors of the rest in) and for tests of one variable; `launch()` reads all.
    Every property raises LaunchError naming its variable.
    """

    def __init__(self, env: Mapping[str, str], default_worker: str | None = None) -> None:
        self.env = env
        self.default_worker = default_worker

    def launch(self) -> Launch:
        """The whole launch, read in this order: the identity, then the rest."""
        return Launch(
            task_dir=self.task_dir,
            worker=self.worker,
            attempt=self.attempt,
            node=self.node,
            task_type=self.task_type,
            entry=self.entry,
            role=self.role,
            merge=self.merge,
            inputs=self.inputs,
            stage=self.stage,
            scratch=self.scratch,
            provenance=self.provenance,
            editable=self.editable,
            cores=self.cores,
            memory_limit_gb=self.memory_limit_gb,
            memory_base_gb=self.memory_base_gb,
            memory_per_worker_gb=self.memory_per_worker_gb,
            memory_source=self.memory_source,
            memory_enforced=self.memory_enforced,
            grace_s=self.grace_s,
            heartbeat_s=self.heartbeat_s,
            stale_s=self.stale_s,
            memory_sample_s=self.memory_sample_s,
            cgroup_root=self.cgroup_root,
        )

    # -- identity and paths -------------------------------------------------------------------

    @property
    def task_dir(self) -> str:
        """`SIMRUN_TASK_DIR`, made absolute: `<store>/runs/<run>/tasks/<task>`."""
        task_dir = str(Path(_required(self.env, TASK_DIR)).absolute())
        _check_task_dir(task_dir, self.env[TASK_DIR])
        return task_dir

    @property
    def worker(self) -> str:
        """`SIMRUN_WORKER`, else the default worker, else the task id."""
        worker = self.env.get(WORKER) or self.default_worker or PurePath(self.task_dir).name
        _check_worker(worker)
        return worker

    @property
    def attempt(self) -> int:
        """`SIMRUN_ATTEMPT` (0 by default), plus the worker's first attempt of
        `SIMRUN_FIRST_ATTEMPTS` where a template counts the attempts from 0 (Argo's
        `{{retries}}`)."""
        counted = _int(self.env, ATTEMPT, minimum=0) or 0
        first = self.first_attempts
        return counted + first.get(self.worker, 0) if first else counted

    @property
    def first_attempts(self) -> dict[str, int]:
        """`SIMRUN_FIRST_ATTEMPTS`: a line `worker=N` per worker whose first attempt is N; a
        worker not named starts at 0 (`first_attempts_text`)."""
        first: dict[str, int] = {}
        for number, line in enumerate(self.env.get(FIRST_ATTEMPTS, "").splitlines(), start=1):
            if not line.strip():
                continue
            worker, equals, attempt = line.strip().partition("=")
            if not equals or not WORKER_ID.fullmatch(worker) or not _DIGITS.fullmatch(attempt):
                raise LaunchError(
                    f"{FIRST_ATTEMPTS}: line {number} {line!r} is not worker=N "
                    "(a worker id and an attempt of at least 0)"
                )
            if worker in first:
                raise LaunchError(f"{FIRST_ATTEMPTS}: line {number}: worker {worker!r} given twice")
            first[worker] = int(attempt)
        return first

    @property
    def node(self) -> str:
        """`SIMRUN_NODE`, the hostname by default."""
        return self.env.get(NODE) or socket.gethostname()

    @property
    def task_type(self) -> str:
        """`SIMRUN_TASK_TYPE`, required."""
        return _required(self.env, TASK_TYPE)

    @property
    def entry(self) -> Entry | None:
        """`SIMRUN_ENTRY`: `worker`, `exec`, or None when unset."""
        return _choice(self.env, ENTRY, {"worker": "worker", "exec": "exec"}, None)

    @property
    def inputs(self) -> dict[str, str]:
        """`SIMRUN_INPUTS`: a line `port=path` per input port; blank lines are none."""
        inputs: dict[str, str] = {}
        for number, line in enumerate(self.env.get(INPUTS, "").splitlines(), start=1):
            if not line.strip():
                continue
            port, equals, path = line.strip().partition("=")
            if not equals or not port or not path:
                raise LaunchError(f"{INPUTS}: line {number} {line!r} is not port=path")
            if port in inputs:
                raise LaunchError(f"{INPUTS}: line {number}: port {port!r} given twice")
            inputs[port] = path
        return inputs

    @property
    def stage(self) -> tuple[str, ...]:
        """`SIMRUN_STAGE`: a line per input port to stage, each one of `SIMRUN_INPUTS`."""
        lines = self.env.get(STAGE, "").splitlines()
        ports = tuple(line.strip() for line in lines if line.strip())
        inputs = self.inputs if ports else {}
        for port in ports:
            if port not in inputs:
                known = ", ".join(sorted(inputs)) or "none"
                raise LaunchError(
                    f"{STAGE}: port {port!r} is no input of {INPUTS} (inputs: {known})"
                )
        return ports

    @property
    def scratch(self) -> str:
        """`SIMRUN_SCRATCH`, `/scratch` by default."""
        return self.env.get(SCRATCH) or DEFAULT_SCRATCH

    @property
    def provenance(self) -> str | None:
        """`SIMRUN_PROVENANCE`, None when unset."""
        return self.env.get(PROVENANCE) or None

    @property
    def editable(self) -> tuple[str, ...]:
        """`SIMRUN_EDITABLE`: a line per snapshot to install, blank lines none; none unset."""
        lines = self.env.get(EDITABLE, "").splitlines()
        return tuple(line.strip() for line in lines if line.strip())

    # -- roles ----------------------------------------------------------------------------------

    @property
    def role(self) -> Role:
        """`SIMRUN_ROLE`: `base` (the coordinator) or `extra` (the default)."""
        return _choice(self.env, ROLE, {"base": "base", "extra": "extra"}, "extra")

    @property
    def merge(self) -> bool:
        """`SIMRUN_MERGE`: `1` when the coordinator merges, `0` (the default) when not."""
        return _choice(self.env, MERGE, {"0": False, "1": True}, False)

    # -- cores and memory -----------------------------------------------------------------------

    @property
    def cores(self) -> int | None:
        """`SIMRUN_CORES`, the most cores to use; None when unset."""
        return _int(self.env, CORES, minimum=1)

    @property
    def memory_limit_gb(self) -> float | None:
        """`SIMRUN_MEMORY_LIMIT_GB`, more than 0; None when unset."""
        return _float(self.env, MEMORY_LIMIT_GB, minimum=0.0, strict=True)

    @property
    def memory_base_gb(self) -> float | None:
        """`SIMRUN_MEMORY_BASE_GB`, at least 0; None (the type's hint) when unset."""
        return _float(self.env, MEMORY_BASE_GB, minimum=0.0)

    @property
    def memory_per_worker_gb(self) -> float | None:
        """`SIMRUN_MEMORY_PER_WORKER_GB`, at least 0; None (the type's hint) when unset."""
        return _float(self.env, MEMORY_PER_WORKER_GB, minimum=0.0)

    @property
    def memory_source(self) -> MemorySource:
        """`SIMRUN_MEMORY_SOURCE`: `cgroup` (the default) or `process` (the local backend)."""
        choices: dict[str, MemorySource] = {"cgroup": "cgroup", "process": "process"}
        return _choice(self.env, MEMORY_SOURCE, choices, "cgroup")

    @property
    def memory_enforced(self) -> bool:
        """`SIMRUN_MEMORY_ENFORCED`: `1` when the memory limit is one to keep (a pod, a Slurm
        job), `0` (the default) when it only sizes the pool (the local backend)."""
        return _choice(self.env, MEMORY_ENFORCED, {"0": False, "1": True}, False)

    # -- timing -------------------------------------------------------------------------------

    @property
    def grace_s(self) -> float:
        """`SIMRUN_GRACE_S`, the seconds between SIGTERM and SIGKILL, 60 by default."""
        value = _float(self.env, GRACE_S, minimum=0.0)
        return DEFAULT_GRACE_S if value is None else value

    @property
    def heartbeat_s(self) -> float:
        """`SIMRUN_HEARTBEAT_S`, the seconds between two heartbeats, 30 by default."""
        value = _float(self.env, HEARTBEAT_S, minimum=0.0, strict=True)
        return DEFAULT_HEARTBEAT_S if value is None else value

    @property
    def stale_s(self) -> float | None:
        """`SIMRUN_STALE_S`, the seconds until a heartbeat is stale; None (grace + 60) unset."""
        return _float(self.env, STALE_S, minimum=0.0, strict=True)

    @property
    def stale_after_s(self) -> float:
        """Seconds until a heartbeat is stale: `SIMRUN_STALE_S`, else grace + 60."""
        return _stale_after(self.stale_s, self.grace_s)

    @property
    def memory_sample_s(self) -> float:
        """`SIMRUN_MEMORY_SAMPLE_S`, the seconds between two samples of the memory, 0.2."""
        value = _float(self.env, MEMORY_SAMPLE_S, minimum=0.0, strict=True)
        return DEFAULT_MEMORY_SAMPLE_S if value is None else value

    @property
    def cgroup_root(self) -> str:
        """`SIMRUN_CGROUP_ROOT`, the mount of the cgroup v2 hierarchy (a fixture in tests)."""
        return self.env.get(CGROUP_ROOT) or DEFAULT_CGROUP_ROOT


# -- what a backend launches ----------------------------------------------------------------


def harness_entry(task_type: TaskType) -> Entry | None:
    """The harness module the tasks of a type run in: `worker` for a split type, `exec` for a
    plugin type with a command; None for `command`, which runs the user's argv itself."""
    if task_type.splittable:
        return "worker"
    if task_type.name != "command" and task_type.command:
        return "exec"
    return None


def first_attempts_text(first: Mapping[str, int]) -> str:
    """The value of `SIMRUN_FIRST_ATTEMPTS`: a line `worker=N` per worker whose attempts do not
    start at 0, in the order of the workers; "" when none (the variable is then left out).

    A pod template that numbers its attempts from 0 (Argo's `{{retries}}` in `SIMRUN_ATTEMPT`)
    carries it when its workers ran before (a Workflow created again): the attempt a harness
    reads is then its worker's first attempt plus the template's count, so it never takes the
    number of an attempt the run had already (and whose harness log exists).
    """
    lines = []
    for worker, attempt in sorted(first.items()):
        _check_worker(worker)
        if attempt < 0:
            raise ValueError(f"worker {worker!r}: a first attempt of {attempt} is less than 0")
        if attempt:
            lines.append(f"{worker}={attempt}")
    return "\n".join(lines)


def editable_snapshots(record: RunRecord, store: str | PurePath) -> tuple[str, ...]:
    """The snapshots of a run's sources as a process sees them below `store`, in the order of
    the sources; the sources only recorded (no snapshot) have none. Pure."""
    return snapshot_paths(record.sources, store)


def snapshot_paths(sources: Iterable[SourceProvenance], store: str | PurePath) -> tuple[str, ...]:
    """The snapshots of sources below `store`, in their order (`editable_snapshots`). Pure."""
    return tuple(str(PurePath(store) / source.snapshot) for source in sources if source.snapshot)


def input_dirs(run_id: str, inputs: Mapping[str, str]) -> dict[str, str]:
    """The directory of each input port (`port: "<task>.<port>"`) relative to the store,
    `runs/<run>/tasks/<task>/out/<port>`."""
    dirs = {}
    for port, ref in inputs.items():
        source, _, out_port = ref.partition(".")
        dirs[port] = output_path(run_id, source, out_port)
    return dirs


def launch_for(
    record: RunRecord,
    task_id: str,
    worker: str,
    attempt: int,
    *,
    task_type: TaskType,
    store: str | PurePath,
    scratch: str | PurePath,
    node: str,
    cores: int,
    grace_s: float,
    memory_source: MemorySource,
    memory_enforced: bool,
    retry_memory: bool,
    editable: tuple[str, ...] = (),
) -> Launch:
    """The launch of a worker attempt of a planned task. Pure.

    `store` is the store and `scratch` the scratch directory of the attempt as the process sees
    them. The memory limit and the memory per process are the plan's, or its retry memory after
    a kill for memory (`retry_memory`); the base is the resolved one, else the type's hint.
    `memory_enforced` says whether the backend gives the process that memory as a limit to keep
    (a pod, a Slurm job) or only to size its pool (this machine). A split task's `COORDINATOR`
    is the `base` role and merges (unless the plan merges elsewhere), its other workers are
    `extra`; an unsplit task's one pod is `base`. `editable` are the snapshots the harness
    installs before its work (`editable_snapshots`, for a backend whose pods install them; none
    by default). Raises KeyError for a task without a plan, WorkflowError for an unknown task.
    """
    task = record.workflow.task(task_id)
    plan = record.plans[task_id]
    shape = plan.shape
    resolved = record.resources.get(task_id)
    base_gb = resolved.memory_base_gb if resolved else task_type.hint.memory_base_gb
    role: Role = "extra" if plan.units is not None and worker != COORDINATOR else "base"
    task_dir = PurePath(store) / task_path(record.id, task_id)
    return Launch(
        task_dir=str(task_dir),
        task_type=task_type.name,
        worker=worker,
        node=node,
        entry=harness_entry(task_type),
        attempt=attempt,
        role=role,
        merge=role == "base" and plan.coordinator_merges,
        inputs=input_dirs(record.id, task.inputs),
        stage=tuple(task.stage),
        scratch=str(scratch),
        provenance=str(task_dir / PROVENANCE_FILE),
        editable=editable,
        cores=cores,
        memory_limit_gb=float(shape.retry_memory_gb if retry_memory else shape.memory_gb),
        memory_base_gb=float(base_gb),
        memory_per_worker_gb=shape.retry_per_worker_gb if retry_memory else shape.per_worker_gb,
        memory_source=memory_source,
        memory_enforced=memory_enforced,
        grace_s=grace_s,
    )


# -- reading and writing values ---------------------------------------------------------------


def _check_task_dir(task_dir: str, given: str | None = None) -> None:
    path = PurePath(task_dir)
    parents = path.parents
    if len(parents) < 4 or path.parent.name != TASKS or parents[2].name != RUNS:
        shown = task_dir if given is None else given
        raise LaunchError(
            f"{TASK_DIR}: {shown!r} is not of the form <store>/runs/<run>/tasks/<task>"
        )


def _check_worker(worker: str) -> None:
    if not WORKER_ID.fullmatch(worker):
        raise LaunchError(
            f"{WORKER}: {worker!r} is no valid worker id "
            "(letters, digits, '_', '.' and '-', starting with a letter or digit)"
        )


def _stale_after(stale_s: float | None, grace_s: float) -> float:
    return grace_s + STALE_BEYOND_GRACE_S if stale_s is None else stale_s


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise LaunchError(f"{name} is not set")
    return value


def _choice(env: Mapping[str, str], name: str, choices: Mapping[str, _T], default: _T) -> _T:
    value = env.get(name)
    if not value:
        return default
    if value not in choices:
        first, second = (repr(choice) for choice in choices)
        raise LaunchError(f"{name}: {value!r} is neither {first} nor {second}")
    return choices[value]


def _int(env: Mapping[str, str], name: str, minimum: int) -> int | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise LaunchError(f"{name}: {value!r} is not an integer") from None
    if number < minimum:
        raise LaunchError(f"{name}: {value!r} is less than {minimum}")
    return number


def _float(env: Mapping[str, str], name: str, minimum: float, strict: bool = False) -> float | None:
    value = env.get(name)
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except ValueError:
        raise LaunchError(f"{name}: {value!r} is not a number") from None
    if not math.isfinite(number) or number < minimum or (strict and number == minimum):
        bound = f"more than {minimum:g}" if strict else f"at least {minimum:g}"
        raise LaunchError(f"{name}: {value!r} is not a number of {bound}")
    return number


def _number(value: float) -> str:
    """A number as a variable holds it: `8` for a whole one, else the shortest exact form."""
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _optional_number(value: float | None) -> str | None:
    return None if value is None else _number(value)


def _unless(value: float, default: float) -> str | None:
    return None if value == default else _number(value)


def main_worker(plan: TaskPlan) -> str:
    """The worker that ends a task: the coordinator of a split task, else the task id."""
    return COORDINATOR if plan.units is not None else plan.task_id
