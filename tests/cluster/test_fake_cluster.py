"""The fake cluster: Argo's controller, Kueue and a kubelet emulated over the fake API.

Workflows go in as a client would submit them and run as local processes; the statuses they
end with are compared with the shapes Argo writes (node ids, names, messages, exit codes as
strings; `reference/argo-workflows/testdata/`). Every wait is on a condition of the store with a
timeout (`FakeCluster.wait_for`); the processes of the pods wait on files the test creates.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake.argo_language import ExpressionError, evaluate, fnv32a, node_id, pod_name
from fake.cluster import FakeCluster, NodeSpec
from fake.schemas import reference_dir
from fake.store import MERGE_PATCH
from kubernetes_asyncio import client

from simrun_core.argo import workflow_manifest
from simrun_core.argo.render import render_record
from simrun_core.argo.retry import RETRY_EXPRESSION, pod_spec_patch, retry_strategy
from simrun_core.cluster import ClusterConfig
from simrun_core.planner import Node
from simrun_core.plugins import load_task_types
from simrun_core.workflow import TaskSpec, Workflow

NS = "simrun"
PYTHON = sys.executable
QUEUE = {"kueue.x-k8s.io/queue-name": "simrun"}

WAIT_FOR_FILE = (
    "import pathlib, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n"
    "while not pathlib.Path(sys.argv[1]).exists():\n"
    "    time.sleep(0.02)\n"
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FakeCluster]:
    with FakeCluster(tmp_path, nodes=[NodeSpec("node-1", cores=4, memory_gb=4)]) as fake:
        yield fake
        assert fake.errors == []


def container(code: str, *args: str, cores: str = "1", memory: str = "64Mi", **extra: Any) -> dict:
    amounts = {"cpu": cores, "memory": memory}
    return {
        "image": "python:3.11",
        "command": [PYTHON, "-c", code, *args],
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        **extra,
    }


def template(name: str, body: dict, priority: str | None = None, **extra: Any) -> dict:
    labels = dict(QUEUE)
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority
        extra.setdefault("priorityClassName", priority)
    return {"name": name, "metadata": {"labels": labels}, "container": body, **extra}


def workflow(name: str, tasks: list[dict], templates: list[dict], **spec: Any) -> dict:
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name, "namespace": NS, "labels": {"simrun/run": name}},
        "spec": {
            "entrypoint": "dag",
            "templates": [{"name": "dag", "dag": {"tasks": tasks}}, *templates],
            **spec,
        },
    }


def by_display(workflow: dict) -> dict[str, dict]:
    return {
        n["displayName"]: n for n in ((workflow.get("status") or {}).get("nodes") or {}).values()
    }


def pods_of(cluster: FakeCluster, name: str) -> list[dict]:
    pods, _ = cluster.store.list("pods", NS, labels=f"workflows.argoproj.io/workflow={name}")
    return pods


def gated(pod: dict) -> bool:
    return any(
        g["name"] == "kueue.x-k8s.io/admission" for g in pod["spec"].get("schedulingGates") or []
    )


# --- names and expressions as Argo has them ------------------------------------------------


def test_node_ids_and_pod_names_are_argos() -> None:
    """The hashes of the recorded workflows (diamond, withParam retries) come out the same."""
    assert fnv32a("dag-diamond-82q7s.D") == 1226654358
    assert (
        node_id("workflow-retry", "workflow-retry.launch(1:fail)(0)") == "workflow-retry-1861571805"
    )
    assert node_id("wf", "wf") == "wf"
    assert pod_name("dag-diamond-82q7s", "dag-diamond-82q7s.D", "echo") == (
        "dag-diamond-82q7s-echo-1226654358"
    )


def test_expressions_of_simrun_and_refusals() -> None:
    scope = {"lastRetry.exitCode": "137"}
    assert evaluate(RETRY_EXPRESSION, scope) is True
    assert evaluate(RETRY_EXPRESSION, {"lastRetry.exitCode": "-1"}) is True
    assert evaluate(RETRY_EXPRESSION, {"lastRetry.exitCode": "3"}) is False
    assert evaluate("lastRetry.exitCode == '137' ? '6Gi' : '4Gi'", scope) == "6Gi"
    assert evaluate("lastRetry.exitCode == 137", scope) is False  # expr never converts
    for outside in ("lastRetry.exitCode in ['137']", "sprig.trim(x)", "a + b", "x matches 'y'"):
        with pytest.raises(ExpressionError, match=r"emulated|outside|unknown|unexpected"):
            evaluate(outside, {"x": "1", "a": "1", "b": "2"})


# --- Argo: the DAG, its nodes and pods -----------------------------------------------------


def test_two_dependent_containers_succeed_with_argos_node_shapes(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    echo = template(
        "echo",
        container("import sys; print('hello', sys.argv[1])", "{{inputs.parameters.msg}}"),
        inputs={"parameters": [{"name": "msg"}]},
    )
    tasks = [
        {
            "name": "a",
            "template": "echo",
            "arguments": {"parameters": [{"name": "msg", "value": "A"}]},
        },
        {
            "name": "b",
            "template": "echo",
            "dependencies": ["a"],
            "arguments": {"parameters": [{"name": "msg", "value": "B"}]},
        },
    ]
    cluster.store.create("workflows", workflow("two", tasks, [echo]), NS)
    done = cluster.wait_workflow("two")

    assert done["status"]["phase"] == "Succeeded"
    assert done["metadata"]["labels"]["workflows.argoproj.io/phase"] == "Succeeded"
    assert done["metadata"]["labels"]["workflows.argoproj.io/completed"] == "true"
    assert done["metadata"]["annotations"]["workflows.argoproj.io/pod-name-format"] == "v2"
    assert {"type": "Completed", "status": "True"} in done["status"]["conditions"]
    assert done["status"]["progress"] == "2/2"
    nodes = done["status"]["nodes"]
    a, b = nodes[node_id("two", "two.a")], nodes[node_id("two", "two.b")]
    root = nodes["two"]
    assert (root["type"], root["phase"], root["children"]) == ("DAG", "Succeeded", [a["id"]])
    assert root["outboundNodes"] == [b["id"]]
    for node, name in ((a, "a"), (b, "b")):
        assert node["name"] == f"two.{name}" and node["displayName"] == name
        assert node["type"] == "Pod" and node["phase"] == "Succeeded"
        assert node["boundaryID"] == "two" and node["templateScope"] == "local/two"
        assert node["outputs"] == {"exitCode": "0"} and node["hostNodeName"] == "node-1"
        assert node["startedAt"] <= node["finishedAt"]
    assert a["children"] == [b["id"]] and "children" not in b
    assert b["inputs"] == {"parameters": [{"name": "msg", "value": "B"}]}

    pods = {p["metadata"]["name"]: p for p in pods_of(cluster, "two")}
    pod_a = pods[pod_name("two", "two.a", "echo")]
    assert pod_a["metadata"]["annotations"]["workflows.argoproj.io/node-id"] == a["id"]
    assert pod_a["metadata"]["annotations"]["workflows.argoproj.io/node-name"] == "two.a"
    assert pod_a["metadata"]["labels"]["kueue.x-k8s.io/managed"] == "true"
    assert pod_a["spec"]["nodeSelector"]["kubernetes.io/hostname"] == "node-1"
    assert pod_a["metadata"]["ownerReferences"][0]["kind"] == "Workflow"

    async def over_http() -> None:
        async with client.ApiClient(cluster.configuration()) as api:
            core = client.CoreV1Api(api)
            listed = await core.list_namespaced_pod(
                NS, label_selector="workflows.argoproj.io/workflow=two"
            )
            statuses = {p.metadata.name: p.status for p in listed.items}
            terminated = statuses[pod_a["metadata"]["name"]].container_statuses[0].state.terminated
            assert (terminated.exit_code, terminated.reason) == (0, "Completed")
            log = await core.read_namespaced_pod_log(
                pod_a["metadata"]["name"], NS, container="main"
            )
            assert log == "hello A\n"

    asyncio.run(asyncio.wait_for(over_http(), 10))


def recorded(name: str) -> tuple[dict, dict]:
    """A recorded Workflow of Argo's testdata as a client would submit it, and its status."""
    manifest = yaml.safe_load((reference_dir() / "argo-workflows" / "testdata" / name).read_text())
    status = manifest.pop("status")
    meta = manifest["metadata"]
    meta = {"name": meta["name"], "namespace": NS, "annotations": meta.get("annotations", {})}
    manifest["metadata"] = meta
    return manifest, status


