"""Take-back and kills for memory on the fake cluster, through a Supervisor and `ArgoBackend`.

Take-back (spec 03): an `owner` run submitted while an `agent` run's pods fill the quota gets
its pods admitted by Kueue preempting the agent run's extra workers, whose units the others (or
their retried attempts) compute. A pod killed for its memory is retried once with the retry
memory (`podSpecPatch`), and a second kill fails the run naming that memory.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
from cluster_runs import HARNESS_ENV, Service, kinds, submitted
from fake.cluster import FakeCluster, NodeSpec
from unit_events import done_indices

from simrun_core import events as ev
from simrun_core.store import RunPaths
from simrun_core.workflow import Priority, ResourceOverride, SplitMode, TaskSpec, Workflow

AGENT_RUN = "20260101-000000-a9e171"
OWNER_RUN = "20260101-000001-0e1e11"
MEMORY_RUN = "20260101-000002-3e3017"


def squares(name: str, n: int, **settings: Any) -> Workflow:
    resources = settings.pop("resources", None)
    task = TaskSpec(
        id="squares",
        type="demo.squares",
        settings={"n": n, **settings},
        resources=resources,
    )
    return Workflow(name=name, tasks=[task])


def summary(cluster: FakeCluster, run_id: str) -> dict:
    path = RunPaths(cluster.store_dir, run_id).out("squares") / "summary.json"
    return msgspec.json.decode(path.read_bytes())


# -- take-back

AGENT_UNITS, OWNER_UNITS = 160, 20
TWO_WORKERS = ResourceOverride(workers=2)


def test_an_owner_run_takes_the_extra_workers_of_an_agent_run_back(tmp_path: Path) -> None:
    """Two nodes of 4 cores, pods of 2 processes: the agent run's 4 pods (a coordinator and
    three extra workers, two on each node) fill the quota; the owner run's one pod preempts an
    extra worker (priority 100 < 1000) rather than the agent's coordinator (200)."""
    nodes = [NodeSpec(f"node-{i}", cores=4, memory_gb=8.0) for i in (1, 2)]
    agent = squares("agent", AGENT_UNITS, sleep_s=0.1, resources=TWO_WORKERS)
    owner = squares("owner", OWNER_UNITS, sleep_s=0.05, resources=TWO_WORKERS)

    async def scenario(cluster: FakeCluster) -> tuple[list[ev.Event], list[ev.Event]]:
        async with Service(cluster, tmp_path / "db.sqlite") as service:
            event, settings = submitted(AGENT_RUN, agent, nodes, Priority.AGENT, max_pods=4)
            assert event.plans["squares"].pods == 4
            assert event.plans["squares"].shape.cores == 2
            await service.submit(event, settings)

            def all_started() -> bool:
                log = service.log(AGENT_RUN)
                workers = {e.worker for e in log if isinstance(e, ev.PodStarted)}
                return workers >= {"w0", "w1", "w2", "w3"} and done_indices(log) != []

            await service.until(all_started, "the agent run's four pods to run")
            event, settings = submitted(
                OWNER_RUN, owner, nodes, Priority.OWNER, mode=SplitMode.SINGLE_SERVER
            )
            await service.submit(event, settings)
            owner_log = await service.ended(OWNER_RUN)
            assert not service.supervisor.load(AGENT_RUN).ended, "the agent run ended too soon"
            agent_log = await service.ended(AGENT_RUN)
            return agent_log, owner_log

    with FakeCluster(tmp_path, nodes=nodes, env_overrides=HARNESS_ENV) as cluster:
        agent_log, owner_log = asyncio.run(scenario(cluster))
        preemptions = list(cluster.kueue.preemptions)
        assert cluster.errors == []
        assert kinds(agent_log)[-1] == "succeeded", kinds(agent_log)
        assert kinds(owner_log)[-1] == "succeeded", kinds(owner_log)
        assert summary(cluster, AGENT_RUN) == {
            "n": AGENT_UNITS,
            "sum": sum(i * i for i in range(AGENT_UNITS)),
        }
        assert summary(cluster, OWNER_RUN) == {
            "n": OWNER_UNITS,
            "sum": sum(i * i for i in range(OWNER_UNITS)),
        }
    assert preemptions, "Kueue preempted nothing"
    preempted = {e.worker for e in agent_log if isinstance(e, ev.PodPreempted)}
    assert preempted, kinds(agent_log)
    assert "w0" not in preempted  # the coordinator is of the base priority, never taken first
    assert not any(isinstance(e, ev.PodPreempted) for e in owner_log)
    done = done_indices(agent_log)
    assert set(done) == set(range(AGENT_UNITS))
    assert all(victim.startswith(tuple(_workflow_prefixes(agent_log))) for victim, _ in preemptions)


