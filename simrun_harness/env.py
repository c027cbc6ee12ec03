"""The configuration of the harness: the launch its backend set (`simrun_core.launch`, which
reads and checks every `SIMRUN_*` variable), and what the harness makes of it: the task type and
its settings, the locations, the timing, the cores, memory and processes of its cgroup.

Every error is a `ConfigurationError` (exit 4) whose message names the variable or file. The
functions take the environment (they read only the variables they need) or a whole `Launch`.

`SIMRUN_TASK_TYPE` is either a registered task type name (entry point group
`simrun.task_types`) or a `module:ATTRIBUTE` reference to a `TaskType` object, which lets a
plugin that is only on `PYTHONPATH` (a test, a working tree) run without being installed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar

import msgspec

from simrun_core import launch as contract
from simrun_core.errors import WorkflowError
from simrun_core.launch import (
    DEFAULT_MEMORY_SAMPLE_S,
    Launch,
    LaunchEnv,
    LaunchError,
    MemorySource,
)
from simrun_core.plugins import TaskPaths, TaskType, UnknownTaskType, load_task_type, resolve
from simrun_core.store import worker_log_name
from simrun_harness import cgroup
from simrun_harness.errors import ConfigurationError

GIB = 1024**3
MAX_POLL_S = 0.5

TaskKind = Literal["split", "command"]
Config = Mapping[str, str] | Launch
"""The environment of a harness process, or the launch read from it."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _configuration(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """`function` with a refused launch variable (LaunchError) as a ConfigurationError."""

    @functools.wraps(function)
    def refusing(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return function(*args, **kwargs)
        except LaunchError as error:
            raise ConfigurationError(str(error)) from None

    return refusing


def _read(config: Config) -> Launch | LaunchEnv:
    """A launch as it is, an environment as a view that reads a variable when asked."""
    return config if isinstance(config, Launch) else LaunchEnv(config)


@_configuration
def launch_from_env(env: Mapping[str, str], default_worker: str | None = None) -> Launch:
    """The whole launch of the environment, every variable checked (see `Launch.from_env`)."""
    return Launch.from_env(env, default_worker)


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
        return self.task_dir / "events" / worker_log_name(self.worker, self.attempt)


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
    harness kills it (`SIMRUN_MEMORY_PER_WORKER_GB` with `SIMRUN_MEMORY_SOURCE=process` and
    `SIMRUN_MEMORY_ENFORCED=1`); None when the kernel enforces the limit of a cgroup, when the
    limit only sizes the pool (the local backend), or no memory per process was given.
    """

    cores: int
    memory_limit_bytes: int | None
    base_gb: float
    per_worker_gb: float
    processes: int
    memory_source: MemorySource
    process_limit_bytes: int | None = None


# -- identity and paths -----------------------------------------------------------------------


@_configuration
def task_dir_from_env(env: Config) -> Path:
    """`SIMRUN_TASK_DIR`: an existing directory `<store>/runs/<run>/tasks/<task>`."""
    task_dir = Path(_read(env).task_dir)
    if not task_dir.is_dir():
        shown = env[contract.TASK_DIR] if isinstance(env, Mapping) else str(task_dir)
        raise ConfigurationError(f"{contract.TASK_DIR}: {shown!r} is not a directory")
    return task_dir


@_configuration
def identity_from_env(env: Config, default_worker: str | None = None) -> Identity:
    """The identity of a harness process: `SIMRUN_TASK_DIR`, `SIMRUN_WORKER` (else
    `default_worker`, else the task id), `SIMRUN_ATTEMPT` (0) and `SIMRUN_NODE` (the hostname).

    Read before the rest of the launch: an error of the rest is reported in its event log.
    """
    task_dir = task_dir_from_env(env)
    read = env if isinstance(env, Launch) else LaunchEnv(env, default_worker)
    return Identity(task_dir, task_dir.name, read.worker, read.attempt, read.node)


@_configuration
def paths_from_env(env: Config) -> TaskPaths:
    """The locations of a task: `SIMRUN_TASK_DIR`, `SIMRUN_INPUTS` and `SIMRUN_SCRATCH`.

    The store is `task_dir.parents[3]`, the run directory `task_dir.parents[1]`; a relative
    input path is relative to the store.
    """
    task_dir = task_dir_from_env(env)
    store = task_dir.parents[3]
    read = _read(env)
    return TaskPaths(
        store=store,
        run_dir=task_dir.parents[1],
        task_dir=task_dir,
        out=task_dir / "out",
        inputs={port: store / path for port, path in read.inputs.items()},
        scratch=Path(read.scratch),
    )


@_configuration
def staged_ports(env: Config, paths: TaskPaths | None = None) -> list[str]:
    """`SIMRUN_STAGE`: the input ports to copy into scratch, each one of `SIMRUN_INPUTS` (checked
    when read; `paths` is not needed for it)."""
    return list(_read(env).stage)


# -- the task ---------------------------------------------------------------------------------


@_configuration
def task_type_from_env(env: Config) -> TaskType:
    """`SIMRUN_TASK_TYPE`: a registered name, or a `module:ATTRIBUTE` reference to a TaskType.

    A name imports its own entry point only (`load_task_type`), not every registered type."""
    name = _read(env).task_type
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