SHAPE = ("id", "name", "displayName", "type", "phase", "boundaryID", "children", "templateName")


@pytest.mark.parametrize(
    ("name", "phase", "whole"),
    [
        ("dag-diamond-succeeded-recorded-v2-podnames.yaml", "Succeeded", True),
        ("dag-withparam-fanout-retry-exhausted-failed.yaml", "Failed", True),
        # recorded before their end: the phases their upstream tests expect after it
        ("dag-leaf-continueon-failed.yaml", "Succeeded", False),
        ("dag-task-failed-workflow-running.yaml", "Failed", False),
    ],
)
def test_recorded_workflows_run_to_their_recorded_statuses(
    cluster: FakeCluster, name: str, phase: str, whole: bool
) -> None:
    """Argo's own recordings, run again (their `echo` and `sh` exist here): the same node ids,
    names, types, phases, links, exit codes and outbound nodes, and the same pod names."""
    manifest, recorded_status = recorded(name)
    cluster.store.create("workflows", manifest, NS)
    status = cluster.wait_workflow(manifest["metadata"]["name"])["status"]

    assert status["phase"] == phase
    if whole:
        assert status["nodes"].keys() == recorded_status["nodes"].keys()
    for identifier, want in recorded_status["nodes"].items():
        got = status["nodes"][identifier]
        if not whole and want.get("phase") not in ("Succeeded", "Failed", "Error"):
            continue
        shape = SHAPE if whole else ("id", "name", "displayName", "type", "phase")
        assert {k: got.get(k) for k in shape} == {k: want.get(k) for k in shape}, identifier
        if whole:
            assert got.get("outboundNodes") == want.get("outboundNodes"), identifier
        code = (want.get("outputs") or {}).get("exitCode")
        if code is not None or (whole and want["type"] == "Pod"):  # Retry nodes get it too
            assert (got.get("outputs") or {}).get("exitCode") == code, identifier
        if whole and want.get("message"):
            assert got["message"] == want["message"], identifier
        if want.get("progress"):
            assert got["progress"] == want["progress"], identifier
    # the pods are named as the recorded artifacts' keys name them (pod name format v2)
    recorded_pods = {
        artifact["s3"]["key"].split("/")[1]
        for node in recorded_status["nodes"].values()
        for artifact in (node.get("outputs") or {}).get("artifacts") or []
    }
    if whole and recorded_pods:
        assert {p["metadata"]["name"] for p in pods_of(cluster, manifest["metadata"]["name"])} == (
            recorded_pods
        )


