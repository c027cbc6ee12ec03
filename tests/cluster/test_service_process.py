"""A real service process (`python -m simrun_cli serve`, `backend: argo`) following runs on a
fake cluster that runs in the test's process (issue 12, "the cluster").

The service talks to the fake Kubernetes API through a kubeconfig, as to a real cluster; its
store is the cluster's `store_dir`, which the kubelet mounts as the store claim of the pods, so
the harness in the pods writes where the service reads. Runs are submitted and read through
the service's HTTP API with a token, and `simrun status` runs as a command line against it.

- A service killed with SIGKILL mid-run is started again on the same store, index and
  settings and carries the run to its end: the Workflow created once, its pods never started
  again (they ran on while no service was there), every unit recorded once, the log one
  sequence without a gap or an event appended twice, the summary that of local mode.
- `GET /servers` lists the worker nodes with the cores and memory pods of runs may have
  (allocatable less the requests of other pods and less Argo's executor container) and the
  pods of a run on their nodes with their requests.
- `simrun status RUN` shows the run's pods with the nodes they run on.
- A reservation made through `POST /runs` holds its node while the service is killed and the
  run ends without it; the next service records the end and releases the node.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from fake.cluster import FakeCluster, NodeSpec
from service_process import HARNESS_ENV, ServiceProcess, serving, wait_for
from unit_events import done_indices

from simrun_api.backends.argo_nodes import EXECUTOR_CORES, EXECUTOR_MEMORY_GB
from simrun_core import events as ev
from simrun_core import launch as contract
from simrun_core.argo import labels
from simrun_core.store import RunPaths

TASK = "squares"
ENDS = (ev.PodSucceeded, ev.PodFailed, ev.PodPreempted)


def squares(n: int, sleep_s: float, workers: int) -> dict[str, Any]:
    """`examples/squares.yaml` with `n` units of `sleep_s` each, `workers` processes a pod."""
    task = {
        "id": TASK,
        "type": "demo.squares",
        "settings": {"n": n, "sleep_s": sleep_s},
        "resources": {"workers": workers},
    }
    return {"name": "squares", "tasks": [task]}


def summary(cluster: FakeCluster, run_id: str) -> dict[str, Any]:
    path = RunPaths(cluster.store_dir, run_id).out(TASK) / "summary.json"
    decoded: dict[str, Any] = msgspec.json.decode(path.read_bytes())
    return decoded


def local_summary(n: int) -> dict[str, int]:
    """What `demo.squares` of `n` units merges into `summary.json` in local mode."""
    return {"n": n, "sum": sum(i * i for i in range(n))}


def kinds(log: list[ev.Event]) -> list[str]:
    return [event.__struct_config__.tag for event in log]


def key(event: Any) -> tuple[str, str, int]:
    return (event.task, event.worker, event.attempt)


def run_pods(cluster: FakeCluster, run_id: str) -> list[dict[str, Any]]:
    """The pods of a run in the fake cluster's store."""
    namespace = cluster.config.namespace
    pods, _ = cluster.store.list("pods", namespace, f"{labels.RUN}={run_id}")
    return pods


def main_env(pod: dict[str, Any]) -> dict[str, str]:
    """The environment of the harness's container of a pod (the one naming its worker)."""
    for container in pod["spec"]["containers"]:
        env = {e["name"]: e.get("value", "") for e in container.get("env") or []}
        if contract.WORKER in env:
            return env
    raise AssertionError(f"pod {pod['metadata']['name']} has no harness container")


def pod_nodes(pods: list[dict[str, Any]]) -> dict[str, str]:
    """The node of each pod by its service name `<worker>-<attempt>`."""
    found = {}
    for pod in pods:
        env = main_env(pod)
        found[f"{env[contract.WORKER]}-{env[contract.ATTEMPT]}"] = pod["spec"]["nodeName"]
    return found


# -- a service killed mid-run

