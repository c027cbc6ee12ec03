"""The configuration of the harness, read from the environment its backend sets.

Every error is a `ConfigurationError` (exit 4) whose message names the variable or file.

`SIMRUN_TASK_TYPE` is either a registered task type name (entry point group
`simrun.task_types`) or a `module:ATTRIBUTE` reference to a `TaskType` object, which lets a
plugin that is only on `PYTHONPATH` (a test, a working tree) run without being installed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from simrun_core.errors import WorkflowError
from simrun_core.plugins import TaskPaths, TaskType, UnknownTaskType, load_task_type, resolve
from simrun_harness import cgroup
from simrun_harness.errors import ConfigurationError
from simrun_harness.ledger import WORKER_ID
from simrun_harness.memory import MemorySource

GIB = 1024**3
DEFAULT_SCRATCH = "/scratch"
DEFAULT_GRACE_S = 60.0
DEFAULT_HEARTBEAT_S = 30.0
DEFAULT_MEMORY_SAMPLE_S = 0.2
STALE_BEYOND_GRACE_S = 60.0
MAX_POLL_S = 0.5

TaskKind = Literal["split", "command"]


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who writes: the task directory and id, the worker id, its attempt and node."""

    task_dir: Path
    task: str
    worker: str
    attempt: int
    node: str

    @property
    def events_path(self) -> Path:
        """The event log of this worker attempt, `<task_dir>/events/<worker>.<attempt>.jsonl`."""
        return self.task_dir / "events" / f"{self.worker}.{self.attempt}.jsonl"


