"""The resources of a task: learned from the reports of its workers, the hint of its type, or the
override of the workflow. Pure functions; the observations are kept by `simrun_api.resources`.

An observation is the memory per worker process and the seconds of a unit in one process of one
report of a worker, keyed by the task type, the model and a variant (`ResourceKey`). A request
is resolved from the last `WINDOW` observations of its key that were not killed for memory: the
95th percentile (nearest rank) of their memory per worker times `MARGIN`, and at least
`RETRY_FACTOR` times the memory per worker of a pod killed for memory, until a later observation
of the key succeeded (its measurement then says what the key needs).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from datetime import datetime
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import msgspec

from simrun_core.plugins import ResourceHint, TaskType
from simrun_core.workflow import ResourceOverride, TaskSpec

if TYPE_CHECKING:
    from simrun_core.events import WorkerReport
    from simrun_core.planner import TaskPlan

WINDOW = 20
"""The observations of a key a request is learned from, the newest not killed for memory."""
PERCENTILE = 95
"""The percentile of the memory per worker of the window, by nearest rank."""
MARGIN = Fraction(11, 10)
"""The factor on the percentile of the measured memory per worker."""
RETRY_FACTOR = Fraction(3, 2)
MIN_LEARNED_PER_WORKER_GB = Fraction(1, 16)
"""Learned memory per worker is at least this (64 MiB): what a measurement below the base says is
that a process needs little, not nothing, and a limit of nothing would kill every process."""
"""The memory per worker of a retry after a kill for memory, as a factor of the killed pod's."""
GIB = 1024**3
LEARNED_FROM_RUNS = (
    "learned from N runs: the memory per process measured in N earlier runs of the same task "
    "type, model and cost setting"
)
"""What N of the source `learned from N runs` counts, as the commands and the web app say it."""


class ResolvedResources(msgspec.Struct, frozen=True):
    """The resources a task is planned with, and where its memory comes from.

    `seconds_per_unit` is the median seconds of a unit in one process (None without records),
    `samples` the number of memory observations the memory was learned from, `source` one of
    `learned from N runs` (`learned_from`; N counts runs, see `LEARNED_FROM_RUNS`),
    `plugin hint`, `default` (a type without a hint of its own),
    `override` (of the workflow) or `settings` (a `command` task). `workers` caps the processes
    of a pod; `cores_per_worker` are the cores of one process.
    """

    memory_base_gb: float
    memory_per_worker_gb: float
    scratch_gb: float = 0.0
    gpus: int = 0
    workers: int | None = None
    cores_per_worker: int = 1
    seconds_per_unit: float | None = None
    samples: int = 0
    source: str = "plugin hint"


class ResourceKey(msgspec.Struct, frozen=True):
    """What the observations of a task are grouped by: its type, the model (the name of the first
    source, empty without) and a variant (the value of the type's `cost_setting`, empty without).
    """

    task_type: str
    model: str
    variant: str = ""

    def text(self) -> str:
        """The key as stored: a JSON array of the three, e.g. `["demo.squares","m",""]`."""
        return msgspec.json.encode([self.task_type, self.model, self.variant]).decode()


class Observation(msgspec.Struct, frozen=True, kw_only=True):
    """What one report of a worker says about its key.

    `per_worker_gb` is the memory measured per process (for a pod killed for memory, `oom`, the
    memory per process it was limited to), None without a measurement; `seconds_per_unit` the
    mean seconds of its units in one process, None without units; `succeeded` whether the pod
    ended well; `time` the time of the report.
    """

    key: str
    run: str
    task: str
    worker: str
    attempt: int
    per_worker_gb: float | None
    seconds_per_unit: float | None
    oom: bool = False
    succeeded: bool = False
    time: datetime


