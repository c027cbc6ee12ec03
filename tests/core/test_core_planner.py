"""simrun_core.planner: pod shapes, pieces of a task, reservations and priorities."""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal
from fractions import Fraction

import msgspec
import pytest
from core_samples import NODE
from hypothesis import given, settings
from hypothesis import strategies as st

from simrun_core import events as ev
from simrun_core.planner import (
    MAX_PIECES,
    POD_START_S,
    PRIORITY_VALUES,
    Node,
    PlanError,
    PodShape,
    TaskPlan,
    pieces,
    plan_task,
    priority_class_values,
    priority_classes,
    shape,
    usable_nodes,
)
from simrun_core.plugins import TaskType
from simrun_core.resources import ResolvedResources, resolve_resources
from simrun_core.task_types.command import COMMAND, CommandSettings
from simrun_core.task_types.demo import SQUARES
from simrun_core.workflow import Priority, ResourceOverride, SplitMode, TaskSpec, Workflow

SQUARES_HINT = ResolvedResources(memory_base_gb=0.5, memory_per_worker_gb=0.25)
TASK = TaskSpec(id="fit", type="demo.squares")
RUN = "20240101-000000-abcdef"
OTHER_RUN = "20240101-000000-ffffff"
RESERVED = Node(name="big", cores=64, memory_gb=512.0, reserved_by=OTHER_RUN)
CLUSTER = [Node(name=f"n{i}", cores=2, memory_gb=24.0) for i in range(12)]
UNSPLIT = dataclasses.replace(
    SQUARES, name="demo.unsplit", count_units=None, command=("python", "-m", "x")
)
USES_CORES = dataclasses.replace(UNSPLIT, name="demo.cores", uses_cores=True)


def plan(
    resources: ResolvedResources = SQUARES_HINT,
    nodes: list[Node] | None = None,
    units: int | None = 100,
    mode: SplitMode = SplitMode.FASTEST,
    task_type: TaskType = SQUARES,
    **kwargs: object,
) -> TaskPlan:
    return plan_task(
        TASK,
        task_type,
        resources,
        [NODE] if nodes is None else nodes,
        mode,
        Priority.OWNER,
        units,
        **kwargs,  # type: ignore[arg-type]
    )


def learned(seconds_per_unit: float | None, **fields: object) -> ResolvedResources:
    """The demo's resources with learned seconds of a unit."""
    return msgspec.structs.replace(SQUARES_HINT, seconds_per_unit=seconds_per_unit, **fields)


# --- the shape of a pod -------------------------------------------------------------------------


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
        coordinator_merges=True,
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


def test_a_pod_fits_the_whole_gib_of_its_node() -> None:
    # 0.5 + 2 * 1.5 = 3.5 GiB would be a pod of 4 GiB, more than the node of 3.5 GiB holds
    resources = ResolvedResources(memory_base_gb=0.5, memory_per_worker_gb=1.5)
    result = shape(resources, [Node(name="n", cores=2, memory_gb=3.5)])
    assert (result.processes, result.memory_gb) == (1, 2)


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
    assert isinstance(result.memory_gb, int) and isinstance(result.retry_memory_gb, int)
    tiny = ResolvedResources(memory_base_gb=0.0, memory_per_worker_gb=0.1)
    assert shape(tiny, [NODE]).memory_gb == 1


