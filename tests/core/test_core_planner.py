"""simrun_core.planner (and the resources it plans with): pod shapes and pieces of a task."""

from __future__ import annotations

import pytest
from core_samples import NODE

from simrun_core.planner import Node, PlanError, PodShape, TaskPlan, plan_task, shape
from simrun_core.resources import ResolvedResources, resolve_resources
from simrun_core.task_types.command import COMMAND, CommandSettings
from simrun_core.task_types.demo import SQUARES, SquaresSettings
from simrun_core.workflow import Priority, ResourceOverride, SplitMode, TaskSpec

SQUARES_HINT = ResolvedResources(memory_base_gb=0.5, memory_per_worker_gb=0.25)
TASK = TaskSpec(id="fit", type="t")
RESERVED = Node(name="big", cores=64, memory_gb=512.0, reserved_by="20240101-000000-abcdef")


def plan(
    resources: ResolvedResources = SQUARES_HINT,
    nodes: list[Node] | None = None,
    units: int | None = 100,
    mode: SplitMode = SplitMode.FASTEST,
    **kwargs: int,
) -> TaskPlan:
    return plan_task(
        TASK, resources, [NODE] if nodes is None else nodes, mode, Priority.OWNER, units, **kwargs
    )


def test_shape_of_the_demo_on_one_node() -> None:
    assert shape(SQUARES_HINT, [NODE]) == PodShape(
        cores=2,
        memory_gb=1,
        processes=2,
        per_worker_gb=0.25,
        retry_memory_gb=2,
        retry_per_worker_gb=0.375,
    )


def test_plan_task_of_the_demo() -> None:
    assert plan(units=3) == TaskPlan(
        task_id="fit",
        pods=1,
        shape=shape(SQUARES_HINT, [NODE]),
        base_priority="simrun-owner-base",
        extra_priority="simrun-owner-extra",
        units=3,
    )


def test_processes_at_most_units() -> None:
    result = plan(units=1)
    assert (result.shape.processes, result.shape.cores, result.pods) == (1, 1, 1)
    assert result.shape.memory_gb == 1


def test_processes_at_most_cores() -> None:
    resources = ResolvedResources(memory_base_gb=0.0, memory_per_worker_gb=0.5)
    assert shape(resources, [Node(name="n", cores=2, memory_gb=1000.0)]).processes == 2


@pytest.mark.parametrize(("per_worker", "processes"), [(10.0, 2), (11.0, 2), (12.0, 1)])
def test_processes_limited_by_memory(per_worker: float, processes: int) -> None:
    resources = ResolvedResources(memory_base_gb=2.0, memory_per_worker_gb=per_worker)
    assert shape(resources, [NODE]).processes == processes


def test_cores_per_worker() -> None:
    resources = ResolvedResources(memory_base_gb=0.0, memory_per_worker_gb=1.0, cores_per_worker=2)
    result = shape(resources, [NODE])
    assert (result.processes, result.cores) == (1, 2)


def test_workers_and_max_processes_cap_processes() -> None:
    capped = ResolvedResources(memory_base_gb=0.5, memory_per_worker_gb=0.25, workers=1)
    assert shape(capped, [NODE]).processes == 1
    assert shape(SQUARES_HINT, [NODE], max_processes=1).processes == 1
    assert shape(SQUARES_HINT, [NODE], max_processes=5).processes == 2


def test_memory_is_whole_gib_rounded_up() -> None:
    resources = ResolvedResources(memory_base_gb=2.0, memory_per_worker_gb=6.1)
    result = shape(resources, [NODE])
    assert (result.processes, result.memory_gb, result.retry_memory_gb) == (2, 15, 21)
    assert isinstance(result.memory_gb, int)
    tiny = ResolvedResources(memory_base_gb=0.0, memory_per_worker_gb=0.1)
    assert shape(tiny, [NODE]).memory_gb == 1


@pytest.mark.parametrize(
    ("base", "per_worker", "memory_gb", "retry_memory_gb", "retry_per_worker_gb"),
    [
        (0.6, 0.8, 3, 3, 1.2),  # retry: 0.6 + 2 * 1.2 is 3.0000000000000004 in floats
        (0.2, 1.6, 4, 5, 2.4),  # retry: 0.2 + 2 * 2.4 is 5.000000000000001 in floats
        (0.1, 0.2, 1, 1, 0.3),  # 0.1 + 0.2 style
    ],
)
def test_memory_without_float_noise(
    base: float,
    per_worker: float,
    memory_gb: int,
    retry_memory_gb: int,
    retry_per_worker_gb: float,
) -> None:
    result = shape(ResolvedResources(memory_base_gb=base, memory_per_worker_gb=per_worker), [NODE])
    assert result.processes == 2
    assert (result.memory_gb, result.retry_memory_gb) == (memory_gb, retry_memory_gb)
    assert result.retry_per_worker_gb == retry_per_worker_gb
    assert result.per_worker_gb == per_worker


def test_retry_memory_is_one_and_a_half_per_worker() -> None:
    resources = ResolvedResources(memory_base_gb=2.0, memory_per_worker_gb=6.0)
    result = shape(resources, [NODE])
    assert result.processes == 2
    assert (result.memory_gb, result.per_worker_gb) == (14, 6.0)
    assert (result.retry_memory_gb, result.retry_per_worker_gb) == (20, 9.0)