def resource_key(
    task_type: TaskType, settings: Mapping[str, Any] | msgspec.Struct, model: str
) -> ResourceKey:
    """The key of the observations of a task, the one place it is derived.

    `settings` are the task's as submitted (or decoded). The variant is the value of the setting
    the type names `cost_setting` (a field name of its settings struct; its default when the
    task does not set it): text as is, other values as JSON (after decoding, so `2` and `2.0` of
    a float setting are one variant); empty for a type without one. ValueError when the type's
    `cost_setting` is no field of its settings.
    """
    name = task_type.cost_setting
    if not name:
        return ResourceKey(task_type.name, model)
    if name not in task_type.settings.__struct_fields__:
        raise ValueError(
            f"task type {task_type.name!r}: its cost_setting {name!r} is no setting of "
            f"{task_type.settings.__name__}"
        )
    if isinstance(settings, msgspec.Struct):
        decoded = settings
    else:
        decoded = msgspec.convert(dict(settings), task_type.settings, strict=False)
    value = getattr(decoded, name)
    if isinstance(value, str):
        variant = value
    else:
        variant = msgspec.json.encode(value, order="sorted").decode()
    return ResourceKey(task_type.name, model, variant)


def observation_from_report(
    key: ResourceKey | str,
    report: WorkerReport,
    base_gb: float,
    oom: bool = False,
    run: str = "",
    task: str | None = None,
    succeeded: bool | None = None,
) -> Observation:
    """The observation of a worker's report.

    The memory per worker is `(peak_memory_bytes / GiB - base_gb) / processes`, at least 0 (None
    without a peak); for a pod killed for memory (`oom`, as the caller judges the evidence: the
    backend's `OOMKilled`, the report's `oom_kills`) it is the memory per process the pod was
    limited to, `report.per_worker_gb`. The seconds of a unit are `unit_seconds / units_done`.
    `task` defaults to the report's; `succeeded` to a report that neither failed nor was killed.
    """
    processes = max(1, report.processes)
    per_worker: float | None
    if oom:
        per_worker = report.per_worker_gb
    elif report.peak_memory_bytes is None:
        per_worker = None
    else:
        measured = (Fraction(report.peak_memory_bytes, GIB) - _fraction(base_gb)) / processes
        per_worker = float(max(Fraction(0), measured))
    seconds = report.unit_seconds / report.units_done if report.units_done > 0 else None
    if succeeded is None:
        succeeded = not oom and not report.failed and report.exit_code in (None, 0)
    return Observation(
        key=key.text() if isinstance(key, ResourceKey) else key,
        run=run,
        task=report.task if task is None else task,
        worker=report.worker,
        attempt=report.attempt,
        per_worker_gb=per_worker,
        seconds_per_unit=seconds,
        oom=oom,
        succeeded=succeeded,
        time=report.time,
    )


def nearest_rank(values: Iterable[float], percent: int = PERCENTILE) -> float:
    """The `percent` percentile by nearest rank: the smallest value with at least `percent`% of
    the values at or below it (the 95th of 20 values is the second largest, of 19 or fewer the
    largest). ValueError without values.
    """
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values to take a percentile of")
    rank = max(1, math.ceil(Fraction(percent, 100) * len(ordered)))
    return ordered[rank - 1]


