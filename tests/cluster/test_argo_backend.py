"""The Argo backend against the fake Kubernetes API, with the test playing Argo's controller,
Kueue and the kubelet by hand: it writes the Workflow statuses Argo would write and creates and
changes the pods Argo, Kueue and the kubelet would.

Every wait is on a condition with a timeout (`Reports.until`, `eventually`), never a sleep.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fake import FakeKubernetes
from fake.schemas import validate_workflow
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from simrun_api.app import backend_from_settings
from simrun_api.backends.argo import STOPPED, ArgoBackend, argo_backend
from simrun_api.backends.argo_nodes import (
    EXECUTOR,
    Amounts,
    NodeReserved,
    node_from,
    parse_quantity,
    pod_requests,
)
from simrun_api.backends.base import RunSubmission, workflow_name
from simrun_api.settings import ServiceSettings
from simrun_core.argo.render import render_record
from simrun_core.cluster import ClusterConfig
from simrun_core.errors import WorkflowError
from simrun_core.fold import PodRecord, RunRecord
from simrun_core.messages import BackendReport, PodChanged, WorkflowGone
from simrun_core.planner import Node
from simrun_core.plugins import load_task_types
from simrun_core.wire import PodUsage
from simrun_core.workflow import TaskSpec, Workflow

NS = "simrun"
TIMEOUT_S = 10.0
CONFIG = ClusterConfig()
TYPES = load_task_types()
PLANNED_ON = [Node(name=f"n{index}", cores=8, memory_gb=32.0) for index in (1, 2, 3)]
IMAGE = "registry.cluster.internal:5000/simrun-env:1"
RUN_A = "20260101-000000-00000a"
RUN_B = "20260101-000000-00000b"
GATE = {"name": "kueue.x-k8s.io/admission"}


def workflow_of() -> Workflow:
    """A split task `sq` (a coordinator and two extra workers) and a command task `plot`."""
    plot = {"image": "tools:1", "args": ["plot", "{input}", "{out}"], "cores": 1, "memory_gb": 2}
    return Workflow(
        name="argo-test",
        tasks=[
            TaskSpec(id="sq", type="demo.squares", settings={"n": 400}),
            TaskSpec(id="plot", type="command", settings=plot, inputs={"data": "sq.squares"}),
        ],
    )


def record_of(run_id: str) -> RunRecord:
    record = render_record(
        workflow_of(), TYPES, CONFIG, nodes=PLANNED_ON, run_id=run_id, image=IMAGE
    )
    assert record.plans["sq"].pods == 3 and record.plans["plot"].units is None
    return record


def submission(run_id: str, **fields: Any) -> RunSubmission:
    return RunSubmission(record_of(run_id), TYPES, **fields)


# -- waiting --------------------------------------------------------------------------------


class Reports:
    """The changes reported to one callback (the pods' changes, and the workflows gone), and
    waits on them."""

    def __init__(self) -> None:
        self.changes: list[PodChanged] = []
        self.gone: list[WorkflowGone] = []
        self._arrived = asyncio.Event()

    def __call__(self, report: BackendReport) -> None:
        if isinstance(report, WorkflowGone):
            self.gone.append(report)
        else:
            self.changes.append(report)
        self._arrived.set()

    def seen(self, task: str | None = None) -> list[tuple[str, str, int, str]]:
        return [
            (c.task, c.worker, c.attempt, c.phase)
            for c in self.changes
            if task is None or c.task == task
        ]

    async def until(self, ready: Callable[[], object], what: str) -> None:
        try:
            async with asyncio.timeout(TIMEOUT_S):
                while not ready():
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            raise AssertionError(f"no {what} within {TIMEOUT_S} s: {self.seen()}") from None

    async def count(self, n: int) -> list[tuple[str, str, int, str]]:
        await self.until(lambda: len(self.changes) >= n, f"{n} changes")
        return self.seen()


async def eventually(ready: Callable[[], object], what: str) -> None:
    """Poll a condition nothing reports (the store, the watch's counters) until it holds."""
    deadline = time.monotonic() + TIMEOUT_S
    while not ready():
        assert time.monotonic() < deadline, f"not {what} within {TIMEOUT_S} s"
        await asyncio.sleep(0.01)


def run(coro: Any) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(3 * TIMEOUT_S):
            return await coro

    return asyncio.run(bounded())


@pytest.fixture
def cluster() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


@asynccontextmanager
async def backend_on(cluster: FakeKubernetes, **options: Any) -> AsyncIterator[ArgoBackend]:
    backend = ArgoBackend(CONFIG, configuration=cluster.configuration(), **options)
    try:
        assert await backend.recover() == 0
        assert backend.watch is not None
        await asyncio.wait_for(backend.watch.synced.wait(), TIMEOUT_S)
        yield backend
    finally:
        await backend.close()


# -- playing Argo, Kueue and the kubelet ----------------------------------------------------


class Argo:
    """The status of one Workflow as Argo writes it, and the pods of its attempts."""

    def __init__(self, cluster: FakeKubernetes, run_id: str) -> None:
        self.store = cluster.store
        self.run_id = run_id
        self.name = workflow_name(run_id)
        self.record = record_of(run_id)
        self.nodes: dict[str, dict[str, Any]] = {}
        self.phase = "Running"

    def node_id(self, display: str) -> str:
        return f"{self.name}-{zlib.crc32(display.encode())}"

    def node(
        self,
        display: str,
        phase: str,
        *,
        exit_code: int | None = None,
        message: str | None = None,
        host: str | None = None,
    ) -> None:
        """A `Pod` node of an attempt (`<dag task>(<attempt>)`)."""
        node: dict[str, Any] = {
            "id": self.node_id(display),
            "name": f"{self.name}.{display}",
            "displayName": display,
            "type": "Pod",
            "phase": phase,
            "templateName": "worker-sq" if display.startswith("sq") else "run-plot",
        }
        if exit_code is not None:
            node["outputs"] = {"exitCode": str(exit_code)}
        if message:
            node["message"] = message
        if host:
            node["hostNodeName"] = host
        self.nodes[node["id"]] = node

    def publish(self, phase: str | None = None) -> None:
        """Write the status: the DAG node and every Pod node so far."""
        self.phase = phase or self.phase
        nodes = {
            self.name: {
                "id": self.name,
                "name": self.name,
                "displayName": self.name,
                "type": "DAG",
                "phase": self.phase,
            },
            **copy.deepcopy(self.nodes),
        }
        status = {"phase": self.phase, "nodes": nodes}

        def write(workflow: dict[str, Any]) -> None:
            workflow["status"] = status

        self.store.update("workflows", self.name, write, NS)

    def pod(
        self,
        display: str,
        task: str,
        worker: str,
        attempt: int,
        *,
        retry_memory: bool = False,
        gated: bool = True,
    ) -> str:
        """The pod Argo makes of an attempt (Kueue gates it at once); its name."""
        shape = self.record.plans[task].shape
        per_worker = shape.retry_per_worker_gb if retry_memory else shape.per_worker_gb
        memory = shape.retry_memory_gb if retry_memory else shape.memory_gb
        amounts = {"cpu": str(shape.cores), "memory": f"{memory}Gi"}
        name = f"{self.name}-{display.replace('(', '-').replace(')', '').replace(':', '-')}"
        env = {
            "SIMRUN_RUN": self.run_id,
            "SIMRUN_WORKER": worker,
            "SIMRUN_ATTEMPT": str(attempt),
            "SIMRUN_MEMORY_PER_WORKER_GB": str(per_worker),
        }
        pod: dict[str, Any] = {
            "metadata": {
                "name": name,
                "labels": {
                    "workflows.argoproj.io/workflow": self.name,
                    "workflows.argoproj.io/completed": "false",
                    "simrun/run": self.run_id,
                    "simrun/task": task,
                },
                "annotations": {
                    "workflows.argoproj.io/node-id": self.node_id(display),
                    "workflows.argoproj.io/node-name": f"{self.name}.{display}",
                },
            },
            "spec": {
                "containers": [
                    {
                        "name": "wait",
                        "image": "argoexec:v4.1.6",
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                    },
                    {
                        "name": "main",
                        "image": IMAGE,
                        "env": [{"name": k, "value": v} for k, v in env.items()],
                        "resources": {"requests": amounts, "limits": dict(amounts)},
                    },
                ],
                "restartPolicy": "Never",
            },
        }
        if gated:
            pod["spec"]["schedulingGates"] = [dict(GATE)]
        self.store.create("pods", pod, NS)
        return name

    def admit(self, pod: str, host: str) -> None:
        """Kueue removes the gate, the scheduler binds the pod."""

        def admitted(obj: dict[str, Any]) -> None:
            obj["spec"].pop("schedulingGates", None)
            obj["spec"]["nodeName"] = host

        self.store.update("pods", pod, admitted, NS)

    def pod_phase(self, pod: str, phase: str) -> None:
        self.store.update_status("pods", pod, {"phase": phase}, NS)

    def pods(self) -> list[str]:
        items, _ = self.store.list("pods", NS, f"workflows.argoproj.io/workflow={self.name}")
        return [item["metadata"]["name"] for item in items]


# -- submit -----------------------------------------------------------------------------------


def test_submit_creates_one_valid_workflow_also_for_a_second_submit_and_a_new_backend(
    cluster: FakeKubernetes,
) -> None:
    async def scenario() -> None:
        async with backend_on(cluster) as backend:
            name = await backend.submit(submission(RUN_A), Reports())
            assert name == workflow_name(RUN_A)
            stored = cluster.store.get("workflows", name, NS)
            assert validate_workflow(stored).errors == []
            assert stored["metadata"]["labels"] == {"simrun/run": RUN_A}
            assert [t["name"] for t in stored["spec"]["templates"]] == [
                "dag",
                "worker-sq",
                "run-plot",
            ]
            version = cluster.store.resource_version
            assert await backend.submit(submission(RUN_A), Reports()) == name
            assert backend.has(RUN_A)
            async with backend_on(cluster) as again:
                assert await again.submit(submission(RUN_A), Reports()) == name
                assert again.has(RUN_A)
            assert cluster.store.resource_version == version, "nothing created or changed"
            posts = [r for r in cluster.requests if r.method == "POST"]
            assert len(posts) == 1, "each submit read it, only the first created it"
            assert backend.capabilities.retries_pods and backend.capabilities.pods_outlive_service

    run(scenario())


def test_a_workflow_that_cannot_be_built_is_refused_before_anything_is_created(
    cluster: FakeKubernetes,
) -> None:
    async def scenario() -> None:
        async with backend_on(cluster) as backend:
            record = record_of(RUN_A)
            record.image = None
            with pytest.raises(ValueError, match="no image"):
                await backend.submit(RunSubmission(record, TYPES), Reports())
            assert cluster.store.list("workflows", NS)[0] == []
            assert not backend.has(RUN_A)

    run(scenario())


# -- the phases of the attempts --------------------------------------------------------------


def test_status_changes_come_out_in_order_with_their_facts(cluster: FakeKubernetes) -> None:
    argo = Argo(cluster, RUN_A)
    shape = argo.record.plans["sq"].shape

    async def scenario() -> None:
        async with backend_on(cluster) as backend:
            reports = Reports()
            await backend.submit(submission(RUN_A), reports)
            w0 = argo.pod("sq-w0(0)", "sq", "w0", 0)
            argo.node("sq-w0(0)", "Pending", message="SchedulingGated")
            argo.publish()
            assert await reports.count(1) == [("sq", "w0", 0, "pending")]

            argo.node("sq-w0(0)", "Pending", message="the workflow changed, the pod did not")
            argo.publish()
            argo.admit(w0, "n1")  # the gate is removed: Argo sees the pod scheduled
            argo.node("sq-w0(0)", "Pending", host="n1", message="ContainerCreating")
            argo.publish()
            assert (await reports.count(2))[1] == ("sq", "w0", 0, "admitted")

            argo.pod_phase(w0, "Running")
            argo.node("sq-w0(0)", "Running", host="n1")
            argo.publish()
            assert (await reports.count(3))[2] == ("sq", "w0", 0, "running")
            assert reports.changes[2].node == "n1"

            oom = "main: OOMKilled (exit code 137)"
            argo.node("sq-w0(0)", "Failed", exit_code=137, message=oom, host="n1")
            argo.pod("sq-w0(1)", "sq", "w0", 1, retry_memory=True)  # Argo's podSpecPatch
            argo.node("sq-w0(1)", "Pending")
            argo.publish()
            assert (await reports.count(5))[3:] == [
                ("sq", "w0", 0, "failed"),
                ("sq", "w0", 1, "pending"),
            ]
            failed, retried = reports.changes[3:5]
            assert (failed.exit_code, failed.oom, failed.message) == (137, True, oom)
            assert failed.on_retry_memory is False, "attempt 0 ran with the first memory"
            assert retried.on_retry_memory is True, "attempt 1 got the retry memory"

            argo.node("sq-w0(1)", "Error", message="pod deleted")  # Kueue preempted it
            argo.pod("sq-w0(2)", "sq", "w0", 2, gated=False)  # the first memory again
            argo.node("sq-w0(2)", "Succeeded", exit_code=0, host="n2")  # seen only at its end
            argo.pod("sq-extra(0:1)(0)", "sq", "w1", 0, gated=False)
            argo.node(
                "sq-extra(0:1)(0)", "Failed", exit_code=3, message="main: Error (exit code 3)"
            )
            argo.publish()
            assert (await reports.count(14))[5:] == [
                ("sq", "w0", 1, "preempted"),
                ("sq", "w0", 2, "pending"),
                ("sq", "w0", 2, "admitted"),
                ("sq", "w0", 2, "running"),
                ("sq", "w0", 2, "succeeded"),
                ("sq", "w1", 0, "pending"),
                ("sq", "w1", 0, "admitted"),
                ("sq", "w1", 0, "running"),
                ("sq", "w1", 0, "failed"),
            ]
            preempted, *_, succeeded = reports.changes[5:10]
            assert (preempted.exit_code, preempted.message) == (None, "pod deleted")
            assert (succeeded.exit_code, succeeded.on_retry_memory) == (0, False)
            assert reports.changes[8].node == "n2"
            assert reports.changes[13].exit_code == 3 and not reports.changes[13].oom
            assert backend.has(RUN_A)

            argo.pod("plot(0)", "plot", "plot", 0, gated=False)
            argo.node("plot(0)", "Succeeded", exit_code=0, host="n3")
            argo.publish("Succeeded")
            await reports.until(lambda: len(reports.seen("plot")) == 4, "plot succeeded")
            await eventually(lambda: not backend.has(RUN_A), "the run ended")
            assert len(reports.changes) == 18, "nothing twice"
            assert shape.retry_per_worker_gb != shape.per_worker_gb

    run(scenario())


def test_a_new_backend_reports_only_what_the_record_does_not_know(
    cluster: FakeKubernetes,
) -> None:
    """A service started again takes the run over: the attempts its record has are not told
    again, only what happened after; a task done is not told at all."""
    argo = Argo(cluster, RUN_A)

    async def scenario() -> None:
        async with backend_on(cluster) as first:
            await first.submit(submission(RUN_A), Reports())
        argo.pod("sq-w0(0)", "sq", "w0", 0, gated=False)
        argo.node("sq-w0(0)", "Failed", exit_code=143, message="main: Error (exit code 143)")
        argo.pod("sq-w0(1)", "sq", "w0", 1, gated=False)
        argo.node("sq-w0(1)", "Running", host="n1")
        argo.node("sq-extra(0:1)(0)", "Running", host="n2")
        argo.publish()
        record = record_of(RUN_A)
        record.pods = {
            "sq": {
                "w0": PodRecord(worker="w0", attempt=1, state="running", node="n1"),
                "w1": PodRecord(worker="w1", attempt=0, state="pending"),
            }
        }
        async with backend_on(cluster) as again:
            reports = Reports()
            version = cluster.store.resource_version
            await again.submit(RunSubmission(record, TYPES), reports)
            assert cluster.store.resource_version == version
            assert reports.seen() == [("sq", "w1", 0, "admitted"), ("sq", "w1", 0, "running")]
            argo.node("sq-w0(1)", "Succeeded", exit_code=0, host="n1")
            argo.publish()
            await reports.count(3)
            assert reports.seen()[2:] == [("sq", "w0", 1, "succeeded")]

            done = Reports()
            await again.submit(RunSubmission(record, TYPES, done=frozenset({"sq"})), done)
            argo.node("plot(0)", "Pending")
            argo.publish()
            await done.count(1)
            assert done.seen() == [("plot", "plot", 0, "pending")], "nothing of the done task"

    run(scenario())


def template_env(workflow: dict[str, Any], template: str) -> dict[str, str]:
    found = next(t for t in workflow["spec"]["templates"] if t["name"] == template)
    return {e["name"]: e.get("value", "") for e in found["container"]["env"]}


def first_attempts(workflow: dict[str, Any]) -> dict[str, dict[str, int]]:
    return json.loads(
        workflow["metadata"].get("annotations", {}).get("simrun/first-attempts", "{}")
    )


def test_a_workflow_deleted_under_a_live_run_is_reported_and_not_created_again_by_the_backend(
    cluster: FakeKubernetes,
) -> None:
    """Deleted by hand while its pods run: the backend reports the fact (`WorkflowGone`), not
    the ends of its attempts one by one, and creates nothing by itself; the decider's
    submission that follows (the live attempts preempted in the record, every worker after
    them, the retry memory of w2) creates it, once the pods left of the deleted one are gone,
    and the new Workflow's attempts are numbered from there."""
    argo = Argo(cluster, RUN_A)

    async def scenario() -> None:
        async with backend_on(cluster) as backend:
            reports = Reports()
            await backend.submit(submission(RUN_A), reports)
            first_uid = cluster.store.get("workflows", argo.name, NS)["metadata"]["uid"]
            orphan = argo.pod("sq-w0(0)", "sq", "w0", 0, gated=False)  # owned by nothing
            argo.node("sq-w0(0)", "Running", host="n1")
            argo.node("sq-extra(0:1)(0)", "Pending")
            argo.publish()
            await reports.count(4)
            cluster.store.delete("workflows", argo.name, NS)
            await reports.until(lambda: reports.gone, "the workflow reported gone")
            assert reports.gone == [WorkflowGone(name=argo.name)]
            assert len(reports.changes) == 4, "the fact covers the live attempts"
            assert backend.has(RUN_A)
            await backend.retry(RUN_A, "sq", "w2", 1, True)  # Argo retries: nothing kept
            assert cluster.store.list("workflows", NS)[0] == [], "not created by the backend"

            record = record_of(RUN_A)
            record.pods = {
                "sq": {
                    "w0": PodRecord(worker="w0", attempt=0, state="preempted"),
                    "w1": PodRecord(worker="w1", attempt=0, state="preempted"),
                    "w2": PodRecord(worker="w2", attempt=0, state="failed", oom=True),
                }
            }
            again = RunSubmission(
                record,
                TYPES,
                next_attempts={("sq", "w0"): 1, ("sq", "w1"): 1, ("sq", "w2"): 1},
                retry_memory=frozenset({("sq", "w2")}),
            )
            await backend.submit(again, reports)
            created = cluster.store.get("workflows", argo.name, NS)
            assert created["metadata"]["uid"] != first_uid
            assert orphan not in argo.pods(), "the pod left of the deleted one was deleted"
            assert validate_workflow(created).errors == []
            assert first_attempts(created) == {"sq": {"w0": 1, "w1": 1, "w2": 1}}
            env = template_env(created, "worker-sq")
            assert env["SIMRUN_ATTEMPT"] == "{{retries}}"
            assert env["SIMRUN_FIRST_ATTEMPTS"] == "w0=1\nw1=1\nw2=1"
            patch = next(t for t in created["spec"]["templates"] if t["name"] == "worker-sq")
            assert "inputs.parameters.worker == 'w2'" in patch["podSpecPatch"]
            assert "'w0'" not in patch["podSpecPatch"]

            argo.nodes.clear()  # the new Workflow's status: Argo counts from 0 again
            argo.node("sq-w0(0)", "Running", host="n2")
            argo.publish("Running")
            await reports.count(7)
            assert reports.seen()[4:] == [
                ("sq", "w0", 1, "pending"),
                ("sq", "w0", 1, "admitted"),
                ("sq", "w0", 1, "running"),
            ]
            used = [(c.task, c.worker, c.attempt, c.phase) for c in reports.changes]
            assert len(used) == len(set(used)), "no attempt told a phase twice"
            assert len(reports.gone) == 1

    run(scenario())


def test_a_workflow_of_a_stopped_run_deleted_fails_its_live_attempts_and_stays_gone(
    cluster: FakeKubernetes,
) -> None:
    argo = Argo(cluster, RUN_A)

    async def scenario() -> None:
        async with backend_on(cluster) as backend:
            reports = Reports()
            await backend.submit(submission(RUN_A), reports)
            cluster.store.update(
                "workflows", argo.name, lambda w: w["spec"].update(shutdown="Stop"), NS
            )
            argo.node("sq-w0(0)", "Running", host="n1")
            argo.publish()
            await reports.count(3)
            cluster.store.delete("workflows", argo.name, NS)
            await reports.count(4)
            gone = reports.changes[3]
            assert (gone.phase, gone.exit_code, gone.message) == (
                "failed",
                None,
                "its workflow was deleted",
            )
            await eventually(lambda: not backend.has(RUN_A), "the run ended")
            await asyncio.sleep(0.3)
            assert cluster.store.list("workflows", NS)[0] == [], "not created again"

    run(scenario())


def test_a_submission_without_its_workflow_while_the_record_has_live_attempts_reports_it_gone(
    cluster: FakeKubernetes,
) -> None:
    """A service started again after the Workflow expired: the decider resubmits taking the
    pod it thought running as running; the backend finds no Workflow and reports that fact,
    creating nothing. The decider's next submission (that attempt preempted) creates it, every
    worker after the record's attempts, the worker killed for memory with the retry memory."""

    async def scenario() -> None:
        record = record_of(RUN_A)
        record.pods = {
            "sq": {
                "w0": PodRecord(worker="w0", attempt=2, state="running", node="n1"),
                "w1": PodRecord(worker="w1", attempt=0, state="failed", exit_code=137, oom=True),
            }
        }
        resubmitted = RunSubmission(
            record,
            TYPES,
            next_attempts={("sq", "w0"): 2, ("sq", "w1"): 1},
            retry_memory=frozenset({("sq", "w1")}),
        )
        async with backend_on(cluster) as backend:
            reports = Reports()
            assert await backend.submit(resubmitted, reports) == workflow_name(RUN_A)
            assert reports.gone == [WorkflowGone(name=workflow_name(RUN_A))]
            assert reports.changes == []
            assert cluster.store.list("workflows", NS)[0] == []

            record.pods["sq"]["w0"].state = "preempted"
            after = RunSubmission(
                record,
                TYPES,
                next_attempts={("sq", "w0"): 3, ("sq", "w1"): 1},
                retry_memory=frozenset({("sq", "w1")}),
            )
            await backend.submit(after, reports)
            created = cluster.store.get("workflows", workflow_name(RUN_A), NS)
            assert validate_workflow(created).errors == []
            assert first_attempts(created) == {"sq": {"w0": 3, "w1": 1}}
            assert reports.changes == [] and len(reports.gone) == 1
            patch = next(t for t in created["spec"]["templates"] if t["name"] == "worker-sq")
            assert "inputs.parameters.worker == 'w1'" in patch["podSpecPatch"]

            done = RunSubmission(record_of(RUN_B), TYPES, done=frozenset({"sq"}))
            await backend.submit(done, Reports())
            only = cluster.store.get("workflows", workflow_name(RUN_B), NS)
            dag = next(t for t in only["spec"]["templates"] if t["name"] == "dag")["dag"]
            assert [t["name"] for t in dag["tasks"]] == ["plot"]
            assert "dependencies" not in dag["tasks"][0]

    run(scenario())


def test_a_workflow_the_api_refuses_is_a_workflow_error_naming_what_it_said(
    cluster: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """422 Invalid and 400 BadRequest are refusals for good (the run fails with them); 409 is
    the run submitted; a 5xx is raised as it is (the actor tries again)."""
    import simrun_api.backends.argo as argo_module

    built = argo_module.workflow_manifest
    breaking: dict[str, Any] = {}

    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        manifest = built(*args, **kwargs)
        manifest["spec"].update(breaking)
        return manifest

    monkeypatch.setattr(argo_module, "workflow_manifest", broken)

    async def scenario() -> None:
        async with backend_on(cluster) as backend:
            breaking["entrypoint"] = 3
            with pytest.raises(WorkflowError) as refused:
                await backend.submit(submission(RUN_A), Reports())
            message = str(refused.value)
            assert message.startswith("the cluster refused workflow simrun-20260101-000000-00000a")
            assert "(422 Invalid)" in message
            assert "spec.entrypoint: Invalid value: 3" in message
            assert message.count("spec.entrypoint: Invalid value") == 1, "the cause once"

            breaking.clear()
            breaking["entrypointt"] = "dag"
            with pytest.raises(WorkflowError, match=r"\(400 BadRequest\).*unknown field"):
                await backend.submit(submission(RUN_A), Reports())
            assert cluster.store.list("workflows", NS)[0] == []
            assert not backend.has(RUN_A)

            breaking.clear()
            unavailable = ApiException(status=503, reason="Service Unavailable")
            create = client.CustomObjectsApi.create_namespaced_custom_object

            async def failing(*args: Any, **kwargs: Any) -> Any:
                raise unavailable

            monkeypatch.setattr(client.CustomObjectsApi, "create_namespaced_custom_object", failing)
            with pytest.raises(ApiException) as raised:
                await backend.submit(submission(RUN_A), Reports())
            assert raised.value.status == 503
            monkeypatch.setattr(client.CustomObjectsApi, "create_namespaced_custom_object", create)
            assert await backend.submit(submission(RUN_A), Reports()) == workflow_name(RUN_A)

    run(scenario())


# -- the watch ------------------------------------------------------------------------------


def test_cuts_and_a_410_lose_no_transition_and_double_none(cluster: FakeKubernetes) -> None:
    a, b = Argo(cluster, RUN_A), Argo(cluster, RUN_B)

    async def scenario() -> None:
        async with backend_on(cluster, poll_s=60.0) as backend:
            watch = backend.watch
            assert watch is not None
            ra, rb = Reports(), Reports()
            await backend.submit(submission(RUN_A), ra)
            await backend.submit(submission(RUN_B), rb)
            a.node("sq-w0(0)", "Pending")
            a.publish()
            b.node("plot(0)", "Pending")
            b.publish()
            await ra.count(1)
            await rb.count(1)

            watches = len(cluster.watch_requests("workflows"))
            assert cluster.cut_watches() == 1  # clean: as the server's own timeout
            a.node("sq-w0(0)", "Running", host="n1")  # written while no watch is open
            a.publish()
            await ra.count(3)
            resumed = cluster.watch_requests("workflows")[watches:]
            assert len(resumed) == 1 and resumed[0].query["resourceVersion"] != ""

            assert cluster.cut_watches(abrupt=True) == 1  # the connection dropped
            a.node("sq-w0(0)", "Failed", exit_code=3, message="main: Error (exit code 3)")
            a.publish()
            b.node("plot(0)", "Running", host="n2")
            b.publish()
            await ra.count(4)
            await rb.count(3)

            assert cluster.cut_watches() == 1
            a.node("sq-extra(0:1)(0)", "Running", host="n2")
            a.publish()
            b.node("plot(0)", "Succeeded", exit_code=0, host="n2")
            b.publish("Succeeded")
            cluster.store.compact()  # the version the watch had is gone: 410, then a list
            await ra.count(7)
            await rb.count(4)
            await eventually(lambda: watch.lists == 2, "listed after the 410")
            assert watch.gone == 1

            assert ra.seen() == [
                ("sq", "w0", 0, "pending"),
                ("sq", "w0", 0, "admitted"),
                ("sq", "w0", 0, "running"),
                ("sq", "w0", 0, "failed"),
                ("sq", "w1", 0, "pending"),
                ("sq", "w1", 0, "admitted"),
                ("sq", "w1", 0, "running"),
            ]
            assert rb.seen() == [
                ("plot", "plot", 0, "pending"),
                ("plot", "plot", 0, "admitted"),
                ("plot", "plot", 0, "running"),
                ("plot", "plot", 0, "succeeded"),
            ]
            await eventually(lambda: not backend.has(RUN_B), "run B ended")
            await backend.submit(submission(RUN_B), rb)  # again: nothing twice
            assert len(rb.changes) == 4

            cluster.cut_watches()
            a.node("sq-extra(1:2)(0)", "Pending")
            a.publish()
            cluster.store.compact()  # a second 410: the list diffs both runs again
            await ra.count(8)
            await eventually(lambda: watch.lists == 3, "listed again")
            assert ra.seen()[7:] == [("sq", "w2", 0, "pending")]
            assert len(rb.changes) == 4, "nothing of the list is told twice"

    run(scenario())


def test_a_bookmark_moves_the_version_a_watch_resumes_from(cluster: FakeKubernetes) -> None:
    argo = Argo(cluster, RUN_A)

    async def scenario() -> None:
        async with backend_on(cluster, poll_s=60.0) as backend:
            watch = backend.watch
            assert watch is not None
            reports = Reports()
            await backend.submit(submission(RUN_A), reports)
            argo.node("sq-w0(0)", "Pending")
            argo.publish()
            await reports.count(1)
            cluster.store.create("configmaps", {"metadata": {"name": "elsewhere"}}, NS)
            assert cluster.store.bookmark("workflows") == 1
            latest = str(cluster.store.resource_version)
            await eventually(lambda: watch.resource_version == latest, "the bookmark taken")
            cluster.store.compact()  # older versions are gone, the bookmark's is not
            cluster.cut_watches()
            argo.node("sq-w0(0)", "Running", host="n1")
            argo.publish()
            await reports.count(3)
            assert watch.gone == 0 and watch.lists == 1, "resumed without a list"
            resumed = cluster.watch_requests("workflows")[-1]
            assert resumed.query["resourceVersion"] == latest

    run(scenario())


def test_a_watch_that_keeps_failing_falls_back_to_a_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeKubernetes(bookmark_interval_s=0.05) as cluster:  # a watch that works says so soon
        _fails_then_polls(cluster, monkeypatch)


def _fails_then_polls(cluster: FakeKubernetes, monkeypatch: pytest.MonkeyPatch) -> None:
    argo = Argo(cluster, RUN_A)
    failing = {"watch": True}
    original = client.CustomObjectsApi.list_namespaced_custom_object

    async def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("watch") and failing["watch"]:
            raise ApiException(status=500, reason="Internal Server Error")
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(client.CustomObjectsApi, "list_namespaced_custom_object", flaky)

    async def scenario() -> None:
        async with backend_on(cluster, poll_s=0.1) as backend:
            watch = backend.watch
            assert watch is not None
            reports = Reports()
            await backend.submit(submission(RUN_A), reports)
            argo.node("sq-w0(0)", "Pending")
            argo.publish()
            await reports.count(1)
            assert watch.failures >= 3 and watch.lists >= 2, "reported by a poll"
            failing["watch"] = False
            await eventually(lambda: watch.failures == 0, "a watch open again")
            lists = watch.lists
            argo.node("sq-w0(0)", "Running", host="n1")
            argo.publish()
            await reports.count(3)
            assert reports.seen() == [
                ("sq", "w0", 0, "pending"),
                ("sq", "w0", 0, "admitted"),
                ("sq", "w0", 0, "running"),
            ]
            assert watch.lists == lists, "the watch, not a poll"

    run(scenario())


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_stops_the_workflow_deletes_gated_pods_and_reports_the_ends(
    cluster: FakeKubernetes,
) -> None:
    argo = Argo(cluster, RUN_A)

    async def scenario() -> None:
        async with backend_on(cluster, settle_s=0.5) as backend:
            reports = Reports()
            await backend.submit(submission(RUN_A), reports)
            w0 = argo.pod("sq-w0(0)", "sq", "w0", 0)
            argo.admit(w0, "n1")
            argo.pod_phase(w0, "Running")
            argo.node("sq-w0(0)", "Running", host="n1")
            extras = [argo.pod(f"sq-extra({i}:{i + 1})(0)", "sq", f"w{i + 1}", 0) for i in (0, 1)]
            for i in (0, 1):
                argo.node(f"sq-extra({i}:{i + 1})(0)", "Pending")
            argo.publish()
            await reports.count(5)

            cancelling = asyncio.create_task(backend.cancel(RUN_A))

            def stopped() -> bool:
                workflow = cluster.store.get("workflows", argo.name, NS)
                return workflow["spec"].get("shutdown") == "Stop" and argo.pods() == [w0]

            await eventually(stopped, "the workflow stopped and its gated pods deleted")
            assert not cancelling.done(), "the running pod is not gone yet"
            assert not backend.has(RUN_A)
            # Argo ends the running pod and fails its node (no exit code: not a preemption)
            argo.pod_phase(w0, "Failed")
            argo.node("sq-w0(0)", "Failed", message="workflow shutdown with strategy:  Stop")
            argo.publish("Failed")
            await asyncio.wait_for(cancelling, TIMEOUT_S)
            ends = [(c.worker, c.phase, c.exit_code, c.message) for c in reports.changes[5:]]
            assert ends == [
                ("w0", "failed", None, "workflow shutdown with strategy:  Stop"),
                ("w1", "failed", None, STOPPED),  # their nodes never changed: the pods are gone
                ("w2", "failed", None, STOPPED),
            ]
            assert argo.pods() == [w0] and not set(extras) & set(argo.pods())
            await backend.cancel(RUN_A)  # again: nothing left to do
            await backend.retry(RUN_A, "sq", "w0", 1, False)  # Argo retries: a no-op
            assert len(reports.changes) == 8

    run(scenario())


def test_cancel_of_a_run_without_a_workflow_and_a_cancel_that_times_out(
    cluster: FakeKubernetes,
) -> None:
    argo = Argo(cluster, RUN_A)

    async def scenario() -> None:
        async with backend_on(cluster, cancel_timeout_s=0.3, settle_s=0.1) as backend:
            await backend.cancel(RUN_B)  # never submitted, no workflow: nothing to do
            await backend.submit(submission(RUN_A), Reports())
            w0 = argo.pod("sq-w0(0)", "sq", "w0", 0)
            argo.admit(w0, "n1")
            argo.pod_phase(w0, "Running")
            with pytest.raises(TimeoutError, match="still there"):
                await backend.cancel(RUN_A)
            assert argo.pods() == [w0]

    run(scenario())


# -- nodes, servers, reservations, logs -------------------------------------------------------


def worker_node(
    name: str,
    cpu: str = "8",
    memory: str = "32Gi",
    *,
    worker: bool = True,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, **(extra or {})}
    node: dict[str, Any] = {
        "metadata": {"name": name, "labels": {"simrun/worker": "true"} if worker else {}},
        "spec": {},
        "status": {"allocatable": allocatable, "capacity": dict(allocatable)},
    }
    if taints:
        node["spec"]["taints"] = taints
    if unschedulable:
        node["spec"]["unschedulable"] = True
    return node


def plain_pod(
    name: str,
    node: str,
    requests: dict[str, str],
    *,
    phase: str = "Running",
    init: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [{"name": "c", "image": "x", "resources": {"requests": requests}}],
    }
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec, "phase": phase}


def test_pod_requests_count_as_the_scheduler_counts_them() -> None:
    assert parse_quantity("100m") == parse_quantity("0.1")
    assert parse_quantity("1.5Gi") == 1.5 * 1024**3
    assert parse_quantity("1e3") == 1000 and parse_quantity(2) == 2
    with pytest.raises(ValueError):
        parse_quantity("lots")

    def container(cpu: str, memory: str, **fields: str) -> dict[str, Any]:
        return {"name": cpu, "resources": {"requests": {"cpu": cpu, "memory": memory}}, **fields}

    pod = {
        "spec": {
            "initContainers": [
                container("3", "1Gi"),  # alone, before the containers: counts only if larger
                container("500m", "256Mi", restartPolicy="Always"),  # a sidecar: keeps running
                container("1", "6Gi"),  # runs beside the sidecar
            ],
            "containers": [
                container("2", "2Gi"),
                {"name": "l", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
            ],
            "overhead": {"cpu": "250m", "memory": "128Mi"},
        }
    }
    # containers 3 cores + 3 GiB, plus the sidecar: 3.5 + 3.25; init: 3 cores, 6.25 GiB
    assert pod_requests(pod) == Amounts(3.75, 6.25 + 0.125, 0.0)


def test_node_capacity_is_allocatable_less_the_executor_and_other_pods() -> None:
    used = Amounts(0.5, 1.0, 0.0)
    node = node_from(worker_node("n1"), used)
    assert node == Node(
        name="n1",
        cores=7,
        memory_gb=30.0,
        gpus=0,
        reserved_by=None,
        allocatable_cores=7.5,
        allocatable_memory_gb=31.0,
    )
    exact = node_from(worker_node("n2", cpu="8100m", memory="32.25Gi"))
    assert exact is not None and (exact.cores, exact.memory_gb) == (8, 32.0), "fits exactly"
    assert Amounts(0.1, 0.25) == EXECUTOR


def test_nodes_and_servers_of_the_cluster(cluster: FakeKubernetes) -> None:
    store = cluster.store
    store.create("nodes", worker_node("n1"))
    store.create("nodes", worker_node("n2", taints=[{"key": "x", "effect": "NoSchedule"}]))
    store.create("nodes", worker_node("n3", unschedulable=True))
    reserved = {"key": "simrun/reserved", "value": RUN_B, "effect": "NoExecute"}
    store.create(
        "nodes",
        worker_node("n4", taints=[reserved, {"key": "y", "effect": "PreferNoSchedule"}]),
    )
    store.update(
        "nodes", "n4", lambda n: n["metadata"]["labels"].update({"simrun/reserved": RUN_B})
    )
    store.create("nodes", worker_node("n5", worker=False))
    store.create("nodes", worker_node("n6", cpu="16", memory="64Gi", extra={"nvidia.com/gpu": "2"}))

    def add(pod: dict[str, Any], namespace: str = "kube-system") -> None:
        phase = pod.pop("phase")
        store.create("pods", pod, namespace)
        store.update_status("pods", pod["metadata"]["name"], {"phase": phase}, namespace)

    add(plain_pod("nfs", "n1", {"cpu": "500m", "memory": "1Gi"}))
    add(plain_pod("monitor", "n1", {"cpu": "250m", "memory": "512Mi"}, labels={"app": "m"}))
    add(plain_pod("done", "n1", {"cpu": "4", "memory": "16Gi"}, phase="Succeeded"))
    add(plain_pod("gpu-plugin", "n6", {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}))
    argo = Argo(cluster, RUN_A)
    w0 = argo.pod("sq-w0(0)", "sq", "w0", 0, gated=False)
    argo.admit(w0, "n1")
    argo.pod_phase(w0, "Running")
    plot = argo.pod("plot(0)", "plot", "plot", 0, gated=False)
    argo.admit(plot, "n6")

    async def scenario() -> None:
        async with backend_on(cluster) as backend:
            nodes = {node.name: node for node in await backend.nodes()}
            assert sorted(nodes) == ["n1", "n4", "n6"]
            assert (nodes["n1"].cores, nodes["n1"].memory_gb) == (7, 30.0)  # 8 - .75 - .1
            assert nodes["n1"].allocatable_cores == 7.25
            assert nodes["n4"].reserved_by == RUN_B and nodes["n4"].cores == 7
            assert (nodes["n6"].cores, nodes["n6"].memory_gb, nodes["n6"].gpus) == (14, 62.0, 1)
            servers = {server.name: server for server in await backend.servers()}
            assert servers["n1"].pods == [
                PodUsage(
                    run_id=RUN_A, task_id="sq", pod="w0-0", phase="running", cores=8, memory_gb=3
                )
            ]
            assert [p.pod for p in servers["n6"].pods] == ["plot-0"]
            assert servers["n6"].pods[0].phase == "pending"
            assert servers["n4"].pods == [] and servers["n4"].reserved_by == RUN_B
            assert (servers["n1"].cores, servers["n1"].memory_gb) == (7, 30.0)

    run(scenario())


def test_reservations_are_guarded_and_never_take_another_run_s(
    cluster: FakeKubernetes, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = cluster.store
    other = {"key": "maintenance", "value": "soon", "effect": "PreferNoSchedule"}
    store.create("nodes", worker_node("n1", taints=[other]))
    store.create("nodes", worker_node("n2"))
    original = client.CoreV1Api.patch_node
    interfere = {"times": 1}

    async def racing(self: Any, name: str, body: Any, **kwargs: Any) -> Any:
        """Another writer changes the node between the backend's read and its patch."""
        if interfere["times"]:
            interfere["times"] -= 1
            store.update("nodes", name, lambda n: n["metadata"]["labels"].update({"zone": "a"}))
        return await original(self, name, body, **kwargs)

    monkeypatch.setattr(client.CoreV1Api, "patch_node", racing)

    def taints(name: str) -> list[dict[str, str]]:
        return store.get("nodes", name)["spec"].get("taints") or []

    def node_labels(name: str) -> dict[str, str]:
        return store.get("nodes", name)["metadata"]["labels"]

    async def scenario() -> None:
        async with backend_on(cluster) as backend:
            await backend.reserve("n1", RUN_A)  # the first patch is stale: read again
            assert interfere["times"] == 0
            assert taints("n1") == [
                other,
                {"key": "simrun/reserved", "value": RUN_A, "effect": "NoExecute"},
            ]
            assert node_labels("n1") == {
                "simrun/worker": "true",
                "zone": "a",
                "simrun/reserved": RUN_A,
            }
            version = store.resource_version
            await backend.reserve("n1", RUN_A)  # reserved already: nothing written
            assert store.resource_version == version
            with pytest.raises(NodeReserved, match=RUN_A):
                await backend.reserve("n1", RUN_B)
            await backend.release("n1", RUN_B)  # a late release of another run: nothing
            assert store.resource_version == version
            [node] = [n for n in await backend.nodes() if n.name == "n1"]
            assert node.reserved_by == RUN_A
            await backend.release("n1", RUN_A)
            assert taints("n1") == [other]
            assert "simrun/reserved" not in node_labels("n1")
            await backend.reserve("n2", RUN_B)
            await backend.release("n2", RUN_B)
            assert taints("n2") == [] and "simrun/reserved" not in node_labels("n2")
            with pytest.raises(KeyError):
                await backend.reserve("nowhere", RUN_A)
            await backend.release("nowhere", RUN_A)  # a node that is gone holds nothing

    run(scenario())


def test_logs_of_a_task_by_pod_name(cluster: FakeKubernetes) -> None:
    argo = Argo(cluster, RUN_A)
    first = argo.pod("plot(0)", "plot", "plot", 0, gated=False)
    second = argo.pod("plot(1)", "plot", "plot", 1, gated=False)
    waiting = argo.pod("sq-w0(0)", "sq", "w0", 0, gated=False)
    argo.pod("sq-extra(0:1)(0)", "sq", "w1", 0)  # gated: on no node yet
    for pod in (first, second, waiting):
        argo.admit(pod, "n1")
    cluster.store.append_log(NS, first, "main", "attempt=0 one\ntwo\n")
    cluster.store.append_log(NS, second, "main", "attempt=1\n" + "x" * 100 + "\nlast\n")
    cluster.store.append_log(NS, second, "wait", "not the task's output\n")
    other = Argo(cluster, RUN_B)
    cluster.store.append_log(NS, other.pod("plot(0)", "plot", "plot", 0, gated=False), "main", "b")

    async def scenario() -> None:
        async with backend_on(cluster) as backend:
            logs = await backend.logs(RUN_A, "plot")
            assert logs == {
                "plot-0": "attempt=0 one\ntwo\n",
                "plot-1": f"attempt=1\n{'x' * 100}\nlast\n",
            }
            assert list(logs) == ["plot-0", "plot-1"]
            assert await backend.logs(RUN_A, "plot", tail_lines=1) == {
                "plot-0": "two\n",
                "plot-1": "last\n",
            }
            limited = await backend.logs(RUN_A, "plot", limit_bytes=5)
            assert limited == {"plot-0": "attem", "plot-1": "attem"}
            assert await backend.logs(RUN_A, "sq") == {"w0-0": "", "w1-0": ""}, "not started"
            assert await backend.logs(RUN_A, "nothing") == {}

    run(scenario())


# -- configuration ---------------------------------------------------------------------------


def test_the_settings_select_the_argo_backend_and_its_kubeconfig(
    cluster: FakeKubernetes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = ServiceSettings(
        store=tmp_path / "store",
        db=tmp_path / "db.sqlite",
        tokens=tmp_path / "tokens.yaml",
        owner="mk",
        backend="argo",
        cluster=ClusterConfig(namespace="elsewhere"),
        default_image="simrun:1",
        poll_s=2.5,
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(cluster.write_kubeconfig(tmp_path / "kubeconfig")))
    backend = backend_from_settings(settings)
    assert isinstance(backend, ArgoBackend) and backend.name == "argo"
    assert (backend.namespace, backend.default_image, backend.poll_s) == (
        "elsewhere",
        "simrun:1",
        2.5,
    )
    assert argo_backend(settings).config.system_packages == ("libexpat1",)
    cluster.store.create("nodes", worker_node("n1"))

    async def scenario() -> None:
        try:
            assert [node.name for node in await backend.nodes()] == ["n1"]
        finally:
            await backend.close()

    run(scenario())


def test_a_kubeconfig_that_cannot_be_loaded_refuses_the_backend_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = ServiceSettings(
        store=tmp_path / "store", db=tmp_path / "db", tokens=tmp_path / "t", owner="mk"
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "missing"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    with pytest.raises(ValueError, match=rf"^backend argo: KUBECONFIG={missing}: the file does "):
        argo_backend(settings)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # in a cluster: no kubeconfig
    assert isinstance(argo_backend(settings), ArgoBackend)