def test_the_retry_expression_retries_a_143_and_not_a_3(cluster: FakeCluster) -> None:
    strategy = {"limit": "3", "retryPolicy": "Always", "expression": RETRY_EXPRESSION}
    sigterm_first = container(
        "import os, signal\n"
        "if os.environ['ATTEMPT'] == '0':\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n",
        env=[{"name": "ATTEMPT", "value": "{{retries}}"}],
    )
    templates = [
        template("stopped", sigterm_first, retryStrategy=strategy),
        template("failing", container("raise SystemExit(3)"), retryStrategy=strategy),
    ]
    tasks = [{"name": "stopped", "template": "stopped"}, {"name": "failing", "template": "failing"}]
    cluster.store.create("workflows", workflow("retries", tasks, templates), NS)
    done = cluster.wait_workflow("retries")

    nodes = by_display(done)
    assert done["status"]["phase"] == "Failed"
    assert nodes["stopped"]["type"] == "Retry" and nodes["stopped"]["phase"] == "Succeeded"
    first = nodes["stopped(0)"]
    assert (first["type"], first["phase"]) == ("Pod", "Failed")
    assert first["message"] == "main: Error (exit code 143)"
    assert first["outputs"]["exitCode"] == "143" and first["nodeFlag"] == {"retried": True}
    assert nodes["stopped(1)"]["phase"] == "Succeeded"
    assert nodes["stopped"]["children"] == [first["id"], nodes["stopped(1)"]["id"]]
    assert nodes["failing"]["phase"] == "Failed"
    assert nodes["failing"]["message"] == "retryStrategy.expression evaluated to false"
    assert nodes["failing(0)"]["message"] == "main: Error (exit code 3)"
    assert "failing(1)" not in nodes
    assert nodes["retries"]["outboundNodes"] == [
        nodes["failing(0)"]["id"],
        nodes["stopped(1)"]["id"],
    ]