@dataclasses.dataclass(frozen=True)
class LoadedTask:
    """A task as the harness runs it: its type, decoded settings and locations."""

    task_type: TaskType
    settings: msgspec.Struct
    paths: TaskPaths

    @property
    def settings_path(self) -> Path:
        """The settings file of the task, `<task_dir>/settings.json`."""
        return self.paths.task_dir / "settings.json"


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds: the grace after SIGTERM, between heartbeats, until a heartbeat is stale, and
    between two samples of the memory."""

    grace_s: float
    heartbeat_s: float
    stale_s: float
    memory_sample_s: float = DEFAULT_MEMORY_SAMPLE_S

    @property
    def poll_s(self) -> float:
        """Seconds between two looks of a waiting coordinator for stale claims."""
        return min(MAX_POLL_S, self.heartbeat_s)


@dataclasses.dataclass(frozen=True)
class Sizing:
    """The cores and memory of a worker and the processes of its pool they allow.

    `process_limit_bytes` is the anonymous memory a process of the pool may hold before the
    harness kills it (`SIMRUN_MEMORY_PER_WORKER_GB` with `SIMRUN_MEMORY_SOURCE=process`); None
    when the kernel enforces the limit of a cgroup, or no memory per process was given.
    """

    cores: int
    memory_limit_bytes: int | None
    base_gb: float
    per_worker_gb: float
    processes: int
    memory_source: MemorySource
    process_limit_bytes: int | None = None


# -- identity and paths -----------------------------------------------------------------------


def task_dir_from_env(env: Mapping[str, str]) -> Path:
    """`SIMRUN_TASK_DIR`: an existing directory `<store>/runs/<run>/tasks/<task>`."""
    value = _required(env, "SIMRUN_TASK_DIR")
    task_dir = Path(value).absolute()
    if len(task_dir.parents) < 4 or task_dir.parent.name != "tasks":
        raise ConfigurationError(
            f"SIMRUN_TASK_DIR: {value!r} is not of the form <store>/runs/<run>/tasks/<task>"
        )
    if task_dir.parents[2].name != "runs":
        raise ConfigurationError(
            f"SIMRUN_TASK_DIR: {value!r} is not of the form <store>/runs/<run>/tasks/<task>"
        )
    if not task_dir.is_dir():
        raise ConfigurationError(f"SIMRUN_TASK_DIR: {value!r} is not a directory")
    return task_dir


def identity_from_env(env: Mapping[str, str], default_worker: str | None = None) -> Identity:
    """The identity of a harness process: `SIMRUN_TASK_DIR`, `SIMRUN_WORKER` (else
    `default_worker`, else the task id), `SIMRUN_ATTEMPT` (0) and `SIMRUN_NODE` (the hostname).
    """
    task_dir = task_dir_from_env(env)
    worker = env.get("SIMRUN_WORKER") or default_worker or task_dir.name
    if not WORKER_ID.fullmatch(worker):
        raise ConfigurationError(
            f"SIMRUN_WORKER: {worker!r} is no valid worker id "
            "(letters, digits, '_', '.' and '-', starting with a letter or digit)"
        )
    attempt = _int(env, "SIMRUN_ATTEMPT", 0, minimum=0)
    node = env.get("SIMRUN_NODE") or socket.gethostname()
    return Identity(task_dir, task_dir.name, worker, attempt, node)


def paths_from_env(env: Mapping[str, str]) -> TaskPaths:
    """The locations of a task: `SIMRUN_TASK_DIR`, `SIMRUN_INPUTS` and `SIMRUN_SCRATCH`.

    The store is `task_dir.parents[3]`, the run directory `task_dir.parents[1]`; an input is a
    line `port=path`, a relative path relative to the store; the scratch directory defaults to
    `/scratch`.
    """
    task_dir = task_dir_from_env(env)
    store = task_dir.parents[3]
    inputs: dict[str, Path] = {}
    for number, line in enumerate(env.get("SIMRUN_INPUTS", "").splitlines(), start=1):
        if not line.strip():
            continue
        port, equals, path = line.strip().partition("=")
        if not equals or not port or not path:
            raise ConfigurationError(f"SIMRUN_INPUTS: line {number} {line!r} is not port=path")
        if port in inputs:
            raise ConfigurationError(f"SIMRUN_INPUTS: line {number}: port {port!r} given twice")
        inputs[port] = store / path
    scratch = Path(env.get("SIMRUN_SCRATCH") or DEFAULT_SCRATCH)
    return TaskPaths(
        store=store,
        run_dir=task_dir.parents[1],
        task_dir=task_dir,
        out=task_dir / "out",
        inputs=inputs,
        scratch=scratch,
    )


def staged_ports(env: Mapping[str, str], paths: TaskPaths) -> list[str]:
    """`SIMRUN_STAGE`: the input ports to copy into scratch, each one of `SIMRUN_INPUTS`."""
    ports = [line.strip() for line in env.get("SIMRUN_STAGE", "").splitlines() if line.strip()]
    for port in ports:
        if port not in paths.inputs:
            known = ", ".join(sorted(paths.inputs)) or "none"
            raise ConfigurationError(
                f"SIMRUN_STAGE: port {port!r} is no input of SIMRUN_INPUTS (inputs: {known})"
            )
    return ports


# -- the task ---------------------------------------------------------------------------------


def task_type_from_env(env: Mapping[str, str]) -> TaskType:
    """`SIMRUN_TASK_TYPE`: a registered name, or a `module:ATTRIBUTE` reference to a TaskType.

    A name imports its own entry point only (`load_task_type`), not every registered type."""
    name = _required(env, "SIMRUN_TASK_TYPE")
    if ":" in name:
        try:
            task_type = resolve(name)
        except (ImportError, AttributeError, ValueError) as error:
            raise ConfigurationError(f"SIMRUN_TASK_TYPE: cannot import {name!r}: {error}") from None
        if not isinstance(task_type, TaskType):
            raise ConfigurationError(f"SIMRUN_TASK_TYPE: {name!r} is no TaskType")
        return task_type
    try:
        return load_task_type(name)
    except UnknownTaskType as unknown:
        known = ", ".join(unknown.known) or "none"
        raise ConfigurationError(
            f"SIMRUN_TASK_TYPE: unknown task type {name!r} (known: {known})"
        ) from None
    except Exception as error:
        raise ConfigurationError(f"SIMRUN_TASK_TYPE: the task types do not load: {error}") from None


def settings_from_task_dir(task_type: TaskType, task_dir: Path) -> msgspec.Struct:
    """The settings of `<task_dir>/settings.json`, decoded with the type's settings struct."""
    path = task_dir / "settings.json"
    try:
        raw: Any = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigurationError(f"{path}: the settings file does not exist") from None
    except (OSError, ValueError) as error:
        raise ConfigurationError(f"{path}: cannot read the settings: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{path}: the settings are no JSON object")
    try:
        return task_type.decode_settings(raw)
    except WorkflowError as error:
        raise ConfigurationError(f"{path}: settings of {task_type.name!r}: {error}") from None