def _workflow_prefixes(log: list[ev.Event]) -> list[str]:
    return [e.name for e in log if isinstance(e, ev.WorkflowSubmitted)]


# -- kills for memory


def hungry(memory_mb: int) -> Workflow:
    """One pod of one process of 0.6 GiB: a limit of 1 GiB (0.125 + 0.6, whole GiB), the retry
    memory 0.9 GiB per process and 2 GiB the pod (0.125 + 0.9)."""
    override = ResourceOverride(workers=1, memory_per_worker_gb=0.6)
    return squares("hungry", 2, sleep_s=1.0, memory_mb=memory_mb, resources=override)


def memory_run(tmp_path: Path, memory_mb: int) -> tuple[list[ev.Event], list[dict]]:
    """The log of a hungry run and the pods the kubelet started, in order."""
    nodes = [NodeSpec("node-1", cores=4, memory_gb=8.0)]

    async def scenario(cluster: FakeCluster) -> list[ev.Event]:
        async with Service(cluster, tmp_path / "db.sqlite") as service:
            event, settings = submitted(
                MEMORY_RUN,
                hungry(memory_mb),
                nodes,
                Priority.STANDARD,
                mode=SplitMode.SINGLE_SERVER,
            )
            shape = event.plans["squares"].shape
            assert (shape.memory_gb, shape.retry_memory_gb) == (1, 2), shape
            await service.submit(event, settings)
            return await service.ended(MEMORY_RUN)

    with FakeCluster(tmp_path, nodes=nodes, env_overrides=HARNESS_ENV) as cluster:
        log = asyncio.run(scenario(cluster))
        assert cluster.errors == []
        started = [pod for pod in cluster.kubelet.started if _main(pod) is not None]
    return log, started


def _main(pod: dict) -> dict | None:
    """The container of the harness: the one with SIMRUN_MEMORY_PER_WORKER_GB."""
    for container in pod["spec"].get("containers") or []:
        if any(e["name"] == "SIMRUN_MEMORY_PER_WORKER_GB" for e in container.get("env") or []):
            return container
    return None


def limits(pod: dict) -> tuple[str, str]:
    """The memory limit of the harness's container and its SIMRUN_MEMORY_PER_WORKER_GB (its
    SIMRUN_MEMORY_LIMIT_GB checked to be the container's limit)."""
    container = _main(pod)
    assert container is not None
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    memory = container["resources"]["limits"]["memory"]
    assert float(env["SIMRUN_MEMORY_LIMIT_GB"]) == _gi(memory), (env, memory)
    return memory, env["SIMRUN_MEMORY_PER_WORKER_GB"]


def test_a_pod_killed_for_memory_is_retried_with_the_retry_memory(tmp_path: Path) -> None:
    log, started = memory_run(tmp_path, 750)  # above 0.6 GiB (614 MiB), below 0.9 (922 MiB)
    assert kinds(log)[-1] == "succeeded", kinds(log)
    kills = [e for e in log if isinstance(e, ev.OomKilled)]
    assert len(kills) == 1, kills
    failed = [e for e in log if isinstance(e, ev.PodFailed)]
    assert failed and failed[0].exit_code == 137 and failed[0].oom, failed
    assert len(started) == 2, [p["metadata"]["name"] for p in started]
    first, second = (limits(pod) for pod in started)
    assert _gi(first[0]) == 1 and float(first[1]) == 0.6, first
    assert _gi(second[0]) == 2 and float(second[1]) == 0.9, second
    assert summary_of(tmp_path) == {"n": 2, "sum": 1}


def test_a_second_kill_for_memory_fails_the_run_naming_the_retry_memory(tmp_path: Path) -> None:
    log, started = memory_run(tmp_path, 1000)  # above the retry memory of 0.9 GiB too
    assert kinds(log)[-1] == "failed", kinds(log)
    assert kinds(log).count("oom-killed") == 2, kinds(log)
    end = log[-1]
    assert isinstance(end, ev.Failed)
    assert "killed for memory again with the retry memory of 0.9 GiB per process" in end.message
    assert [_gi(limits(pod)[0]) for pod in started[:2]] == [1, 2]


def _gi(quantity: str) -> float:
    units = {"Gi": 1.0, "Mi": 1 / 1024, "Ki": 1 / 1024**2}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return float(quantity) / 1024**3


def summary_of(tmp_path: Path) -> dict:
    path = RunPaths(tmp_path / "store", MEMORY_RUN).out("squares") / "summary.json"
    return msgspec.json.decode(path.read_bytes())