def test_the_pod_spec_patch_gives_the_attempt_after_a_137_the_retry_memory(
    cluster: FakeCluster,
) -> None:
    patch = pod_spec_patch("main", ("48Mi", "256Mi"), {"SIZE_MB": ("first", "retry")}, 3)
    hungry = container(
        "import os, time\n"
        "data = b'x' * (120 * 2**20)\n"  # touched pages: about 120 MiB of anonymous memory
        "if os.environ['SIZE_MB'] == 'first':\n"
        "    time.sleep(10)\n"  # until the kubelet's sampler sees it, however loaded we are
        "print(os.environ['SIZE_MB'])\n",
        memory="48Mi",
        env=[{"name": "SIZE_MB", "value": "first"}],
    )
    memory = template("memory", hungry, retryStrategy=retry_strategy(), podSpecPatch=patch)
    cluster.store.create(
        "workflows", workflow("oom", [{"name": "memory", "template": "memory"}], [memory]), NS
    )
    done = cluster.wait_workflow("oom")

    nodes = by_display(done)
    assert done["status"]["phase"] == "Succeeded"
    assert nodes["memory(0)"]["phase"] == "Failed"
    assert nodes["memory(0)"]["message"] == "main: OOMKilled (exit code 137)"
    assert nodes["memory(0)"]["outputs"]["exitCode"] == "137"
    assert nodes["memory(1)"]["phase"] == "Succeeded"
    started = [p for p in cluster.kubelet.started if p["metadata"]["name"].startswith("oom-")]
    mains = [next(c for c in p["spec"]["containers"] if c["name"] == "main") for p in started]
    assert [m["resources"]["limits"]["memory"] for m in mains] == ["48Mi", "256Mi"]
    assert [m["resources"]["requests"]["memory"] for m in mains] == ["48Mi", "256Mi"]
    assert [{e["name"]: e["value"] for e in m["env"]}["SIZE_MB"] for m in mains] == [
        "first",
        "retry",
    ]
    assert all(p["spec"]["terminationGracePeriodSeconds"] == 3 for p in started)
    second = started[1]["metadata"]["name"]
    assert cluster.store.read_log(NS, second, "main") == b"retry\n"


def test_with_sequence_fans_out_and_continue_on_failed_lets_the_dag_succeed(
    cluster: FakeCluster,
) -> None:
    item = template(
        "item",
        container(
            "import sys; sys.exit(3 if sys.argv[1] == '2' else 0)", "{{inputs.parameters.n}}"
        ),
        inputs={"parameters": [{"name": "n"}]},
    )
    after = template("after", container("pass"))
    fan = {"parameters": [{"name": "n", "value": "{{item}}"}]}
    tasks = [
        {
            "name": "extra",
            "template": "item",
            "arguments": fan,
            "withSequence": {"start": "1", "count": "3"},
            "continueOn": {"failed": True},
        },
        {"name": "after", "template": "after", "dependencies": ["extra"]},
        {
            "name": "leaf",
            "template": "item",
            "arguments": fan,
            "withSequence": {"start": "2", "count": "1"},
            "continueOn": {"failed": True, "error": True},
        },
    ]
    cluster.store.create("workflows", workflow("fan", tasks, [item, after]), NS)
    done = cluster.wait_workflow("fan")

    nodes = by_display(done)
    assert done["status"]["phase"] == "Succeeded"
    group = nodes["extra"]
    assert (group["type"], group["phase"], group["nodeFlag"]) == ("TaskGroup", "Failed", {})
    items = [nodes[f"extra({i}:{i + 1})"] for i in range(3)]
    assert group["children"] == [n["id"] for n in items]
    assert [n["phase"] for n in items] == ["Succeeded", "Failed", "Succeeded"]
    assert items[1]["inputs"] == {"parameters": [{"name": "n", "value": "2"}]}
    assert all(n["children"] == [nodes["after"]["id"]] for n in items)
    assert nodes["after"]["phase"] == "Succeeded"
    assert nodes["leaf(0:2)"]["phase"] == "Failed" and nodes["leaf"]["phase"] == "Failed"