@pytest.mark.parametrize(
    ("base", "per_worker", "memory_gb", "retry_memory_gb", "retry_per_worker_gb"),
    [
        (0.6, 0.8, 3, 3, 1.2),  # retry: 0.6 + 2 * 1.2 is 3.0000000000000004 in floats
        (0.2, 1.6, 4, 5, 2.4),  # retry: 0.2 + 2 * 2.4 is 5.000000000000001 in floats
        (0.1, 0.2, 1, 1, 0.3),  # 0.1 + 0.2 style
        (0.1, 1.1, 3, 4, 1.65),  # 0.1 + 2 * 1.1 is 2.3000000000000003 in floats
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


def test_retry_memory_is_base_and_one_and_a_half_per_worker() -> None:
    resources = ResolvedResources(memory_base_gb=2.0, memory_per_worker_gb=6.0)
    result = shape(resources, [NODE])
    assert result.processes == 2
    assert (result.memory_gb, result.per_worker_gb) == (14, 6.0)
    assert (result.retry_memory_gb, result.retry_per_worker_gb) == (20, 9.0)


def test_scratch_and_gpus_are_carried() -> None:
    resources = ResolvedResources(
        memory_base_gb=1.0, memory_per_worker_gb=1.0, scratch_gb=10.0, gpus=1
    )
    result = shape(resources, [msgspec.structs.replace(NODE, gpus=1)])
    assert (result.scratch_gb, result.gpus) == (10.0, 1)


def test_the_most_common_node_sizes_the_pod() -> None:
    small = [Node(name=f"s{i}", cores=2, memory_gb=4.0) for i in range(2)]
    big = Node(name="big", cores=16, memory_gb=128.0)
    assert shape(SQUARES_HINT, [big, *small]).processes == 2


def test_the_largest_node_when_the_common_one_is_too_small() -> None:
    small = [Node(name=f"s{i}", cores=2, memory_gb=4.0) for i in range(2)]
    big = Node(name="big", cores=16, memory_gb=128.0)
    resources = ResolvedResources(memory_base_gb=2.0, memory_per_worker_gb=6.0)
    assert shape(resources, [*small, big]).processes == 16


# --- refusals -----------------------------------------------------------------------------------


def test_plan_error_names_the_task_when_one_worker_fits_nowhere() -> None:
    resources = ResolvedResources(memory_base_gb=2.0, memory_per_worker_gb=30.0)
    with pytest.raises(PlanError) as info:
        plan(resources)
    assert str(info.value) == (
        "task 'fit': a worker of 1 core and 30 GiB (+ 2 GiB of the task, plugin hint) fits on "
        "no node: the largest has 2 cores, 24 GiB"
    )
    assert info.value.field is None, "a hint is no field the user wrote"


def test_plan_error_for_too_many_cores_per_worker() -> None:
    resources = ResolvedResources(memory_base_gb=0.0, memory_per_worker_gb=1.0, cores_per_worker=4)
    with pytest.raises(PlanError) as info:
        plan(resources)
    assert str(info.value) == (
        "task 'fit': a worker of 4 cores and 1 GiB (plugin hint) fits on no node: "
        "the largest has 2 cores, 24 GiB"
    )
    assert info.value.resources == ("cores",)


def test_plan_error_when_the_base_alone_exceeds_the_node() -> None:
    resources = ResolvedResources(memory_base_gb=30.0, memory_per_worker_gb=0.0)
    with pytest.raises(PlanError, match=r"^task 'fit': a worker .* fits on no node: the largest"):
        plan(resources)


def test_plan_error_names_the_field_of_an_override_and_the_whole_gib_of_a_node() -> None:
    task = TaskSpec(
        id="fit", type="demo.squares", resources=ResourceOverride(memory_per_worker_gb=40.0)
    )
    resources = resolve_resources(task, SQUARES, SQUARES.decode_settings({"n": 3}))
    nodes = [Node(name="n", cores=2, memory_gb=23.5)]
    with pytest.raises(PlanError) as info:
        plan_task(task, SQUARES, resources, nodes, SplitMode.FASTEST, Priority.OWNER, 3)
    assert info.value.problem().text("f.yaml") == (
        "f.yaml: task 'fit': resources.memory_per_worker_gb: a worker of 1 core and 40 GiB "
        "(+ 0.125 GiB of the task) fits on no node: the largest has 2 cores, 23.5 GiB "
        "(23 GiB for pods)"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"memory_per_worker_gb": -1.0}, "memory_per_worker_gb: is -1.0, it must be a number"),
        ({"memory_base_gb": math.nan}, "memory_base_gb: is nan, it must be a number"),
        ({"scratch_gb": -2.0}, "scratch_gb: is -2.0, it must be a number"),
        ({"workers": 0}, "workers: is 0, at least 1 needed"),
        ({"gpus": -1}, "gpus: is -1, it must be >= 0"),
        ({"cores_per_worker": 0}, "cores_per_worker: is 0, at least 1 needed"),
    ],
)
def test_plan_error_for_resources_no_pod_has(fields: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError) as info:
        plan(msgspec.structs.replace(SQUARES_HINT, **fields))
    assert str(info.value).startswith(f"task 'fit': {message}")