N_UNITS = 240
KILL_NODES = [NodeSpec(f"node-{i}", cores=5, memory_gb=8.0) for i in (1, 2)]
MOMENTS = {
    "mid-run": "units are in the run's log; the pods compute 20 more without a service",
    "workflow-ended": "units are in the run's log; the pods end the Workflow without a service",
    "just-submitted": "POST /runs answered (the Workflow created or not yet)",
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_service_killed_with_sigkill_resumes_the_run_without_a_second_submission(
    tmp_path: Path, moment: str
) -> None:
    """Two nodes of 5 cores (4 for the planner), pods of 2 processes: 4 pods, 2 on each node.
    SIGKILL the service at `moment` (`MOMENTS`), then start a new service process on the same
    settings, store and index: it takes the run over as it is and carries it to its end."""
    cluster = FakeCluster(tmp_path, nodes=KILL_NODES, env_overrides=HARNESS_ENV)
    with cluster, serving(cluster, tmp_path / "service") as service:
        run = service.submit(squares(N_UNITS, sleep_s=0.2, workers=2))
        run_id, plan = run["id"], run["tasks"][TASK]["plan"]
        assert plan["pods"] >= 2, plan
        workflow = f"simrun-{run_id}"

        def units_logged() -> int:
            return len(done_indices(service.log(run_id)))

        if moment != "just-submitted":
            wait_for(lambda: units_logged() >= 10, "units in the run's log")
        service.kill()
        before = service.log(run_id)  # the complete lines the first service wrote
        assert not isinstance(before[-1], ev.Succeeded | ev.Failed), kinds(before)
        pods_at_kill = run_pods(cluster, run_id)
        running = {p["metadata"]["uid"] for p in pods_at_kill if p["status"]["phase"] == "Running"}
        at_kill = service.harness_done(run_id, TASK)

        # the pods compute on while no service is there
        if moment == "mid-run":
            wait_for(
                lambda: len(service.harness_done(run_id, TASK)) >= len(at_kill) + 20,
                "the pods to go on computing without the service",
            )
        elif moment == "workflow-ended":
            cluster.wait_workflow(workflow, ("Succeeded",), timeout_s=30)
        assert len(service.log(run_id)) == len(before), "no one writes the log meanwhile"
        at_restart = service.harness_done(run_id, TASK)
        meanwhile = {p["metadata"]["uid"]: p["status"]["phase"] for p in run_pods(cluster, run_id)}
        assert {uid for uid in meanwhile if uid in running} == running, "a running pod went"
        assert {meanwhile[uid] for uid in running} <= {"Running", "Succeeded"}, meanwhile

        service.start()
        view = service.ended(run_id)
        after = service.log(run_id)
        started_pods = list(cluster.kubelet.started)
        assert cluster.errors == []

    assert view["state"] == "succeeded", (view["message"], kinds(after))
    assert view["tasks"][TASK]["done"] == N_UNITS
    assert summary(cluster, run_id) == local_summary(N_UNITS)

    # the Workflow was created once; the second service found it (a create refused 409)
    namespace = cluster.config.namespace
    assert cluster.store.created[("workflows", namespace, workflow)] == 1
    assert [name for plural, _, name in cluster.store.created if plural == "workflows"] == [
        workflow
    ]
    assert [e.name for e in after if isinstance(e, ev.WorkflowSubmitted)] == [workflow]

    # one log: the first service's events unchanged, the second's after them, no gap
    assert after[: len(before)] == before
    assert [e.seq for e in after] == list(range(1, len(after) + 1))
    for once in ("submitted", "environment-resolved", "built", "workflow-submitted", "merged"):
        assert kinds(after).count(once) == 1, (once, kinds(after))
    assert kinds(after)[-1] == "succeeded" and kinds(after).count("succeeded") == 1

    # every unit once, those the pods did while no service ran copied by the second one
    done = Counter(done_indices(after))
    assert set(done) == set(range(N_UNITS)) and set(done.values()) == {1}, done.most_common(3)
    logged_first = set(done_indices(before))
    copied_late = set(done_indices(after[len(before) :]))
    assert at_restart - logged_first <= copied_late, "the units done while no service ran"
    if moment != "just-submitted":
        assert running, [p["status"]["phase"] for p in pods_at_kill]
        assert len(at_restart - at_kill) >= 20, "the pods computed while no service ran"
    if moment == "workflow-ended":
        assert at_restart == set(range(N_UNITS))

    # each attempt admitted, started, reported and ended once; no pod was started again
    started = Counter(key(e) for e in after if isinstance(e, ev.PodStarted))
    admitted = Counter(key(e) for e in after if isinstance(e, ev.PodAdmitted))
    ended = Counter(key(e) for e in after if isinstance(e, ENDS))
    reports = Counter(key(e) for e in after if isinstance(e, ev.WorkerReport))
    assert set(started.values()) == {1}, started
    assert set(admitted.values()) == {1} and set(admitted) == set(started), admitted
    assert set(ended.values()) == {1} and set(ended) == set(started), (started, ended)
    assert set(reports.values()) == {1} and set(reports) == set(started), reports
    assert {attempt for _, _, attempt in started} == {0}, started
    assert len(started) == plan["pods"] == len(started_pods), [
        p["metadata"]["name"] for p in started_pods
    ]
    assert all(isinstance(e, ev.PodSucceeded) for e in after if isinstance(e, ENDS))
    states = Counter((e.task, e.state) for e in after if isinstance(e, ev.TaskStateChanged))
    assert set(states.values()) == {1}, states


# -- GET /servers

DAEMON_CORES, DAEMON_MEMORY_GB = 1, 1.0
SERVER_NODES = [
    NodeSpec("node-1", cores=5, memory_gb=8.0),
    NodeSpec("node-2", cores=4, memory_gb=6.0),
    NodeSpec("gateway", cores=8, memory_gb=16.0, worker=False),
]


def daemon_pod(node: str) -> dict[str, Any]:
    """A pod of a DaemonSet of the cluster (the NFS driver's) on a node: no pod of a run."""
    command = [sys.executable, "-c", "import time; time.sleep(300)"]
    requests = {"cpu": str(DAEMON_CORES), "memory": f"{round(DAEMON_MEMORY_GB * 1024)}Mi"}
    container = {
        "name": "nfs",
        "image": "nfs",
        "command": command,
        "resources": {"requests": requests},
    }
    return {
        "metadata": {"name": f"nfs-{node}", "labels": {"app": "nfs"}},
        "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [container]},
    }


def expected_servers() -> dict[str, tuple[float, float]]:
    """The cores and GiB of each worker node for the pods of runs: allocatable less the
    daemon's requests (node-1 only) and Argo's executor container, rounded down."""
    found = {}
    for node in SERVER_NODES:
        if not node.worker:
            continue
        used_cores, used_gb = (DAEMON_CORES, DAEMON_MEMORY_GB) if node.name == "node-1" else (0, 0)
        cores = math.floor(node.cores - used_cores - EXECUTOR_CORES)
        memory = float(math.floor(node.memory_gb - used_gb - EXECUTOR_MEMORY_GB))
        found[node.name] = (cores, memory)
    return found


def test_servers_lists_the_worker_nodes_and_the_pods_of_a_run_on_them(tmp_path: Path) -> None:
    with FakeCluster(tmp_path, nodes=SERVER_NODES, env_overrides=HARNESS_ENV) as cluster:
        cluster.store.create("pods", daemon_pod("node-1"), "kube-system")
        cluster.wait_for(
            lambda: (
                cluster.store.get("pods", "nfs-node-1", "kube-system")["status"]["phase"]
                == "Running"
            ),
            what="the daemon's pod to run",
        )
        try:
            with serving(cluster, tmp_path / "service") as service:
                idle = service.servers()
                assert {s["name"]: (s["cores"], s["memory_gb"]) for s in idle} == (
                    expected_servers()
                ), idle
                assert expected_servers() == {"node-1": (3, 6.0), "node-2": (3, 5.0)}
                assert all(s["pods"] == [] and s["reserved_by"] is None for s in idle), idle
                assert all(s["gpus"] == 0 for s in idle)

                run = service.submit(squares(12, sleep_s=1.5, workers=1))
                run_id, plan = run["id"], run["tasks"][TASK]["plan"]
                assert plan["pods"] >= 2, plan

                def listed_while_running() -> tuple[list[dict], dict[str, str]] | None:
                    servers = service.servers()
                    pods = [p for s in servers for p in s["pods"]]
                    if len(pods) < plan["pods"] or any(p["phase"] != "running" for p in pods):
                        return None
                    return servers, pod_nodes(run_pods(cluster, run_id))

                servers, nodes = wait_for(listed_while_running, "every pod of the run running")
                view = service.ended(run_id)
                after = service.servers()
        finally:
            cluster.store.delete("pods", "nfs-node-1", "kube-system")
            cluster.wait_for(
                lambda: not cluster.store.list("pods", "kube-system")[0],
                what="the daemon's pod to be gone",
            )
        assert cluster.errors == []

    assert view["state"] == "succeeded", view["message"]
    assert {s["name"]: (s["cores"], s["memory_gb"]) for s in servers} == expected_servers()
    listed = {
        pod["pod"]: (server["name"], pod["run_id"], pod["task_id"], pod["cores"], pod["memory_gb"])
        for server in servers
        for pod in server["pods"]
    }
    expected = {
        name: (node, run_id, TASK, plan["cores"], plan["memory_gb"]) for name, node in nodes.items()
    }
    assert listed == expected
    assert len({node for node, *_ in listed.values()}) == 2, "the pods are on both nodes"
    assert all(s["pods"] == [] for s in after), "ended pods are not listed"
    assert {s["name"]: (s["cores"], s["memory_gb"]) for s in after} == expected_servers()


# -- simrun status


def simrun(service: ServiceProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """`simrun ARGS` as a command line of its own against the service (SIMRUN_URL/_TOKEN)."""
    return subprocess.run(
        [sys.executable, "-m", "simrun_cli", *args],
        cwd=service.root,
        env={**service.env(), "COLUMNS": "100"},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def pod_rows(stdout: str) -> dict[str, list[str]]:
    """The rows of the pods table of `simrun status`, by `<worker>-<attempt>`."""
    lines = stdout.splitlines()
    assert any(line.split()[:3] == ["task", "worker", "attempt"] for line in lines), stdout
    header = next(
        i for i, line in enumerate(lines) if line.split()[:3] == ["task", "worker", "attempt"]
    )
    rows = {}
    for line in lines[header + 2 :]:
        cells = line.split()
        if len(cells) < 4 or cells[0] != TASK:
            break
        rows[f"{cells[1]}-{cells[2]}"] = cells
    return rows


def test_status_shows_the_pods_of_a_run_with_their_nodes(tmp_path: Path) -> None:
    nodes = [NodeSpec(f"node-{i}", cores=3, memory_gb=6.0) for i in (1, 2)]
    cluster = FakeCluster(tmp_path, nodes=nodes, env_overrides=HARNESS_ENV)
    with cluster, serving(cluster, tmp_path / "service") as service:
        run = service.submit(squares(12, sleep_s=1.0, workers=1))
        run_id, plan = run["id"], run["tasks"][TASK]["plan"]
        assert plan["pods"] >= 2, plan

        def all_started() -> bool:
            log = service.log(run_id)
            return sum(isinstance(e, ev.PodStarted) for e in log) >= plan["pods"]

        wait_for(all_started, "every pod of the run to start")
        running = simrun(service, "status", run_id)
        running_json = simrun(service, "status", run_id, "--json")
        service.ended(run_id)
        ended = simrun(service, "status", run_id)
        ended_json = simrun(service, "status", run_id, "--json")
        nodes_of = pod_nodes(run_pods(cluster, run_id))
        assert cluster.errors == []

    assert len(nodes_of) == plan["pods"] and set(nodes_of.values()) == {"node-1", "node-2"}
    for result in (running, running_json, ended, ended_json):
        assert result.returncode == 0, result.stderr

    rows = pod_rows(running.stdout)
    assert set(rows) == set(nodes_of), running.stdout
    for name, cells in rows.items():
        assert cells[4] == nodes_of[name], (name, cells)
        assert cells[3] in ("running", "succeeded"), cells  # a pod may end meanwhile
    rows = pod_rows(ended.stdout)
    assert {name: (cells[3], cells[4]) for name, cells in rows.items()} == {
        name: ("succeeded", node) for name, node in nodes_of.items()
    }, ended.stdout
    assert "succeeded" in next(
        line for line in ended.stdout.splitlines() if line.startswith("state")
    )

    for result, states in ((running_json, {"running", "succeeded"}), (ended_json, {"succeeded"})):
        pods = json.loads(result.stdout)["tasks"][TASK]["pods"]
        assert {f"{p['worker']}-{p['attempt']}": p["node"] for p in pods} == nodes_of
        assert {p["state"] for p in pods} <= states, pods


# -- a reservation across a killed service


def reservation(cluster: FakeCluster, node: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The run a node's label names and the node's reservation taints."""
    manifest = cluster.store.get("nodes", node)
    label = (manifest["metadata"].get("labels") or {}).get(labels.RESERVED)
    taints = [t for t in manifest["spec"].get("taints") or [] if t["key"] == labels.RESERVED]
    return label, taints


def test_a_reservation_outlives_a_killed_service_and_the_next_one_releases_it(
    tmp_path: Path,
) -> None:
    """`reserve` through POST /runs taints and labels the node; the service is killed with
    SIGKILL while the run runs, the run ends in the cluster meanwhile (the node still held), and
    the next service records the end and releases the node."""
    cluster = FakeCluster(tmp_path, nodes=KILL_NODES, env_overrides=HARNESS_ENV)
    with cluster, serving(cluster, tmp_path / "service") as service:
        body = {"workflow": squares(40, sleep_s=0.1, workers=2), "reserve": "node-2"}
        response = service.http.post("/runs", json=body)
        assert response.status_code == 201, response.text
        run_id = response.json()["id"]
        wait_for(
            lambda: done_indices(service.log(run_id)) != [],
            "a unit of the reserved run",
        )
        held = reservation(cluster, "node-2")
        listed = {server["name"]: server["reserved_by"] for server in service.servers()}
        service.kill()
        cluster.wait_workflow(f"simrun-{run_id}", ("Succeeded",), timeout_s=30)
        while_dead = reservation(cluster, "node-2")
        service.start()
        view = service.ended(run_id)
        wait_for(lambda: "node-released" in kinds(service.log(run_id)), "the release of the node")
        after = reservation(cluster, "node-2")
        log = service.log(run_id)
        assert cluster.errors == []
    taint = {"key": labels.RESERVED, "value": run_id, "effect": "NoExecute"}
    assert held == (run_id, [taint]) == while_dead
    assert listed == {"node-1": None, "node-2": run_id}
    assert view["state"] == "succeeded", view["message"]
    assert summary(cluster, run_id) == local_summary(40)
    assert {e.node for e in log if isinstance(e, ev.PodStarted)} == {"node-2"}
    assert after == (None, [])
    assert kinds(log)[-2:] == ["succeeded", "node-released"]
    assert kinds(log).count("node-reserved") == 1 and kinds(log).count("workflow-submitted") == 1