def test_a_failed_dependency_omits_its_dependents(cluster: FakeCluster) -> None:
    templates = [
        template("fail", container("raise SystemExit(1)")),
        template("ok", container("pass")),
    ]
    tasks = [
        {"name": "a", "template": "fail"},
        {"name": "b", "template": "ok", "depends": "a"},
        {"name": "c", "template": "ok", "depends": "a.Failed"},
    ]
    cluster.store.create("workflows", workflow("omit", tasks, templates), NS)
    nodes = by_display(cluster.wait_workflow("omit"))
    assert nodes["omit"]["phase"] == "Failed"
    assert (nodes["b"]["type"], nodes["b"]["phase"]) == ("Skipped", "Omitted")
    assert nodes["b"]["message"] == "omitted: depends condition not met"
    assert nodes["c"]["phase"] == "Succeeded"


def test_an_unemulated_feature_ends_the_workflow_in_error(tmp_path: Path) -> None:
    with FakeCluster(tmp_path) as cluster:
        steps = {"name": "dag", "steps": [[{"name": "s", "template": "t"}]]}
        manifest = workflow("steps", [], [template("t", container("pass"))])
        manifest["spec"]["templates"][0] = steps
        cluster.store.create("workflows", manifest, NS)
        cluster.wait_workflow("steps", ("Error",), check_errors=False)
        status = cluster.workflow("steps")["status"]
        assert status["phase"] == "Error" and "steps is not emulated" in status["message"]
        assert len(cluster.argo.errors) == 1


# --- Kueue: quota, priorities, preemption --------------------------------------------------


@pytest.fixture
def small(tmp_path: Path) -> Iterator[FakeCluster]:
    """One node of two cores: the quota holds one pod of two cores."""
    with FakeCluster(tmp_path, nodes=[NodeSpec("node-1", cores=2, memory_gb=2)]) as fake:
        yield fake
        assert fake.errors == []


def one_task(name: str, priority: str, code: str, *args: str, retry: bool = False) -> dict:
    extra = {"retryStrategy": retry_strategy()} if retry else {}
    body = template(name, container(code, *args, cores="2"), priority, **extra)
    return workflow(name, [{"name": "main", "template": name}], [body])


def test_kueue_admits_within_quota_in_priority_order(small: FakeCluster, tmp_path: Path) -> None:
    release = tmp_path / "release"
    small.store.create(
        "workflows", one_task("blocker", "simrun-owner-base", WAIT_FOR_FILE, str(release)), NS
    )
    small.wait_for(lambda: small.kueue.admissions, what="the blocker admitted")
    for name, priority in (
        ("agent", "simrun-agent-base"),
        ("owner", "simrun-owner-base"),  # equal to the blocker's: it never preempts it
        ("standard", "simrun-standard-base"),
    ):
        small.store.create("workflows", one_task(name, priority, "pass", retry=name == "agent"), NS)
    small.wait_for(
        lambda: sum(gated(p) for p in small.store.list("pods", NS)[0]) == 3, what="3 gated pods"
    )
    # A pod deleted before it ran is created again by Argo as the same attempt.
    agent_pod = next(p for p in pods_of(small, "agent"))
    small.store.delete("pods", agent_pod["metadata"]["name"], NS)
    small.wait_for(
        lambda: any(
            p["metadata"]["uid"] != agent_pod["metadata"]["uid"] for p in pods_of(small, "agent")
        ),
        what="the agent's pod created again",
    )
    assert small.kueue.preemptions == []
    release.touch()
    for name in ("blocker", "owner", "standard", "agent"):
        assert small.wait_workflow(name)["status"]["phase"] == "Succeeded"
    assert [pod.split("-")[0] for pod, _ in small.kueue.admissions] == [
        "blocker",
        "owner",
        "standard",
        "agent",
    ]
    assert small.kueue.preemptions == []
    agent = by_display(small.workflow("agent"))
    assert sorted(agent) == ["agent", "main", "main(0)"]  # no second attempt