def test_plan_error_for_a_task_without_units() -> None:
    with pytest.raises(PlanError, match=r"^task 'fit': it has 0 units, at least 1 needed$"):
        plan(units=0)


def test_plan_error_without_nodes() -> None:
    with pytest.raises(PlanError, match=r"^task 'fit': there are no nodes$"):
        plan(nodes=[])


# --- reservations -------------------------------------------------------------------------------


def test_nodes_reserved_by_other_runs_are_left_out() -> None:
    assert shape(SQUARES_HINT, [RESERVED, NODE]) == shape(SQUARES_HINT, [NODE])
    many = [Node(name=f"m{i}", cores=2, memory_gb=24.0) for i in range(3)]
    assert plan(nodes=[RESERVED, *many], units=100).pods == 3
    with pytest.raises(PlanError, match=r"^task 'fit': no node is free of reservations$"):
        plan(nodes=[RESERVED])


def test_a_node_reserved_by_the_run_itself_counts() -> None:
    own = Node(name="own", cores=2, memory_gb=24.0, reserved_by=RUN)
    assert usable_nodes([RESERVED, own, NODE], RUN) == [own, NODE]
    assert usable_nodes([RESERVED, own, NODE]) == [NODE]
    assert plan(nodes=[own, *CLUSTER[:2]], run_id=RUN).pods == 3
    assert plan(nodes=[own, *CLUSTER[:2]]).pods == 2
    with pytest.raises(PlanError, match="no node is free of reservations"):
        plan(nodes=[own], run_id=OTHER_RUN)


def test_a_reserved_node_is_the_only_node_of_the_run() -> None:
    result = plan(nodes=[*CLUSTER, RESERVED], units=100, reserve="n3", run_id=RUN)
    assert (result.pods, result.shape.processes) == (1, 2)
    own = Node(name="big", cores=64, memory_gb=512.0, reserved_by=RUN)
    result = plan(nodes=[*CLUSTER, own], units=1000, reserve="big", run_id=RUN)
    assert (result.pods, result.shape.processes) == (1, 64)


def test_a_node_to_reserve_which_is_taken_or_unknown_is_refused() -> None:
    with pytest.raises(PlanError) as info:
        plan(nodes=[RESERVED, NODE], reserve="big", run_id=RUN)
    assert str(info.value) == f"task 'fit': node 'big' is reserved by run '{OTHER_RUN}'"
    with pytest.raises(PlanError) as info:
        plan(nodes=[RESERVED, NODE], reserve="nope", run_id=RUN)
    assert str(info.value) == (
        "task 'fit': node 'nope' to reserve does not exist (nodes: big, node-1)"
    )


# --- the pieces of a task -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("units", "mode", "max_pods", "pods"),
    [
        (100, SplitMode.FASTEST, 8, 8),
        (100, SplitMode.FASTEST, 3, 3),
        (100, SplitMode.FASTEST, 1, 1),  # the local backend
        (100, SplitMode.FASTEST, 20, MAX_PIECES),
        (5, SplitMode.FASTEST, 8, 2),  # no pod without a unit for each of its 2 processes
        (4, SplitMode.FASTEST, 8, 2),
        (3, SplitMode.FASTEST, 8, 1),
        (1, SplitMode.FASTEST, 8, 1),
        (100, SplitMode.SINGLE_SERVER, 8, 1),
        (None, SplitMode.FASTEST, 8, 1),
    ],
)
def test_pods_of_a_task(units: int | None, mode: SplitMode, max_pods: int, pods: int) -> None:
    task_type = SQUARES if units is not None else UNSPLIT
    result = plan(nodes=CLUSTER, units=units, mode=mode, max_pods=max_pods, task_type=task_type)
    assert result.pods == pods


