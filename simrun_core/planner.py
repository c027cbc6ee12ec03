"""The planner: the shape of a worker pod and the number of pieces of a task. Pure functions.

Memory is sized in exact fractions of the decimal text of the floats given (`Fraction(str(x))`),
so `0.6 + 2 * 1.2` is 3 GiB and not 3.0000000000000004 rounded up to 4.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import msgspec

from simrun_core.errors import Problem
from simrun_core.plugins import TaskType
from simrun_core.resources import RETRY_FACTOR, ResolvedResources
from simrun_core.workflow import Priority, SplitMode, TaskSpec

MAX_PIECES = 8
POD_START_S = 10.0

PRIORITY_VALUES: dict[Priority, tuple[int, int]] = {
    Priority.OWNER: (1000, 900),
    Priority.STANDARD: (500, 400),
    Priority.AGENT: (200, 100),
}
"""The values of the base and the extra priority class of each priority."""


class PlanError(ValueError):
    """A task which cannot be planned on the nodes: `task 'ID': reason` once the task is known.

    `resources` names what is short or invalid in the words of the planner (`cores`,
    `memory_per_worker_gb`, ...); `plan_task` turns them into the fields the user wrote
    (`field`, e.g. `settings.memory_gb`, see `user_field`), else keeps the planner's name of an
    invalid value as its field.
    """

    def __init__(
        self,
        reason: str,
        resources: tuple[str, ...] = (),
        task: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(Problem(reason, task=task, field=field).text())
        self.reason = reason
        self.resources = resources
        self.task = task
        self.field = field

    def problem(self) -> Problem:
        """The refusal of the task in the one shape of `simrun_core.errors`."""
        return Problem(self.reason, task=self.task, field=self.field)


class Node(msgspec.Struct, frozen=True):
    """A node a worker pod can run on.

    `cores` and `memory_gb` are what a worker pod of a run can have there, what the planner plans
    with; `gpus` the GPUs a pod can have there (whatever the backend: Kubernetes' allocatable
    `nvidia.com/gpu`, Slurm's `Gres=gpu:N`, locally the GPUs the service may use);
    `reserved_by` is the run holding the node, None if free; `allocatable_*` are what the
    scheduler gives the pods of the runs, as it counts their requests (None when unknown).
    """

    name: str
    cores: int
    memory_gb: float
    gpus: int = 0
    reserved_by: str | None = None
    allocatable_cores: float | None = None
    allocatable_memory_gb: float | None = None


class PodShape(msgspec.Struct, frozen=True):
    """The resources of a worker pod: cores, whole GiB, processes and memory per process."""

    cores: int
    memory_gb: int
    processes: int
    per_worker_gb: float
    retry_memory_gb: int
    retry_per_worker_gb: float
    scratch_gb: float = 0.0
    gpus: int = 0


class TaskPlan(msgspec.Struct, frozen=True):
    """The plan of a task: its pods, their shape and priorities, its units (None unsplit)."""

    task_id: str
    pods: int
    shape: PodShape
    base_priority: str
    extra_priority: str
    units: int | None
    coordinator_merges: bool = True


def priority_classes(priority: Priority) -> tuple[str, str]:
    """The names of the base and the extra priority class of a priority."""
    return f"simrun-{priority}-base", f"simrun-{priority}-extra"


def priority_class_values() -> dict[str, int]:
    """Every priority class by name with its value, e.g. `simrun-owner-base: 1000`.

    Each is a Kueue `WorkloadPriorityClass` and a Kubernetes `PriorityClass` of that name and
    value; the base class goes to the coordinator and unsplit pods, the extra one to the others.
    """
    values: dict[str, int] = {}
    for priority, (base, extra) in PRIORITY_VALUES.items():
        base_class, extra_class = priority_classes(priority)
        values[base_class] = base
        values[extra_class] = extra
    return values


def usable_nodes(
    nodes: list[Node], run_id: str | None = None, reserve: str | None = None
) -> list[Node]:
    """The nodes the pods of a run may use: the free ones and those the run reserved itself.

    With `reserve`, only that node (the pods of the run select it); PlanError when it does not
    exist or another run holds it.
    """
    if reserve is not None:
        node = next((node for node in nodes if node.name == reserve), None)
        if node is None:
            known = ", ".join(sorted(node.name for node in nodes)) or "none"
            raise PlanError(f"node {reserve!r} to reserve does not exist (nodes: {known})")
        if node.reserved_by is not None and node.reserved_by != run_id:
            raise PlanError(f"node {reserve!r} is reserved by run {node.reserved_by!r}")
        return [node]
    return [
        node
        for node in nodes
        if node.reserved_by is None or (run_id is not None and node.reserved_by == run_id)
    ]


def shape(
    resources: ResolvedResources,
    nodes: list[Node],
    max_processes: int | None = None,
    *,
    run_id: str | None = None,
) -> PodShape:
    """Size a pod for the most common usable node, else for the largest one one worker fits.

    A node reserved by another run than `run_id` is left out, and so is a node with fewer GPUs
    than the pod asks (the GPUs are the pod's, whatever its processes). The pod takes the
    processes its node allows by cores and memory (whole GiB: a node of 23.5 GiB holds pods of
    23 GiB), at most `max_processes` and the `workers` of the resources. PlanError when no node
    has the GPUs, or one worker fits on no node.
    """
    _check(resources)
    usable = usable_nodes(nodes, run_id)
    if not usable:
        raise PlanError("no node is free of reservations" if nodes else "there are no nodes")
    with_gpus = [node for node in usable if node.gpus >= resources.gpus]
    if not with_gpus:
        raise _gpus_fit_nowhere(resources.gpus, usable)
    common = Counter((node.cores, node.memory_gb) for node in usable).most_common(1)[0][0]
    node = next(node for node in usable if (node.cores, node.memory_gb) == common)
    if _processes(resources, node) < 1:
        node = max(usable, key=lambda other: (_processes(resources, other), other.memory_gb))
        if _processes(resources, node) < 1:
            among = resources.gpus if len(with_gpus) < len(usable) else 0
            raise _fits_nowhere(resources, with_gpus, among)
    processes = _processes(resources, node)
    for cap in (max_processes, resources.workers):
        if cap is not None:
            processes = max(1, min(processes, cap))
    return _pod_shape(resources, processes)


def plan_task(
    task: TaskSpec,
    task_type: TaskType,
    resources: ResolvedResources,
    nodes: list[Node],
    mode: SplitMode,
    priority: Priority,
    units: int | None,
    pod_start_s: float = POD_START_S,
    *,
    max_pods: int = MAX_PIECES,
    run_id: str | None = None,
    reserve: str | None = None,
) -> TaskPlan:
    """Plan the pods of a task; PlanError naming the task when it cannot be planned.

    An unsplit task (`units` None) is one pod of one process (one core per worker), or of the
    processes its node allows when its type `uses_cores`. A pod of a split task has no more
    processes than the task has units. `single-server` plans one pod; `fastest` as many as there
    are slots for the shape on the usable nodes, at most `MAX_PIECES` and `max_pods`, and no pod
    without a unit for each of its processes; once `resources.seconds_per_unit` is learned, a
    further pod only while every pod keeps at least `pod_start_s` of work:
    `units * seconds_per_unit / (pods * processes) >= pod_start_s`. Extra pods are not limited by
    idle capacity, Kueue queues them. `run_id` is the run planned (a node it reserved is usable),
    `reserve` the node it reserves (its pods run there only).
    """
    try:
        if units is not None and units < 1:
            raise PlanError(f"it has {units} units, at least 1 needed")
        usable = usable_nodes(nodes, run_id, reserve)
        if units is not None:
            cap: int | None = units
        else:
            cap = None if task_type.uses_cores else 1
        pod = shape(resources, usable if reserve else nodes, max_processes=cap, run_id=run_id)
    except PlanError as error:
        field = user_field(task, error.resources) or error.field
        raise PlanError(error.reason, error.resources, task.id, field) from None
    pods = 1
    if units is not None and mode is SplitMode.FASTEST:
        pods = pieces(pod, usable, units, max_pods, resources.seconds_per_unit, pod_start_s)
    base, extra = priority_classes(priority)
    return TaskPlan(
        task_id=task.id,
        pods=pods,
        shape=pod,
        base_priority=base,
        extra_priority=extra,
        units=units,
    )


def pieces(
    pod: PodShape,
    nodes: list[Node],
    units: int,
    max_pods: int = MAX_PIECES,
    seconds_per_unit: float | None = None,
    pod_start_s: float = POD_START_S,
) -> int:
    """The pods of a split task of mode `fastest`, at least 1 (see `plan_task`).

    The slots of a node are the pods of this shape its cores and whole GiB hold side by side;
    `nodes` are the usable ones.
    """
    slots = sum(_slots(pod, node) for node in nodes)
    count = min(MAX_PIECES, max_pods, slots, units // pod.processes)
    if seconds_per_unit is not None and pod_start_s > 0:
        work = units * _fraction(seconds_per_unit)
        count = min(count, math.floor(work / (_fraction(pod_start_s) * pod.processes)))
    return max(1, count)


def _slots(pod: PodShape, node: Node) -> int:
    slots = min(node.cores // pod.cores, math.floor(_fraction(node.memory_gb)) // pod.memory_gb)
    return min(slots, node.gpus // pod.gpus) if pod.gpus > 0 else slots


def _processes(resources: ResolvedResources, node: Node) -> int:
    """The workers a node holds by its cores and its whole GiB, 0 when not even one or when
    it has fewer GPUs than the pod."""
    if node.gpus < resources.gpus:
        return 0
    by_cores = node.cores // max(1, resources.cores_per_worker)
    room = math.floor(_fraction(node.memory_gb)) - _fraction(resources.memory_base_gb)
    if room < 0:
        return 0
    per_worker = _fraction(resources.memory_per_worker_gb)
    by_memory = math.floor(room / per_worker) if per_worker else by_cores
    return min(by_cores, by_memory)


def _pod_shape(resources: ResolvedResources, processes: int) -> PodShape:
    base = _fraction(resources.memory_base_gb)
    per_worker = _fraction(resources.memory_per_worker_gb)
    retry_per_worker = per_worker * RETRY_FACTOR
    return PodShape(
        cores=processes * max(1, resources.cores_per_worker),
        memory_gb=_gib(base + per_worker * processes),
        processes=processes,
        per_worker_gb=float(per_worker),
        retry_memory_gb=_gib(base + retry_per_worker * processes),
        retry_per_worker_gb=float(retry_per_worker),
        scratch_gb=resources.scratch_gb,
        gpus=resources.gpus,
    )


def _check(resources: ResolvedResources) -> None:
    """PlanError for resources no pod can be sized with: negative or not finite."""
    for name, value in (
        ("memory_base_gb", resources.memory_base_gb),
        ("memory_per_worker_gb", resources.memory_per_worker_gb),
        ("scratch_gb", resources.scratch_gb),
    ):
        if not math.isfinite(value) or value < 0:
            raise PlanError(f"is {value!r}, it must be a number of GiB >= 0", (name,), field=name)
    if resources.gpus < 0:
        raise PlanError(f"is {resources.gpus}, it must be >= 0", ("gpus",), field="gpus")
    if resources.workers is not None and resources.workers < 1:
        message = f"is {resources.workers}, at least 1 needed"
        raise PlanError(message, ("workers",), field="workers")
    if resources.cores_per_worker < 1:
        message = f"is {resources.cores_per_worker}, at least 1 needed"
        raise PlanError(message, ("cores",), field="cores_per_worker")


def _gpus_fit_nowhere(gpus: int, nodes: list[Node]) -> PlanError:
    """The PlanError of a pod asking more GPUs than any usable node has: what it asks and
    the most a node has."""
    most = max(node.gpus for node in nodes)
    return PlanError(
        f"a pod of {_count(gpus, 'GPU')} fits on no node: the most a node has is "
        f"{_count(most, 'GPU')}",
        ("gpus",),
    )


def _fits_nowhere(resources: ResolvedResources, nodes: list[Node], among: int = 0) -> PlanError:
    """The PlanError of a worker no usable node holds, naming what it needs, what is short
    (cores, memory or only both together) and the largest node (of those with `among` GPUs
    when other nodes were left out for too few)."""
    cores = max(1, resources.cores_per_worker)
    base = _fraction(resources.memory_base_gb)
    per_worker = _fraction(resources.memory_per_worker_gb)
    short_cores = all(node.cores < cores for node in nodes)
    short_memory = all(math.floor(_fraction(node.memory_gb)) < base + per_worker for node in nodes)
    if short_cores and not short_memory:
        largest = max(nodes, key=lambda node: (node.cores, node.memory_gb))
        short: tuple[str, ...] = ("cores",)
    else:
        largest = max(nodes, key=lambda node: (node.memory_gb, node.cores))
        short = ("memory_per_worker_gb",) if short_memory and not short_cores else ()
    if not short:
        short = ("cores", "memory_per_worker_gb")
    if resources.source == "settings":
        need = f"{_count(cores, 'core')} and {_gb(base + per_worker)} GiB"
    else:
        notes = [f"+ {_gb(base)} GiB of the task"] if base else []
        notes += [] if resources.source == "override" else [resources.source]
        need = f"a worker of {_count(cores, 'core')} and {_gb(per_worker)} GiB"
        need += f" ({', '.join(notes)})" if notes else ""
    whole = math.floor(_fraction(largest.memory_gb))
    pods = "" if whole == _fraction(largest.memory_gb) else f" ({whole} GiB for pods)"
    of = f" with {_count(among, 'GPU')}" if among else ""
    return PlanError(
        f"{need} fits on no node: the largest{of} has {_count(largest.cores, 'core')}, "
        f"{_gb(_fraction(largest.memory_gb), 1)} GiB{pods}",
        short,
    )


def user_field(task: TaskSpec, resources: tuple[str, ...]) -> str | None:
    """The fields of a task the user wrote for resources of the planner: the settings of a
    `command` task (`settings.cores`, `settings.memory_gb`), the `resources` of another task
    where it sets them; None where they come from a hint or a measurement."""
    names: list[str] = []
    for resource in resources:
        if task.type == "command":
            name = COMMAND_FIELDS.get(resource)
            names.extend([f"settings.{name}"] if name else [])
        elif (
            task.resources is not None
            and resource in OVERRIDE_FIELDS
            and getattr(task.resources, resource) is not None
        ):
            names.append(f"resources.{resource}")
    return ", ".join(dict.fromkeys(names)) or None


COMMAND_FIELDS = {
    "cores": "cores",
    "memory_per_worker_gb": "memory_gb",
    "scratch_gb": "scratch_gb",
    "gpus": "gpus",
}
"""The setting of a `command` task that gives each resource of its plan."""
OVERRIDE_FIELDS = ("memory_per_worker_gb", "scratch_gb", "gpus", "workers")
"""The resources a task's `resources` override sets."""


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _gb(value: Fraction, decimals: int = 3) -> str:
    """GiB as people write them, rounded down to `decimals`: 23.5, 4, 0.125, 1,000,000."""
    scale = 10**decimals
    return f"{math.floor(value * scale) / scale:,.10g}"


def _gib(value: Fraction) -> int:
    """Whole GiB, rounded up, at least 1."""
    return max(1, math.ceil(value))


def _fraction(value: float) -> Fraction:
    """The exact value of the decimal text of a float: `0.1` is 1/10."""
    return Fraction(str(value))
