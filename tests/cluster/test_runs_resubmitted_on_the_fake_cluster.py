"""Whole runs on the fake cluster whose Workflow goes away or is refused, through a Supervisor
and `ArgoBackend`.

A Workflow deleted by hand under a running run: the backend reports it gone (`WorkflowGone`),
the decider ends the live attempts preempted and submits the run again, and the backend creates
the Workflow once the old pods are gone, its workers starting after their attempts so far (Argo
counts from 0 again: the pods add their first attempt, `SIMRUN_FIRST_ATTEMPTS`); the run
succeeds with the summary it would have had. A
Workflow the API refuses (422 Invalid) ends the run failed at once, naming what the API said.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cluster_runs import HARNESS_ENV, Service, kinds, submitted
from fake.cluster import FakeCluster, NodeSpec
from kubernetes_asyncio import client
from unit_events import done_indices

import simrun_api.backends.argo as argo_backend
from simrun_core import events as ev
from simrun_core import launch as contract
from simrun_core.argo import workflow_name
from simrun_core.store import RunPaths
from simrun_core.workflow import Priority, ResourceOverride, TaskSpec, Workflow

RUN = "20260101-000000-de1e7e"
REFUSED_RUN = "20260101-000000-4220fe"
UNITS = 400
NODES = [NodeSpec(f"node-{i}", cores=2, memory_gb=4.0) for i in (1, 2)]


def squares(n: int, **settings: Any) -> Workflow:
    task = TaskSpec(
        id="squares",
        type="demo.squares",
        settings={"n": n, **settings},
        resources=ResourceOverride(workers=2),
    )
    return Workflow(name="squares", tasks=[task])


def pod_attempts(cluster: FakeCluster) -> list[tuple[str, str, int]]:
    """The (task, worker, attempt) of every pod Argo created, as its harness reads it."""
    found = []
    for pod in cluster.argo.pods_created:
        main = next(c for c in pod["spec"]["containers"] if c["name"] == "main")
        env = {e["name"]: e["value"] for e in main["env"] if "value" in e}
        task = pod["metadata"]["labels"]["simrun/task"]
        found.append((task, env[contract.WORKER], contract.LaunchEnv(env).attempt))
    return found


def test_a_run_whose_workflow_is_deleted_by_hand_goes_on_and_succeeds(tmp_path: Path) -> None:
    workflow = squares(UNITS, sleep_s=0.02)

    async def scenario(cluster: FakeCluster) -> list[ev.Event]:
        async with Service(cluster, tmp_path / "db.sqlite") as service:
            event, settings = submitted(RUN, workflow, NODES, Priority.STANDARD, max_pods=2)
            assert event.plans["squares"].pods == 2
            await service.submit(event, settings)

            def both_running() -> bool:
                log = service.log(RUN)
                workers = {e.worker for e in log if isinstance(e, ev.PodStarted)}
                return workers == {"w0", "w1"} and len(done_indices(log)) > 8

            await service.until(both_running, "both pods to run")
            await delete_workflow(cluster, RUN)
            done_before = len(done_indices(service.log(RUN)))
            assert done_before < UNITS, "deleted while the units were computed"
            return await service.ended(RUN)

    with FakeCluster(tmp_path, nodes=NODES, env_overrides=HARNESS_ENV) as cluster:
        events = asyncio.run(scenario(cluster))
        assert cluster.errors == []
        created = pod_attempts(cluster)
    seen = kinds(events)
    assert seen[-1] == "succeeded", [e for e in events if not isinstance(e, ev.UNITS_EVENTS)]
    preempted = [(e.worker, e.attempt) for e in events if isinstance(e, ev.PodPreempted)]
    assert sorted(preempted) == [("w0", 0), ("w1", 0)], "the live pods went with the workflow"
    started = [(e.task, e.worker, e.attempt) for e in events if isinstance(e, ev.PodStarted)]
    assert {("squares", "w0", 1), ("squares", "w1", 1)} <= set(started), started
    assert Counter(created).most_common(1)[0][1] == 1, f"an attempt made twice: {created}"
    assert Counter(started).most_common(1)[0][1] == 1, f"an attempt started twice: {started}"
    reports = [(e.worker, e.attempt) for e in events if isinstance(e, ev.WorkerReport)]
    assert len(reports) == len(set(reports)), reports
    done = done_indices(events)
    assert sorted(done) == list(range(UNITS))
    paths = RunPaths(cluster.store_dir, RUN)
    logs = sorted(path.name for path in paths.worker_events("squares").glob("*.jsonl"))
    assert {"w0.0.jsonl", "w1.0.jsonl", "w0.1.jsonl", "w1.1.jsonl"} <= set(logs), logs
    summary = msgspec.json.decode((paths.out("squares") / "summary.json").read_bytes())
    assert summary == {"n": UNITS, "sum": sum(i * i for i in range(UNITS))}


async def delete_workflow(cluster: FakeCluster, run_id: str) -> None:
    """`kubectl delete workflow`: through the API, its pods garbage collected."""
    api = client.ApiClient(cluster.configuration())
    try:
        await client.CustomObjectsApi(api).delete_namespaced_custom_object(
            "argoproj.io", "v1alpha1", cluster.config.namespace, "workflows", workflow_name(run_id)
        )
    finally:
        await api.close()


def test_a_run_whose_workflow_went_while_the_service_was_down_goes_on(tmp_path: Path) -> None:
    """The service stops (the pods go on), the Workflow is deleted (its time to live, a hand),
    the service starts again: the decider resubmits the run taking the pods it had running as
    still running; the backend finds no Workflow and reports it gone, the decider ends those
    attempts preempted and submits again, and the Workflow is created with every worker after
    them."""
    workflow = squares(UNITS, sleep_s=0.02)
    db = tmp_path / "db.sqlite"

    async def scenario(cluster: FakeCluster) -> list[ev.Event]:
        async with Service(cluster, db) as service:
            event, settings = submitted(RUN, workflow, NODES, Priority.STANDARD, max_pods=2)
            await service.submit(event, settings)

            def both_running() -> bool:
                log = service.log(RUN)
                workers = {e.worker for e in log if isinstance(e, ev.PodStarted)}
                return workers == {"w0", "w1"} and len(done_indices(log)) > 8

            await service.until(both_running, "both pods to run")
        await delete_workflow(cluster, RUN)
        async with Service(cluster, db) as service:
            return await service.ended(RUN)

    with FakeCluster(tmp_path, nodes=NODES, env_overrides=HARNESS_ENV) as cluster:
        events = asyncio.run(scenario(cluster))
        assert cluster.errors == []
        created = pod_attempts(cluster)
    assert kinds(events)[-1] == "succeeded"
    preempted = sorted((e.worker, e.attempt) for e in events if isinstance(e, ev.PodPreempted))
    assert preempted == [("w0", 0), ("w1", 0)]
    assert Counter(created).most_common(1)[0][1] == 1, f"an attempt made twice: {created}"
    assert {("squares", "w0", 1), ("squares", "w1", 1)} <= set(created), created
    paths = RunPaths(cluster.store_dir, RUN)
    summary = msgspec.json.decode((paths.out("squares") / "summary.json").read_bytes())
    assert summary == {"n": UNITS, "sum": sum(i * i for i in range(UNITS))}


def test_a_workflow_the_cluster_refuses_fails_the_run_at_once_naming_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = argo_backend.workflow_manifest

    def invalid(*args: Any, **kwargs: Any) -> dict[str, Any]:
        manifest = built(*args, **kwargs)
        manifest["spec"]["entrypoint"] = 3  # the schema wants a string: 422 Invalid
        return manifest

    monkeypatch.setattr(argo_backend, "workflow_manifest", invalid)

    async def scenario(cluster: FakeCluster) -> list[ev.Event]:
        async with Service(cluster, tmp_path / "db.sqlite") as service:
            await service.submit(*submitted(REFUSED_RUN, squares(10), NODES, Priority.STANDARD))
            return await service.ended(REFUSED_RUN)

    with FakeCluster(tmp_path, nodes=NODES, env_overrides=HARNESS_ENV) as cluster:
        events = asyncio.run(scenario(cluster))
        assert cluster.store.list("workflows", cluster.config.namespace)[0] == []
    assert kinds(events)[-1] == "failed"
    assert "workflow-submitted" not in kinds(events)
    message = events[-1].message or ""
    assert message.startswith("the run could not be submitted: the cluster refused workflow")
    assert "(422 Invalid)" in message and "spec.entrypoint: Invalid value: 3" in message