def task_from_env(env: Mapping[str, str], kind: TaskKind | None = None) -> LoadedTask:
    """The task type, its settings and its locations.

    `kind` requires a `split` type (for `simrun-worker`, `simrun-merge`) or one with a
    `command` (for `simrun-exec`), checked before the settings are read.
    """
    paths = paths_from_env(env)
    task_type = task_type_from_env(env)
    if kind == "split" and not task_type.splittable:
        raise ConfigurationError(
            f"SIMRUN_TASK_TYPE: {task_type.name!r} is not split into units "
            "(it needs count_units, compute_unit and merge; simrun-exec runs a command)"
        )
    if kind == "command" and not task_type.command:
        raise ConfigurationError(
            f"SIMRUN_TASK_TYPE: {task_type.name!r} has no command to run"
            + (" (it is split: simrun-worker runs it)" if task_type.splittable else "")
        )
    return LoadedTask(task_type, settings_from_task_dir(task_type, paths.task_dir), paths)


# -- roles and timing ---------------------------------------------------------------------------


def is_coordinator(env: Mapping[str, str]) -> bool:
    """`SIMRUN_ROLE`: `base` (the coordinator) or `extra` (the default)."""
    role = env.get("SIMRUN_ROLE") or "extra"
    if role not in ("base", "extra"):
        raise ConfigurationError(f"SIMRUN_ROLE: {role!r} is neither 'base' nor 'extra'")
    return role == "base"


def merges(env: Mapping[str, str]) -> bool:
    """`SIMRUN_MERGE`: `1` when the coordinator merges once the ledger is complete."""
    value = env.get("SIMRUN_MERGE") or "0"
    if value not in ("0", "1"):
        raise ConfigurationError(f"SIMRUN_MERGE: {value!r} is neither '0' nor '1'")
    return value == "1"


def timing_from_env(env: Mapping[str, str]) -> Timing:
    """`SIMRUN_GRACE_S` (60), `SIMRUN_HEARTBEAT_S` (30), `SIMRUN_STALE_S` (grace + 60),
    `SIMRUN_MEMORY_SAMPLE_S` (0.2)."""
    grace_s = _float(env, "SIMRUN_GRACE_S", DEFAULT_GRACE_S, minimum=0.0)
    heartbeat_s = _float(env, "SIMRUN_HEARTBEAT_S", DEFAULT_HEARTBEAT_S, minimum=0.0, strict=True)
    stale_s = _float(env, "SIMRUN_STALE_S", grace_s + STALE_BEYOND_GRACE_S, 0.0, strict=True)
    sample_s = _float(env, "SIMRUN_MEMORY_SAMPLE_S", DEFAULT_MEMORY_SAMPLE_S, 0.0, strict=True)
    return Timing(grace_s, heartbeat_s, stale_s, sample_s)


# -- cores and memory -------------------------------------------------------------------------


def memory_source(env: Mapping[str, str]) -> MemorySource:
    """`SIMRUN_MEMORY_SOURCE`: `cgroup` (the default) or `process` (the local backend)."""
    value = env.get("SIMRUN_MEMORY_SOURCE") or "cgroup"
    if value == "cgroup":
        return "cgroup"
    if value == "process":
        return "process"
    raise ConfigurationError(f"SIMRUN_MEMORY_SOURCE: {value!r} is neither 'cgroup' nor 'process'")


def cgroup_root(env: Mapping[str, str]) -> Path:
    """`SIMRUN_CGROUP_ROOT`: the mount of the cgroup v2 hierarchy, `/sys/fs/cgroup` by default
    (tests point it at a fixture tree)."""
    return Path(env.get("SIMRUN_CGROUP_ROOT") or cgroup.CGROUP_ROOT)


def own_cgroup(env: Mapping[str, str]) -> Path | None:
    """The directory of the harness's cgroup v2 below `cgroup_root`, None without one."""
    return cgroup.own_cgroup(cgroup_root(env))


def usage_cgroup(env: Mapping[str, str], source: MemorySource) -> Path | None:
    """The cgroup whose usage (memory, oom kills, CPU throttling) is the harness's own: its
    cgroup with `SIMRUN_MEMORY_SOURCE=cgroup`, None with `process` (a cgroup shared with the
    service) or without a cgroup v2."""
    return own_cgroup(env) if source == "cgroup" else None