def test_kueue_preempts_a_lower_priority_which_argo_retries(
    small: FakeCluster, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    small.store.create(
        "workflows",
        one_task("low", "simrun-agent-extra", WAIT_FOR_FILE, str(release), retry=True),
        NS,
    )
    small.wait_for(
        lambda: by_display(small.workflow("low")).get("main(0)", {}).get("phase") == "Running",
        what="the low pod running",
    )
    small.store.create("workflows", one_task("high", "simrun-owner-base", "pass"), NS)
    assert small.wait_workflow("high")["status"]["phase"] == "Succeeded"
    assert [(v.split("-")[0], p.split("-")[0]) for v, p in small.kueue.preemptions] == [
        ("low", "high")
    ]
    preempted = small.wait_for(
        lambda: by_display(small.workflow("low")).get("main(1)"), what="the next attempt"
    )
    assert preempted["nodeFlag"] == {"retried": True}
    first = by_display(small.workflow("low"))["main(0)"]
    assert (first["phase"], first["message"]) == ("Error", "pod deleted")
    assert "exitCode" not in first.get("outputs", {})
    release.touch()
    low = small.wait_workflow("low")
    assert low["status"]["phase"] == "Succeeded"
    assert by_display(low)["main(1)"]["phase"] == "Succeeded"


def test_a_reservation_taint_keeps_other_pods_off_and_evicts_them(tmp_path: Path) -> None:
    """The backend's reservation: a `NoExecute` taint and a label; the run's pods select and
    tolerate them, the pods of others are kept off the node and evicted from it."""
    nodes = [NodeSpec("node-1", cores=1, memory_gb=1), NodeSpec("node-2", cores=1, memory_gb=1)]
    with FakeCluster(tmp_path, nodes=nodes) as fake:
        release = tmp_path / "release"
        body = container(WAIT_FOR_FILE, str(release))
        other = template("other", body, retryStrategy=retry_strategy())
        fake.store.create(
            "workflows", workflow("other", [{"name": "o", "template": "other"}], [other]), NS
        )
        first = fake.wait_for(lambda: fake.kueue.admissions, what="the other run admitted")
        assert first[0][1] == "node-1"  # the first node with room

        def reserve(node: dict) -> None:
            node["metadata"]["labels"]["simrun/reserved"] = "mine"
            node["spec"]["taints"] = [
                {"key": "simrun/reserved", "value": "mine", "effect": "NoExecute"}
            ]

        fake.store.update("nodes", "node-1", reserve)
        evicted = fake.wait_for(
            lambda: (
                by_display(fake.workflow("other")).get("o(0)", {}).get("message") == "pod deleted"
                or None
            ),
            what="the other run's pod evicted",
        )
        assert evicted and fake.kubelet.evictions
        mine = template("mine", container("pass"))
        fake.store.create(
            "workflows",
            workflow(
                "mine",
                [{"name": "m", "template": "mine"}],
                [mine],
                nodeSelector={"simrun/reserved": "mine"},
                tolerations=[{"key": "simrun/reserved", "operator": "Equal", "value": "mine"}],
            ),
            NS,
        )
        assert fake.wait_workflow("mine")["status"]["phase"] == "Succeeded"
        (pod,) = pods_of(fake, "mine")
        assert pod["spec"]["nodeName"] == "node-1"
        release.touch()
        other_done = fake.wait_workflow("other")
        assert by_display(other_done)["o(1)"]["hostNodeName"] == "node-2"
        assert fake.errors == []


# --- shutdown -------------------------------------------------------------------------------


def test_shutdown_stop_fails_what_is_pending_and_stops_what_runs(
    small: FakeCluster, tmp_path: Path
) -> None:
    never = tmp_path / "never"
    templates = [
        template(
            "wait", container(WAIT_FOR_FILE, str(never), cores="2"), retryStrategy=retry_strategy()
        ),
        template("quick", container("pass")),
    ]
    tasks = [
        {"name": "running", "template": "wait"},
        {"name": "gated", "template": "quick"},
        {"name": "later", "template": "quick", "dependencies": ["running"]},
    ]
    small.store.create("workflows", workflow("stop", tasks, templates), NS)
    small.wait_for(
        lambda: (
            by_display(small.workflow("stop")).get("running(0)", {}).get("phase") == "Running"
            and any(gated(p) for p in pods_of(small, "stop"))
        ),
        what="one pod running, one gated",
    )

    async def stop() -> None:
        async with client.ApiClient(small.configuration()) as api:
            await client.CustomObjectsApi(api).patch_namespaced_custom_object(
                "argoproj.io",
                "v1alpha1",
                NS,
                "workflows",
                "stop",
                {"spec": {"shutdown": "Stop"}},
                _content_type=MERGE_PATCH,
            )

    asyncio.run(asyncio.wait_for(stop(), 10))
    done = small.wait_workflow("stop")
    nodes = by_display(done)
    assert done["status"]["phase"] == "Failed"
    assert done["status"]["message"] == "Stopped with strategy 'Stop'"
    assert nodes["gated"]["phase"] == "Failed"
    assert nodes["gated"]["message"] == "workflow shutdown with strategy:  Stop"
    assert nodes["running(0)"]["message"] == "workflow shutdown with strategy:  Stop"
    assert nodes["running"]["message"] == "Stopped with strategy 'Stop'"
    assert nodes["later"]["phase"] == "Omitted"
    assert nodes["stop"]["phase"] == "Failed"

    # the gated pod is deleted, the running one stopped on SIGTERM (143)
    def settled() -> bool:
        pods = pods_of(small, "stop")
        return len(pods) == 1 and pods[0]["status"]["phase"] == "Failed"

    small.wait_for(settled, what="the running pod stopped")
    (stopped,) = pods_of(small, "stop")
    terminated = stopped["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 143


# --- the kubelet ----------------------------------------------------------------------------


def plain_pod(name: str, code: str, *args: str, memory: str = "32Mi", grace: int = 1) -> dict:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "main", **container(code, *args, memory=memory)}],
        },
    }