def task_from_env(env: Config, kind: TaskKind | None = None) -> LoadedTask:
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


# -- timing ---------------------------------------------------------------------------------


@_configuration
def timing_from_env(env: Config) -> Timing:
    """`SIMRUN_GRACE_S` (60), `SIMRUN_HEARTBEAT_S` (30), `SIMRUN_STALE_S` (grace + 60),
    `SIMRUN_MEMORY_SAMPLE_S` (0.2)."""
    read = _read(env)
    return Timing(read.grace_s, read.heartbeat_s, read.stale_after_s, read.memory_sample_s)


# -- cores and memory -------------------------------------------------------------------------


@_configuration
def memory_source(env: Config) -> MemorySource:
    """`SIMRUN_MEMORY_SOURCE`: `cgroup` (the default) or `process` (the local backend)."""
    return _read(env).memory_source


def cgroup_root(env: Config) -> Path:
    """`SIMRUN_CGROUP_ROOT`: the mount of the cgroup v2 hierarchy, `/sys/fs/cgroup` by default
    (tests point it at a fixture tree)."""
    return Path(_read(env).cgroup_root)


def own_cgroup(env: Config) -> Path | None:
    """The directory of the harness's cgroup v2 below `cgroup_root`, None without one."""
    return cgroup.own_cgroup(cgroup_root(env))


def usage_cgroup(env: Config, source: MemorySource) -> Path | None:
    """The cgroup whose usage (memory, oom kills, CPU throttling) is the harness's own: its
    cgroup with `SIMRUN_MEMORY_SOURCE=cgroup`, None with `process` (a cgroup shared with the
    service) or without a cgroup v2."""
    return own_cgroup(env) if source == "cgroup" else None


@_configuration
def cores(env: Config) -> int:
    """The cores of the harness: its CPU affinity and cgroup quota, capped by `SIMRUN_CORES`."""
    available = len(os.sched_getaffinity(0))
    own = own_cgroup(env)
    quota = cgroup.cpu_quota(own) if own is not None else None
    if quota is not None:
        available = min(available, quota)
    cap = _read(env).cores
    if cap is not None:
        available = min(available, cap)
    return max(1, available)


@_configuration
def memory_limit(env: Config, source: MemorySource) -> int | None:
    """The memory limit in bytes: the cgroup's `memory.max` (source `cgroup`), else
    `SIMRUN_MEMORY_LIMIT_GB` (GiB); None without either.
    """
    if source == "cgroup":
        own = own_cgroup(env)
        limit = cgroup.memory_limit(own) if own is not None else None
        if limit is not None:
            return limit
    limit_gb = _read(env).memory_limit_gb
    return None if limit_gb is None else round(limit_gb * GIB)


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


@_configuration
def memory_per_worker_gb(env: Config, task_type: TaskType) -> float:
    """`SIMRUN_MEMORY_PER_WORKER_GB`, the memory per process in GiB; the type's hint by default."""
    per_worker_gb = _read(env).memory_per_worker_gb
    return task_type.hint.memory_per_worker_gb if per_worker_gb is None else per_worker_gb


@_configuration
def enforced_limit(env: Config, source: MemorySource, name: str) -> int | None:
    """The bytes of the memory variable `name` (`SIMRUN_MEMORY_LIMIT_GB` or
    `SIMRUN_MEMORY_PER_WORKER_GB`, GiB) the harness enforces itself: only when the backend
    declares the limit real (`SIMRUN_MEMORY_ENFORCED=1`: a pod, a Slurm job), only with
    `SIMRUN_MEMORY_SOURCE=process` (in a cgroup the kernel does) and only when it is set
    (and not 0). Locally the limit only sizes the pool: nothing kills above it (spec 06)."""
    read = _read(env)
    if source != "process" or not read.memory_enforced:
        return None
    if name == contract.MEMORY_LIMIT_GB:
        gb = read.memory_limit_gb
    elif name == contract.MEMORY_PER_WORKER_GB:
        gb = read.memory_per_worker_gb
    else:
        raise ValueError(f"{name} is no memory variable")
    if not gb:
        return None
    return round(gb * GIB) or None


@_configuration
def sizing_from_env(env: Config, task_type: TaskType) -> Sizing:
    """The sizing of a worker: cores, memory limit, `SIMRUN_MEMORY_BASE_GB` and
    `SIMRUN_MEMORY_PER_WORKER_GB` (defaults: the type's hint) and the processes they allow.
    """
    source = memory_source(env)
    core_count = cores(env)
    limit = memory_limit(env, source)
    base_gb = _read(env).memory_base_gb
    base_gb = task_type.hint.memory_base_gb if base_gb is None else base_gb
    per_worker_gb = memory_per_worker_gb(env, task_type)
    try:
        count = processes(core_count, limit, base_gb, per_worker_gb)
    except ValueError as error:
        raise ConfigurationError(
            f"SIMRUN_MEMORY_LIMIT_GB / SIMRUN_MEMORY_PER_WORKER_GB: {error}"
        ) from None
    process_limit = enforced_limit(env, source, contract.MEMORY_PER_WORKER_GB)
    return Sizing(core_count, limit, base_gb, per_worker_gb, count, source, process_limit)