def resolve(
    task: TaskSpec,
    task_type: TaskType,
    settings: msgspec.Struct,
    observations: Iterable[Observation] = (),
    override: ResourceOverride | None = None,
) -> ResolvedResources:
    """The resources to plan a task with.

    A `command` task has the resources of its settings: one process of its cores and memory.
    Otherwise the memory per worker is learned from the observations of its key (in any order;
    ordered by time here): the nearest-rank 95th percentile of the last `WINDOW` observations
    not killed for memory times `MARGIN`, and at least `RETRY_FACTOR` times the memory per worker
    of every kill for memory no later observation of the key succeeded after; without either the
    type's hint. `seconds_per_unit` is the median over the window. The override (the task's
    `resources` by default) wins: memory per worker, workers, scratch and GPUs.
    """
    if task_type.name == "command":
        return _command(settings)
    hint = task_type.hint
    ordered = sorted(observations, key=lambda observation: observation.time)
    window = [observation for observation in ordered if not observation.oom][-WINDOW:]
    measured = [(o.run, o.per_worker_gb) for o in window if o.per_worker_gb is not None]
    seconds = [o.seconds_per_unit for o in window if o.seconds_per_unit is not None]
    per_worker = _fraction(hint.memory_per_worker_gb)
    source = "default" if hint == ResourceHint() else "plugin hint"
    runs: set[str] = set()
    if measured:
        per_worker = _fraction(nearest_rank(value for _, value in measured)) * MARGIN
        runs = {run for run, _ in measured}
    kills = _unresolved_kills(ordered)
    if kills:
        floor = max(_fraction(value) * RETRY_FACTOR for _, value in kills)
        if floor > per_worker:
            per_worker = floor
            runs |= {run for run, _ in kills}
    if runs:
        source = learned_from(len(runs))
        per_worker = max(MIN_LEARNED_PER_WORKER_GB, per_worker)
    resolved = ResolvedResources(
        memory_base_gb=hint.memory_base_gb,
        memory_per_worker_gb=float(per_worker),
        scratch_gb=hint.scratch_gb,
        gpus=hint.gpus,
        seconds_per_unit=statistics.median(seconds) if seconds else None,
        samples=len(measured),
        source=source,
    )
    override = override if override is not None else task.resources
    if override is None:
        return resolved
    if override.memory_per_worker_gb is not None:
        resolved = msgspec.structs.replace(
            resolved,
            memory_per_worker_gb=override.memory_per_worker_gb,
            samples=0,
            source="override",
        )
    return msgspec.structs.replace(
        resolved,
        workers=override.workers,
        scratch_gb=resolved.scratch_gb if override.scratch_gb is None else override.scratch_gb,
        gpus=resolved.gpus if override.gpus is None else override.gpus,
    )


def learned_from(runs: int) -> str:
    """The source of resources learned from the observations of `runs` runs of their key:
    `learned from N runs` (see `LEARNED_FROM_RUNS`)."""
    return f"learned from {runs} run{'' if runs == 1 else 's'}"


def is_learned(source: str) -> bool:
    """Whether a source of resources says they were learned (`learned from N runs`)."""
    return source.startswith("learned from ")


def resolve_resources(
    task: TaskSpec, task_type: TaskType, settings: msgspec.Struct
) -> ResolvedResources:
    """The resources of a task without observations: `resolve(task, task_type, settings)`."""
    return resolve(task, task_type, settings)


def expected_seconds(plan: TaskPlan, seconds_per_unit: float | None) -> float | None:
    """The expected seconds of a split task: `seconds_per_unit` times the rounds of its units
    over the processes of its pods, `ceil(units / (pods * processes))`; None for an unsplit task
    or without the seconds of a unit.
    """
    if seconds_per_unit is None or plan.units is None:
        return None
    rounds = math.ceil(Fraction(plan.units, plan.pods * plan.shape.processes))
    return float(_fraction(seconds_per_unit) * rounds)


def _unresolved_kills(ordered: list[Observation]) -> list[tuple[str, float]]:
    """The runs and memory per worker of the kills for memory no success of the key followed."""
    successes = [o.time for o in ordered if o.succeeded]
    last_success = max(successes) if successes else None
    return [
        (o.run, o.per_worker_gb)
        for o in ordered
        if o.oom
        and o.per_worker_gb is not None
        and (last_success is None or o.time >= last_success)
    ]


def _command(settings: Any) -> ResolvedResources:
    """A `command` task: one process of the cores and memory of its settings."""
    return ResolvedResources(
        memory_base_gb=0.0,
        memory_per_worker_gb=float(settings.memory_gb),
        scratch_gb=float(settings.scratch_gb),
        gpus=int(settings.gpus),
        workers=1,
        cores_per_worker=int(settings.cores),
        source="settings",
    )


def _fraction(value: float) -> Fraction:
    """The exact value of the decimal text of a float: `0.1` is 1/10."""
    return Fraction(str(value))