def test_max_pieces_is_eight_and_the_default() -> None:
    assert MAX_PIECES == 8
    assert plan(nodes=CLUSTER, units=1000).pods == 8


def test_the_slots_of_the_free_nodes_limit_the_pods() -> None:
    assert plan(nodes=CLUSTER[:5], units=1000).pods == 5
    # a node of 4 cores holds two pods of 2 cores and 1 GiB
    wide = [Node(name=f"w{i}", cores=4, memory_gb=2.0) for i in range(3)]
    result = plan(nodes=wide, units=1000, task_type=SQUARES)
    assert (result.shape.processes, result.shape.memory_gb, result.pods) == (4, 2, 3)
    narrow = msgspec.structs.replace(SQUARES_HINT, workers=2)
    assert plan(narrow, nodes=wide, units=1000).pods == 6


def test_a_node_too_small_for_a_pod_has_no_slot() -> None:
    nodes = [
        NODE,
        Node(name="n2", cores=2, memory_gb=24.0),
        Node(name="tiny", cores=1, memory_gb=1),
    ]
    assert plan(nodes=nodes, units=100).pods == 2


def test_slots_count_whole_gib() -> None:
    pod = PodShape(
        cores=1,
        memory_gb=2,
        processes=1,
        per_worker_gb=1.0,
        retry_memory_gb=3,
        retry_per_worker_gb=1.5,
    )
    assert pieces(pod, [Node(name="n", cores=8, memory_gb=5.9)], units=100) == 2
    assert pieces(pod, [Node(name="n", cores=8, memory_gb=6.0)], units=100) == 3


@pytest.mark.parametrize(
    ("seconds_per_unit", "pods"),
    [
        (None, 8),  # nothing learned: the slots decide
        (10.0, 8),  # 100 * 10 / (8 * 2) = 62.5 s a pod
        (1.0, 5),  # 100 / (5 * 2) = 10 s a pod, 6 pods would have 8.3 s
        (0.99, 4),
        (0.1, 1),  # 10 s of work in all: one pod
        (0.0, 1),
    ],
)
def test_a_further_pod_only_while_every_pod_keeps_pod_start_s(
    seconds_per_unit: float | None, pods: int
) -> None:
    result = plan(learned(seconds_per_unit), nodes=CLUSTER, units=100)
    assert (result.shape.processes, result.pods) == (2, pods)


def test_pod_start_s_is_ten_by_default_and_a_parameter() -> None:
    assert POD_START_S == 10.0
    assert plan(learned(1.0), nodes=CLUSTER, units=100, pod_start_s=5.0).pods == 8
    assert plan(learned(1.0), nodes=CLUSTER, units=100, pod_start_s=25.0).pods == 2


def test_a_pod_start_of_a_second_keeps_three_small_nodes_busy() -> None:
    # the Slurm benchmark's cluster: three nodes of 2 CPUs and 2,000 MB; 200 units of 0.05 s
    nodes = [Node(name=f"node{i}", cores=2, memory_gb=2000 / 1024) for i in (1, 2, 3)]
    slurm = plan(learned(0.05), nodes=nodes, units=200, pod_start_s=1.0)
    assert (slurm.pods, slurm.shape.processes, slurm.shape.cores) == (3, 2, 2)
    kubernetes = plan(learned(0.05), nodes=nodes, units=200, pod_start_s=POD_START_S)
    assert kubernetes.pods == 1  # 10 s of work is one pod start's worth
    assert plan(learned(0.05), nodes=nodes, units=200, pod_start_s=2.5).pods == 2


def test_the_work_of_a_pod_is_exact() -> None:
    # 3 * 0.7 / 0.7 is 2.9999999999999996 in floats: three pods keep 0.7 s each
    one_process = learned(0.7, workers=1)
    assert plan(one_process, nodes=CLUSTER, units=3, pod_start_s=0.7).pods == 3


