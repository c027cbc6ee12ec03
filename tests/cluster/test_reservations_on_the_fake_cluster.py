"""Reservations on the fake cluster, through a Supervisor and `ArgoBackend` (spec 03, 38, 41).

A run that reserves a node taints it `simrun/reserved=<run>:NoExecute` and labels it before its
Workflow is created: the pods of another run running there are evicted and come back on the
other node only, the reserved run's pods select and tolerate the node, and the taint and label
go once the run ended, also when the service was stopped meanwhile and a new one ended it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
from cluster_runs import HARNESS_ENV, Service, kinds, submitted
from fake.cluster import FakeCluster, NodeSpec
from unit_events import done_indices

from simrun_core import events as ev
from simrun_core.argo import labels
from simrun_core.store import RunPaths
from simrun_core.workflow import Priority, ResourceOverride, SplitMode, TaskSpec, Workflow

OTHER_RUN = "20260101-000000-07e4e4"
RESERVED_RUN = "20260101-000001-4e5e4e"
NODES = [NodeSpec(f"node-{i}", cores=4, memory_gb=8.0) for i in (1, 2)]
TWO_WORKERS = ResourceOverride(workers=2)


def squares(name: str, n: int, sleep_s: float) -> Workflow:
    task = TaskSpec(
        id="squares",
        type="demo.squares",
        settings={"n": n, "sleep_s": sleep_s},
        resources=TWO_WORKERS,
    )
    return Workflow(name=name, tasks=[task])


def reservation(cluster: FakeCluster, node: str) -> tuple[str | None, list[dict]]:
    """The run a node's label names and the node's reservation taints."""
    manifest = cluster.store.get("nodes", node)
    label = (manifest["metadata"].get("labels") or {}).get(labels.RESERVED)
    taints = [t for t in manifest["spec"].get("taints") or [] if t["key"] == labels.RESERVED]
    return label, taints


def summary(cluster: FakeCluster, run_id: str) -> dict:
    path = RunPaths(cluster.store_dir, run_id).out("squares") / "summary.json"
    return msgspec.json.decode(path.read_bytes())


def started_on(log: list[ev.Event]) -> list[tuple[str, int, str | None]]:
    return [(e.worker, e.attempt, e.node) for e in log if isinstance(e, ev.PodStarted)]


def test_a_reserved_node_evicts_other_runs_and_is_released_at_the_end(tmp_path: Path) -> None:
    async def scenario(cluster: FakeCluster) -> tuple[list[ev.Event], list[ev.Event], list]:
        async with Service(cluster, tmp_path / "db.sqlite") as service:
            event, settings = submitted(
                OTHER_RUN, squares("other", 120, 0.1), NODES, Priority.STANDARD, max_pods=4
            )
            await service.submit(event, settings)

            def spread() -> bool:
                nodes = {node for _, _, node in started_on(service.log(OTHER_RUN))}
                return nodes == {"node-1", "node-2"}

            await service.until(spread, "the other run's pods to run on both nodes")
            event, settings = submitted(
                RESERVED_RUN,
                squares("reserved", 20, 0.05),
                NODES,
                Priority.STANDARD,
                mode=SplitMode.SINGLE_SERVER,
                reserve="node-1",
            )
            await service.submit(event, settings)
            held: list[tuple[str | None, list[dict]]] = []

            def running() -> bool:
                log = service.log(RESERVED_RUN)
                if any(isinstance(e, ev.PodStarted) for e in log):
                    held.append(reservation(cluster, "node-1"))
                    return True
                return False

            await service.until(running, "the reserved run to run")
            await service.ended(RESERVED_RUN)
            await service.until(
                lambda: "node-released" in kinds(service.log(RESERVED_RUN)), "the release"
            )
            other_log = await service.ended(OTHER_RUN)
            return service.log(RESERVED_RUN), other_log, held

    with FakeCluster(tmp_path, nodes=NODES, env_overrides=HARNESS_ENV) as cluster:
        reserved_log, other_log, held = asyncio.run(scenario(cluster))
        assert cluster.errors == []
        after = reservation(cluster, "node-1")
        assert summary(cluster, RESERVED_RUN) == {"n": 20, "sum": sum(i * i for i in range(20))}
        assert summary(cluster, OTHER_RUN) == {"n": 120, "sum": sum(i * i for i in range(120))}
    taint = {"key": labels.RESERVED, "value": RESERVED_RUN, "effect": "NoExecute"}
    assert held == [(RESERVED_RUN, [taint])], "tainted and labelled while the run runs"
    assert after == (None, []), "released at the end"
    log = kinds(reserved_log)
    assert log.index("node-reserved") < log.index("workflow-submitted")
    assert log[-2:] == ["succeeded", "node-released"]
    assert {node for _, _, node in started_on(reserved_log)} == {"node-1"}
    reserved_at = next(e.time for e in reserved_log if isinstance(e, ev.NodeReserved))
    released_at = next(e.time for e in reserved_log if isinstance(e, ev.NodeReleased))
    evicted = [
        e
        for e in other_log
        if isinstance(e, ev.PodFailed | ev.PodPreempted) and e.time > reserved_at
    ]
    assert evicted, "the other run's pods on the reserved node were evicted"
    kept_off = [
        e.node
        for e in other_log
        if isinstance(e, ev.PodStarted) and reserved_at < e.time < released_at
    ]
    assert "node-1" not in kept_off, kept_off
    done = done_indices(other_log)
    assert sorted(set(done)) == list(range(120))
    assert kinds(other_log)[-1] == "succeeded"


def test_a_run_that_ended_while_no_service_ran_is_released_by_the_next(tmp_path: Path) -> None:
    async def scenario(cluster: FakeCluster) -> tuple[list[ev.Event], tuple, tuple]:
        event, settings = submitted(
            RESERVED_RUN,
            squares("reserved", 8, 0.25),
            NODES,
            Priority.STANDARD,
            mode=SplitMode.SINGLE_SERVER,
            reserve="node-2",
        )
        async with Service(cluster, tmp_path / "db.sqlite") as service:
            await service.submit(event, settings)
            await service.until(
                lambda: done_indices(service.log(RESERVED_RUN)) != [],
                "a unit of the reserved run",
            )
            name = next(
                e.name for e in service.log(RESERVED_RUN) if isinstance(e, ev.WorkflowSubmitted)
            )
        # No service follows the run now: its Workflow ends in the cluster alone.
        await asyncio.to_thread(cluster.wait_workflow, name, timeout_s=30)
        while_stopped = reservation(cluster, "node-2")
        async with Service(cluster, tmp_path / "db2.sqlite") as service:
            await service.ended(RESERVED_RUN)
            await service.until(
                lambda: "node-released" in kinds(service.log(RESERVED_RUN)), "the release"
            )
            return service.log(RESERVED_RUN), while_stopped, reservation(cluster, "node-2")

    with FakeCluster(tmp_path, nodes=NODES, env_overrides=HARNESS_ENV) as cluster:
        log, while_stopped, after = asyncio.run(scenario(cluster))
        assert cluster.errors == []
        assert summary(cluster, RESERVED_RUN) == {"n": 8, "sum": sum(i * i for i in range(8))}
    assert while_stopped[0] == RESERVED_RUN, "nobody released it while no service ran"
    assert after == (None, [])
    assert kinds(log)[-2:] == ["succeeded", "node-released"]
    assert kinds(log).count("workflow-submitted") == 1
