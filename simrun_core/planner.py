"""The planner: the shape of a worker pod and the number of pieces of a task. Pure functions."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction

import msgspec

from simrun_core.resources import ResolvedResources
from simrun_core.workflow import Priority, SplitMode, TaskSpec

MAX_PIECES = 8
RETRY_FACTOR = Fraction(3, 2)

BASE_PRIORITY = {Priority.OWNER: 1000, Priority.STANDARD: 500, Priority.AGENT: 200}
EXTRA_PRIORITY = {Priority.OWNER: 900, Priority.STANDARD: 400, Priority.AGENT: 100}


class PlanError(ValueError):
    """A task which cannot be planned on the nodes; the message names it."""


class Node(msgspec.Struct, frozen=True):
    """A node a worker pod can run on: the whole cores and GiB a pod of a run can have there."""

    name: str
    cores: int
    memory_gb: float
    gpus: int = 0
    reserved_by: str | None = None


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


def _gib(value: Fraction) -> int:
    """Whole GiB, rounded up, without floating-point noise."""
    return max(1, math.ceil(value))


def _fraction(value: float) -> Fraction:
    return Fraction(str(value))


def shape(
    resources: ResolvedResources, nodes: list[Node], max_processes: int | None = None
) -> PodShape:
    """Size a pod for the most common free node, else the largest; PlanError if none fits one."""
    free = [node for node in nodes if node.reserved_by is None]
    if not free:
        raise PlanError("no node is free of reservations")
    base = _fraction(resources.memory_base_gb)
    per_worker = _fraction(resources.memory_per_worker_gb)
    per_cores = max(1, resources.cores_per_worker)

    def fits(node: Node) -> int:
        by_cores = node.cores // per_cores
        room = _fraction(node.memory_gb) - base
        if room < 0:
            return 0
        by_memory = int(room // per_worker) if per_worker else by_cores
        return min(by_cores, by_memory)

    common = Counter((node.cores, node.memory_gb) for node in free).most_common(1)[0][0]
    node = next(node for node in free if (node.cores, node.memory_gb) == common)
    if fits(node) < 1:
        node = max(free, key=lambda candidate: (fits(candidate), candidate.memory_gb))
        if fits(node) < 1:
            raise PlanError(
                f"one worker ({per_cores} cores, {resources.memory_base_gb} + "
                f"{resources.memory_per_worker_gb} GiB) fits on no node"
            )
    processes = fits(node)
    for cap in (max_processes, resources.workers):
        if cap is not None:
            processes = max(1, min(processes, cap))
    retry_per_worker = per_worker * RETRY_FACTOR
    return PodShape(
        cores=processes * per_cores,
        memory_gb=_gib(base + per_worker * processes),
        processes=processes,
        per_worker_gb=float(per_worker),
        retry_memory_gb=_gib(base + retry_per_worker * processes),
        retry_per_worker_gb=float(retry_per_worker),
        scratch_gb=resources.scratch_gb,
        gpus=resources.gpus,
    )


def plan_task(
    task: TaskSpec,
    resources: ResolvedResources,
    nodes: list[Node],
    mode: SplitMode,
    priority: Priority,
    units: int | None,
    max_pods: int = MAX_PIECES,
) -> TaskPlan:
    """Plan the pods of a task; PlanError naming the task when it fits on no node.

    A pod has no more processes than the task has units; `fastest` takes as many pods as there
    are free slots on the nodes, at most `max_pods`, and no pod without a unit for each process.
    """
    try:
        pod = shape(resources, nodes, max_processes=units if units else None)
    except PlanError as error:
        raise PlanError(f"task {task.id!r}: {error}") from None
    pods = 1
    if units and mode is SplitMode.FASTEST:
        free = [node for node in nodes if node.reserved_by is None]
        slots = sum(
            min(node.cores // max(1, pod.cores), int(node.memory_gb // pod.memory_gb))
            for node in free
        )
        pods = max(1, min(max_pods, slots, units // pod.processes))
    return TaskPlan(
        task_id=task.id,
        pods=pods,
        shape=pod,
        base_priority=f"simrun-{priority}-base",
        extra_priority=f"simrun-{priority}-extra",
        units=units,
    )