def cores(env: Mapping[str, str]) -> int:
    """The cores of the harness: its CPU affinity and cgroup quota, capped by `SIMRUN_CORES`."""
    available = len(os.sched_getaffinity(0))
    own = own_cgroup(env)
    quota = cgroup.cpu_quota(own) if own is not None else None
    if quota is not None:
        available = min(available, quota)
    if "SIMRUN_CORES" in env:
        available = min(available, _int(env, "SIMRUN_CORES", 1, minimum=1))
    return max(1, available)


def memory_limit(env: Mapping[str, str], source: MemorySource) -> int | None:
    """The memory limit in bytes: the cgroup's `memory.max` (source `cgroup`), else
    `SIMRUN_MEMORY_LIMIT_GB` (GiB); None without either.
    """
    if source == "cgroup":
        own = own_cgroup(env)
        limit = cgroup.memory_limit(own) if own is not None else None
        if limit is not None:
            return limit
    if env.get("SIMRUN_MEMORY_LIMIT_GB"):
        return round(_float(env, "SIMRUN_MEMORY_LIMIT_GB", 0.0, 0.0, strict=True) * GIB)
    return None


def processes(cores: int, memory_bytes: int | None, base_gb: float, per_worker_gb: float) -> int:
    """The processes the cores and the memory allow: `min(cores, floor((memory - base) /
    per_worker))`, just `cores` without a limit or without a memory per process.

    Raises ValueError when not even one process fits into the memory.
    """
    if memory_bytes is None or per_worker_gb <= 0:
        return max(1, cores)
    room = (memory_bytes / GIB - base_gb) / per_worker_gb
    fitting = math.floor(room + 1e-6)
    if fitting < 1:
        raise ValueError(
            f"the memory limit of {memory_bytes / GIB:.3g} GiB leaves no room for one process "
            f"of {per_worker_gb:.3g} GiB beyond the base of {base_gb:.3g} GiB"
        )
    return max(1, min(cores, fitting))


def memory_per_worker_gb(env: Mapping[str, str], task_type: TaskType) -> float:
    """`SIMRUN_MEMORY_PER_WORKER_GB`, the memory per process in GiB; the type's hint by default."""
    return _float(env, "SIMRUN_MEMORY_PER_WORKER_GB", task_type.hint.memory_per_worker_gb, 0.0)


def enforced_limit(env: Mapping[str, str], source: MemorySource, name: str) -> int | None:
    """The bytes of the memory variable `name` (GiB) the harness enforces itself: only with
    `SIMRUN_MEMORY_SOURCE=process` (in a cgroup the kernel does) and only when it is set
    (and not 0)."""
    if source != "process" or not env.get(name):
        return None
    return round(_float(env, name, 0.0, 0.0) * GIB) or None


def sizing_from_env(env: Mapping[str, str], task_type: TaskType) -> Sizing:
    """The sizing of a worker: cores, memory limit, `SIMRUN_MEMORY_BASE_GB` and
    `SIMRUN_MEMORY_PER_WORKER_GB` (defaults: the type's hint) and the processes they allow.
    """
    source = memory_source(env)
    core_count = cores(env)
    limit = memory_limit(env, source)
    base_gb = _float(env, "SIMRUN_MEMORY_BASE_GB", task_type.hint.memory_base_gb, 0.0)
    per_worker_gb = memory_per_worker_gb(env, task_type)
    try:
        count = processes(core_count, limit, base_gb, per_worker_gb)
    except ValueError as error:
        raise ConfigurationError(
            f"SIMRUN_MEMORY_LIMIT_GB / SIMRUN_MEMORY_PER_WORKER_GB: {error}"
        ) from None
    process_limit = enforced_limit(env, source, "SIMRUN_MEMORY_PER_WORKER_GB")
    return Sizing(core_count, limit, base_gb, per_worker_gb, count, source, process_limit)


# -- parsing ----------------------------------------------------------------------------------


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise ConfigurationError(f"{name} is not set")
    return value


def _int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ConfigurationError(f"{name}: {value!r} is not an integer") from None
    if number < minimum:
        raise ConfigurationError(f"{name}: {value!r} is less than {minimum}")
    return number


def _float(
    env: Mapping[str, str], name: str, default: float, minimum: float, strict: bool = False
) -> float:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise ConfigurationError(f"{name}: {value!r} is not a number") from None
    if not math.isfinite(number) or number < minimum or (strict and number == minimum):
        bound = f"more than {minimum:g}" if strict else f"at least {minimum:g}"
        raise ConfigurationError(f"{name}: {value!r} is not a number of {bound}")
    return number