def test_single_server_is_one_pod_whatever_is_learned() -> None:
    result = plan(learned(100.0), nodes=CLUSTER, units=1000, mode=SplitMode.SINGLE_SERVER)
    assert (result.pods, result.shape.processes) == (1, 2)


# --- unsplit tasks ------------------------------------------------------------------------------


def test_an_unsplit_task_is_one_pod_of_one_process() -> None:
    resources = ResolvedResources(memory_base_gb=2.0, memory_per_worker_gb=1.5)
    result = plan(resources, nodes=CLUSTER, units=None, task_type=UNSPLIT)
    assert result.pods == 1 and result.units is None
    assert (result.shape.processes, result.shape.cores, result.shape.memory_gb) == (1, 1, 4)


def test_an_unsplit_type_which_uses_cores_gets_the_processes_of_its_node() -> None:
    resources = ResolvedResources(memory_base_gb=2.0, memory_per_worker_gb=1.5)
    big = [Node(name="big", cores=16, memory_gb=16.0)]
    result = plan(resources, nodes=big, units=None, task_type=USES_CORES)
    # 16 cores, but (16 - 2) / 1.5 = 9 processes by memory
    assert result.pods == 1
    assert (result.shape.processes, result.shape.cores, result.shape.memory_gb) == (9, 9, 16)
    capped = msgspec.structs.replace(resources, workers=3)
    assert plan(capped, nodes=big, units=None, task_type=USES_CORES).shape.processes == 3


def test_a_command_has_the_resources_of_its_settings() -> None:
    command = CommandSettings(image="i", args=[], cores=4, memory_gb=7.5, gpus=1, scratch_gb=20.0)
    task = TaskSpec(id="c", type="command")
    resources = resolve_resources(task, COMMAND, command)
    nodes = [Node(name="n", cores=16, memory_gb=64.0, gpus=1)]
    result = plan_task(task, COMMAND, resources, nodes, SplitMode.FASTEST, Priority.AGENT, None)
    assert result == TaskPlan(
        task_id="c",
        pods=1,
        shape=PodShape(
            cores=4,
            memory_gb=8,
            processes=1,
            per_worker_gb=7.5,
            retry_memory_gb=12,
            retry_per_worker_gb=11.25,
            scratch_gb=20.0,
            gpus=1,
        ),
        base_priority="simrun-agent-base",
        extra_priority="simrun-agent-extra",
        units=None,
    )
    with pytest.raises(PlanError) as info:
        too_wide = msgspec.structs.replace(resources, cores_per_worker=32)
        plan_task(task, COMMAND, too_wide, nodes, SplitMode.FASTEST, Priority.AGENT, None)
    assert info.value.problem().text() == (
        "task 'c': settings.cores: 32 cores and 7.5 GiB fits on no node: "
        "the largest has 16 cores, 64 GiB"
    )
    with pytest.raises(PlanError) as info:
        too_big = msgspec.structs.replace(resources, memory_per_worker_gb=100.0)
        plan_task(task, COMMAND, too_big, nodes, SplitMode.FASTEST, Priority.AGENT, None)
    assert info.value.field == "settings.memory_gb"
    with pytest.raises(PlanError) as info:
        negative = msgspec.structs.replace(resources, memory_per_worker_gb=-1.0)
        plan_task(task, COMMAND, negative, nodes, SplitMode.FASTEST, Priority.AGENT, None)
    assert (
        str(info.value) == "task 'c': settings.memory_gb: is -1.0, it must be a number of GiB >= 0"
    )


# --- priorities ---------------------------------------------------------------------------------


# --- GPUs ---------------------------------------------------------------------------------------


def gpu_command(
    gpus: int, cores: int = 1, memory_gb: float = 1.0
) -> tuple[TaskSpec, ResolvedResources]:
    settings = CommandSettings(image="i", args=[], cores=cores, memory_gb=memory_gb, gpus=gpus)
    task = TaskSpec(id="train", type="command")
    return task, resolve_resources(task, COMMAND, settings)