def test_a_pod_over_its_memory_limit_ends_oom_killed_137(cluster: FakeCluster) -> None:
    cluster.store.create(
        "pods", plain_pod("hog", "import time; x = b'x' * 2**28; time.sleep(10)"), NS
    )

    def ended() -> dict | None:
        pod = cluster.store.get("pods", "hog", NS)
        return pod if pod["status"]["phase"] == "Failed" else None

    pod = cluster.wait_for(ended, what="the pod killed")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "OOMKilled")


def test_a_deleted_pod_gets_sigterm_then_sigkill_and_no_terminal_status(
    cluster: FakeCluster, tmp_path: Path
) -> None:
    stubborn = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\n"
        "time.sleep(30)\n"
    )
    cluster.store.create("pods", plain_pod("stubborn", stubborn, grace=1), NS)
    cluster.wait_for(
        lambda: (
            cluster.store.get("pods", "stubborn", NS)["status"]["phase"] == "Running"
            and b"up" in cluster.store.read_log(NS, "stubborn", "main")
        ),
        what="running",
    )
    marked, gone = cluster.store.delete("pods", "stubborn", NS)
    assert not gone and marked["metadata"]["deletionGracePeriodSeconds"] == 1

    def removed() -> bool:
        return not cluster.store.list("pods", NS, fields="metadata.name=stubborn")[0]

    cluster.wait_for(removed, timeout_s=5, what="the pod removed after its grace")
    run = next(r for r in cluster.kubelet.runs.values() if r.name == "stubborn")
    assert run.process is not None and run.process.returncode == -9