def test_scratch_and_gpus_are_carried() -> None:
    resources = ResolvedResources(
        memory_base_gb=1.0, memory_per_worker_gb=1.0, scratch_gb=10.0, gpus=1
    )
    result = shape(resources, [NODE])
    assert (result.scratch_gb, result.gpus) == (10.0, 1)


def test_plan_error_names_the_task_when_one_worker_fits_nowhere() -> None:
    resources = ResolvedResources(memory_base_gb=2.0, memory_per_worker_gb=30.0)
    with pytest.raises(PlanError) as info:
        plan(resources)
    assert str(info.value) == "task 'fit': one worker (1 cores, 2.0 + 30.0 GiB) fits on no node"


def test_plan_error_for_too_many_cores_per_worker() -> None:
    resources = ResolvedResources(memory_base_gb=0.0, memory_per_worker_gb=1.0, cores_per_worker=4)
    with pytest.raises(PlanError) as info:
        plan(resources)
    assert str(info.value) == "task 'fit': one worker (4 cores, 0.0 + 1.0 GiB) fits on no node"


def test_plan_error_when_the_base_alone_exceeds_the_node() -> None:
    resources = ResolvedResources(memory_base_gb=30.0, memory_per_worker_gb=0.0)
    with pytest.raises(PlanError):
        plan(resources)


def test_reserved_nodes_are_left_out() -> None:
    assert shape(SQUARES_HINT, [RESERVED, NODE]) == shape(SQUARES_HINT, [NODE])
    many = [Node(name=f"m{i}", cores=2, memory_gb=24.0) for i in range(3)]
    assert plan(nodes=[RESERVED, *many], units=100).pods == 3
    with pytest.raises(PlanError, match=r"^task 'fit': no node is free of reservations$"):
        plan(nodes=[RESERVED])


def test_the_most_common_node_sizes_the_pod() -> None:
    small = [Node(name=f"s{i}", cores=2, memory_gb=4.0) for i in range(2)]
    big = Node(name="big", cores=16, memory_gb=128.0)
    assert shape(SQUARES_HINT, [big, *small]).processes == 2


def test_the_largest_node_when_the_common_one_is_too_small() -> None:
    small = [Node(name=f"s{i}", cores=2, memory_gb=4.0) for i in range(2)]
    big = Node(name="big", cores=16, memory_gb=128.0)
    resources = ResolvedResources(memory_base_gb=2.0, memory_per_worker_gb=6.0)
    assert shape(resources, [*small, big]).processes == 16


CLUSTER = [Node(name=f"n{i}", cores=2, memory_gb=24.0) for i in range(12)]


@pytest.mark.parametrize(
    ("units", "mode", "max_pods", "pods"),
    [
        (100, SplitMode.FASTEST, 8, 8),
        (100, SplitMode.FASTEST, 3, 3),
        (100, SplitMode.FASTEST, 20, 12),
        (5, SplitMode.FASTEST, 8, 2),
        (1, SplitMode.FASTEST, 8, 1),
        (100, SplitMode.SINGLE_SERVER, 8, 1),
        (None, SplitMode.FASTEST, 8, 1),
    ],
)
def test_pods_of_a_task(units: int | None, mode: SplitMode, max_pods: int, pods: int) -> None:
    assert plan(nodes=CLUSTER, units=units, mode=mode, max_pods=max_pods).pods == pods


def test_pods_default_to_at_most_eight() -> None:
    assert plan(nodes=CLUSTER, units=1000).pods == 8


def test_a_node_too_small_for_a_pod_has_no_slot() -> None:
    nodes = [
        NODE,
        Node(name="n2", cores=2, memory_gb=24.0),
        Node(name="tiny", cores=1, memory_gb=1),
    ]
    assert plan(nodes=nodes, units=100).pods == 2


def test_priority_classes() -> None:
    result = plan_task(TASK, SQUARES_HINT, [NODE], SplitMode.FASTEST, Priority.AGENT, 2)
    assert (result.base_priority, result.extra_priority) == (
        "simrun-agent-base",
        "simrun-agent-extra",
    )


# --- resources ----------------------------------------------------------------------------------


def test_resources_of_a_command_come_from_its_settings() -> None:
    settings = CommandSettings(image="i", args=[], cores=4, memory_gb=8.0, gpus=1, scratch_gb=20.0)
    task = TaskSpec(id="c", type="command")
    assert resolve_resources(task, COMMAND, settings) == ResolvedResources(
        memory_base_gb=0.0,
        memory_per_worker_gb=8.0,
        scratch_gb=20.0,
        gpus=1,
        workers=1,
        cores_per_worker=4,
        source="settings",
    )


def test_resources_from_the_hint_and_an_override() -> None:
    settings = SquaresSettings(n=3)
    plain = TaskSpec(id="s", type="demo.squares")
    assert resolve_resources(plain, SQUARES, settings) == SQUARES_HINT
    override = TaskSpec(
        id="s",
        type="demo.squares",
        resources=ResourceOverride(workers=3, memory_per_worker_gb=1.5, scratch_gb=0.0),
    )
    assert resolve_resources(override, SQUARES, settings) == ResolvedResources(
        memory_base_gb=0.5,
        memory_per_worker_gb=1.5,
        scratch_gb=0.0,
        workers=3,
        source="override",
    )