def plan_command(gpus: int, nodes: list[Node], **settings: object) -> TaskPlan:
    task, resources = gpu_command(gpus, **settings)  # type: ignore[arg-type]
    return plan_task(task, COMMAND, resources, nodes, SplitMode.FASTEST, Priority.OWNER, None)


def test_a_pod_asking_more_gpus_than_any_node_has_is_refused_naming_them() -> None:
    nodes = [
        Node(name="a", cores=8, memory_gb=32.0, gpus=2),
        Node(name="b", cores=8, memory_gb=32.0),
    ]
    assert plan_command(2, nodes).shape.gpus == 2
    with pytest.raises(PlanError) as info:
        plan_command(3, nodes)
    assert info.value.problem().text() == (
        "task 'train': settings.gpus: a pod of 3 GPUs fits on no node: "
        "the most a node has is 2 GPUs"
    )
    assert info.value.resources == ("gpus",)
    with pytest.raises(
        PlanError,
        match=r"settings\.gpus: a pod of 1 GPU fits on no node: "
        r"the most a node has is 0 GPUs$",
    ):
        plan_command(1, [NODE])


def test_the_gpus_of_an_override_are_its_field() -> None:
    task = TaskSpec(id="fit", type="demo.squares", resources=ResourceOverride(gpus=4))
    resources = resolve_resources(task, SQUARES, SQUARES.decode_settings({"n": 3}))
    with pytest.raises(PlanError) as info:
        plan_task(task, SQUARES, resources, [NODE], SplitMode.FASTEST, Priority.OWNER, 3)
    assert info.value.problem().text() == (
        "task 'fit': resources.gpus: a pod of 4 GPUs fits on no node: the most a node has is 0 GPUs"
    )


def test_a_gpu_pod_goes_to_a_node_with_the_gpus_even_when_others_are_more_common() -> None:
    plain = [Node(name=f"p{i}", cores=2, memory_gb=8.0) for i in range(3)]
    gpu = Node(name="g", cores=16, memory_gb=64.0, gpus=1)
    resources = msgspec.structs.replace(SQUARES_HINT, gpus=1)
    result = plan(resources, nodes=[*plain, gpu], units=1000)
    assert (result.shape.processes, result.shape.gpus, result.pods) == (16, 1, 1)


def test_the_gpus_of_a_node_limit_its_slots() -> None:
    nodes = [Node(name=f"g{i}", cores=64, memory_gb=256.0, gpus=2) for i in range(2)]
    resources = msgspec.structs.replace(SQUARES_HINT, gpus=1, workers=2)
    assert plan(resources, nodes=nodes, units=1000).pods == 4, "two pods of one GPU a node"
    no_gpus = msgspec.structs.replace(SQUARES_HINT, workers=2)
    assert plan(no_gpus, nodes=nodes, units=1000).pods == 8, "a pod without GPUs: by cores"


def test_cores_short_on_the_nodes_with_the_gpus_names_the_largest_of_them() -> None:
    nodes = [
        Node(name="big", cores=64, memory_gb=256.0),
        Node(name="g", cores=4, memory_gb=16.0, gpus=1),
    ]
    with pytest.raises(PlanError) as info:
        plan_command(1, nodes, cores=8)
    assert info.value.problem().text() == (
        "task 'train': settings.cores: 8 cores and 1 GiB fits on no node: "
        "the largest with 1 GPU has 4 cores, 16 GiB"
    )


@pytest.mark.parametrize("priority", list(Priority))
def test_priority_classes(priority: Priority) -> None:
    result = plan_task(TASK, SQUARES, SQUARES_HINT, [NODE], SplitMode.FASTEST, priority, 2)
    assert (result.base_priority, result.extra_priority) == priority_classes(priority)
    assert priority_classes(priority) == (f"simrun-{priority}-base", f"simrun-{priority}-extra")