def test_mounts_and_env_are_mapped_to_local_directories(cluster: FakeCluster) -> None:
    code = (
        "import json, os, pathlib, sys\n"
        "out = pathlib.Path(os.environ['OUT'])\n"
        "out.mkdir(parents=True, exist_ok=True)\n"
        "seen = {'argv': sys.argv[1:], 'cwd': os.getcwd(), 'node': os.environ['NODE'],\n"
        "    'dollar': os.environ['DOLLAR'], 'ref': os.environ['REF']}\n"
        "(out / 'seen.json').write_text(json.dumps(seen))\n"
    )
    pod = plain_pod("mounts", code, "/store/runs/r1/x", "/scratch/y", "$(OUT)")
    main = pod["spec"]["containers"][0]
    main["env"] = [
        {"name": "OUT", "value": "/store/runs/r1/out"},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "DOLLAR", "value": "$$HOME"},
        {"name": "REF", "value": "$(OUT)/z"},
    ]
    main["workingDir"] = "/scratch"
    main["volumeMounts"] = [
        {"name": "store", "mountPath": "/store/runs/r1", "subPath": "runs/r1"},
        {"name": "scratch", "mountPath": "/scratch", "subPath": "r1/t"},
    ]
    pod["spec"]["volumes"] = [
        {"name": "store", "persistentVolumeClaim": {"claimName": "simrun-store"}},
        {"name": "scratch", "hostPath": {"path": "/scratch", "type": "DirectoryOrCreate"}},
    ]
    cluster.store.create("pods", pod, NS)
    cluster.wait_for(
        lambda: cluster.store.get("pods", "mounts", NS)["status"]["phase"] == "Succeeded",
        what="the pod done",
    )
    store, scratch = cluster.store_dir / "runs" / "r1", cluster.scratch_dir / "node-1" / "scratch"
    seen = json.loads((store / "out" / "seen.json").read_text())
    assert seen == {
        "argv": [str(store / "x"), str(scratch / "r1" / "t" / "y"), str(store / "out")],
        "cwd": str(scratch / "r1" / "t"),
        "node": "node-1",
        "dollar": "$HOME",
        "ref": str(store / "out" / "z"),
    }


# --- a generated workflow -------------------------------------------------------------------


def test_a_generated_command_workflow_runs_to_succeeded(cluster: FakeCluster) -> None:
    code = (
        "import os, pathlib, sys\n"
        "out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)\n"
        "env = os.environ\n"
        "(out / 'where.txt').write_text(env['SIMRUN_TASK_DIR'] + ' ' + env['SIMRUN_ATTEMPT'])\n"
    )
    settings = {
        "image": "python:3.11",
        "args": ["python", "-c", code, "{out}"],
        "cores": 1,
        "memory_gb": 0.25,
    }
    types = load_task_types()
    config = ClusterConfig()
    record = render_record(
        Workflow(name="hello", tasks=[TaskSpec(id="hello", type="command", settings=settings)]),
        types,
        config,
        nodes=[Node(name="node-1", cores=4, memory_gb=4.0)],
        image="python:3.11",
    )
    manifest = workflow_manifest(record, types, config)
    name = manifest["metadata"]["name"]
    cluster.store.create("workflows", manifest, NS)
    done = cluster.wait_workflow(name)

    assert done["status"]["phase"] == "Succeeded"
    nodes = by_display(done)
    assert nodes["hello"]["type"] == "Retry" and nodes["hello(0)"]["phase"] == "Succeeded"
    task_dir = cluster.store_dir / "runs" / record.id / "tasks" / "hello"
    assert (task_dir / "out" / "where.txt").read_text() == f"{task_dir} 0"
    (pod,) = pods_of(cluster, name)
    assert pod["spec"]["priorityClassName"] == "simrun-standard-base"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 90