def test_priority_class_values() -> None:
    assert priority_class_values() == {
        "simrun-owner-base": 1000,
        "simrun-owner-extra": 900,
        "simrun-standard-base": 500,
        "simrun-standard-extra": 400,
        "simrun-agent-base": 200,
        "simrun-agent-extra": 100,
    }
    assert PRIORITY_VALUES[Priority.STANDARD] == (500, 400)


# --- serialisation ------------------------------------------------------------------------------


def test_a_plan_goes_through_the_submitted_event_unchanged() -> None:
    plans = {"fit": plan(learned(1.0), nodes=CLUSTER, units=100)}
    event = ev.Submitted(
        seq=1,
        run=RUN,
        workflow=Workflow(name="w", tasks=[TASK]),
        submitted_by="alice",
        owner="alice",
        plans=plans,
    )
    decoded = ev.decode_event(ev.encode_event(event))
    assert isinstance(decoded, ev.Submitted)
    assert decoded.plans == plans
    assert msgspec.json.decode(msgspec.json.encode(plans["fit"]), type=TaskPlan) == plans["fit"]


# --- properties ---------------------------------------------------------------------------------

GIB_VALUES = st.decimals(min_value=0, max_value=64, places=2).map(lambda d: float(str(d)))
NODES = st.lists(
    st.builds(
        Node,
        name=st.sampled_from(["a", "b", "c", "d"]),
        cores=st.integers(1, 64),
        memory_gb=st.decimals(min_value=1, max_value=512, places=1).map(lambda d: float(str(d))),
    ),
    min_size=1,
    max_size=12,
)


def exact(value: float) -> Fraction:
    return Fraction(Decimal(str(value)))


@settings(max_examples=300, deadline=None)
@given(
    base=GIB_VALUES,
    per_worker=GIB_VALUES,
    nodes=NODES,
    max_processes=st.none() | st.integers(1, 100),
)
def test_property_a_shape_holds_its_processes_in_whole_gib(
    base: float, per_worker: float, nodes: list[Node], max_processes: int | None
) -> None:
    resources = ResolvedResources(memory_base_gb=base, memory_per_worker_gb=per_worker)
    try:
        pod = shape(resources, nodes, max_processes)
    except PlanError:
        assert all(
            node.cores < 1 or math.floor(exact(node.memory_gb)) < exact(base) + exact(per_worker)
            for node in nodes
        )
        return
    need = exact(base) + exact(per_worker) * pod.processes
    assert type(pod.memory_gb) is int and pod.memory_gb >= need and pod.memory_gb - 1 < max(need, 1)
    retry = exact(base) + exact(per_worker) * Fraction(3, 2) * pod.processes
    assert type(pod.retry_memory_gb) is int and pod.retry_memory_gb >= retry
    assert pod.retry_memory_gb >= pod.memory_gb
    assert pod.processes >= 1 and pod.cores == pod.processes
    assert max_processes is None or pod.processes <= max_processes
    assert any(
        pod.cores <= node.cores and pod.memory_gb <= max(1, math.floor(node.memory_gb))
        for node in nodes
    )


@settings(max_examples=300, deadline=None)
@given(
    nodes=NODES,
    units=st.integers(1, 10_000),
    max_pods=st.integers(1, 20),
    seconds_per_unit=st.none() | st.floats(0, 1000, allow_nan=False),
    mode=st.sampled_from(list(SplitMode)),
)
def test_property_pieces(
    nodes: list[Node],
    units: int,
    max_pods: int,
    seconds_per_unit: float | None,
    mode: SplitMode,
) -> None:
    result = plan(learned(seconds_per_unit), nodes=nodes, units=units, mode=mode, max_pods=max_pods)
    processes = result.shape.processes
    assert 1 <= result.pods <= min(MAX_PIECES, max_pods)
    assert 1 <= processes <= units
    assert result.pods * processes <= units
    if mode is SplitMode.SINGLE_SERVER:
        assert result.pods == 1
    if seconds_per_unit is not None and result.pods > 1:
        work = units * exact(seconds_per_unit) / (result.pods * processes)
        assert work >= Fraction(10)
