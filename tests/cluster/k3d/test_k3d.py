"""The central assumptions of the design on a real k3d cluster (spec 12, `test_cluster.py`).

Marked `cluster` and skipped unless SIMRUN_K3D=1, so a default run needs no docker, k3d or
kubectl. To run them (docker, k3d v5.9, kubectl with kustomize v5, about 20 GiB of disk and the
network for the images of k3s, Kueue, Argo and BuildKit and for the build of the service image):

    SIMRUN_K3D=1 python -m pytest tests/cluster/k3d -m cluster          # one process, ~15 min
    SIMRUN_K3D=1 SIMRUN_K3D_KEEP=1 python -m pytest tests/cluster/k3d -m cluster  # keep it

k3d and kubectl are taken from `.tools/bin` when there, else from PATH. The session creates the
cluster `simrun-test` of `deploy/k3d/k3d.yaml` (or reuses the one a SIMRUN_K3D_KEEP=1 session
left) with the store `.tools/k3d/store` (or `SIMRUN_K3D_STORE`, an absolute path) mounted into
every node, writes its kubeconfig to `.tools/kubeconfig`, applies `deploy/cluster/upstream` and
then `deploy/k3d` as deploy/README.md does, waits for Kueue, Argo, BuildKit and the Deployment
`simrun` (no replica on k3d) to be Available, builds `deploy/service/Dockerfile`, pushes it to
the registry of k3d (`localhost:5000` from the host, `k3d-simrun-registry:5000` from the nodes,
the `default_image` of the settings) and imports it into the nodes. At the end it deletes the
cluster, the registry, the store and the image, unless SIMRUN_K3D_KEEP=1.

Each test starts `simrun serve` on the host (the service runs beside the tests on k3d, as the
overlay says) with the settings of `deploy/k3d/simrun-config.yaml`, the store of the host, a
fresh index (so no test plans with resources another one taught) and a tokens file of its own:
`t-mk` is the owner `mk` (priority owner), `t-alice`/`t-bob` are people (standard) and
`t-alice-bot`/`t-bob-bot` their agents (agent). The tests talk to it over HTTP with
`simrun_cli.client.Client` and look at the cluster with kubectl.

Reservations and the build of images are written against the spec (03 Reservations, 38, 42) and
skipped while `ArgoBackend.capabilities` does not declare them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import yaml

from simrun_api.backends.argo import ArgoBackend
from simrun_cli.request import submit_request
from simrun_core.argo import labels
from simrun_core.launch import COORDINATOR
from simrun_core.states import RunState

from .k3d_env import (
    NAMESPACE,
    OWNER,
    REPO,
    RUN_TIMEOUT_S,
    K3dCluster,
    Service,
    gib,
    is_extra_worker,
    live,
    main_container,
    nodes_of,
    optional_tool,
    reservation,
    run,
    squares,
    sum_of_squares,
    wait_for,
    worker_of,
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        os.environ.get("SIMRUN_K3D") != "1",
        reason="needs a k3d cluster: SIMRUN_K3D=1 python -m pytest tests/cluster/k3d -m cluster",
    ),
    # the first test also creates the cluster and builds the image
    pytest.mark.timeout(3600),
]

SUCCEEDED = RunState.SUCCEEDED
RUN_ID = re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{6}\b")
EVICTION_S = 60.0 + 120.0
"""How long the pods of another run may take to leave a reserved node: the grace of a worker
(`grace_s` of the settings) and a margin."""


def succeeded(service: Service, run_id: str) -> None:
    item = service.wait(run_id)
    assert item.state is SUCCEEDED, (run_id, item.state, item.message, service.kinds(run_id))


def running_pods(cluster: K3dCluster, run_id: str) -> list[dict[str, Any]]:
    return [p for p in cluster.pods(run_id) if live(p) and p["status"].get("phase") == "Running"]


def priority(service: Service, run_id: str) -> str:
    (submitted,) = service.history(run_id, "submitted")
    return str(submitted.get("priority", "standard"))  # the default is left out of the event


def not_ended(service: Service, run_id: str, what: str) -> None:
    view = service.view(run_id)
    if view.state.ended:
        pytest.fail(f"run {run_id} ended {view.state.value} ({view.message}) before {what}")


# -- a run end to end -----------------------------------------------------------------------------


def test_the_demo_workflow_runs_end_to_end(service: Service, k3d_cluster: K3dCluster) -> None:
    """examples/squares.yaml, submitted as `simrun submit` does, succeeds with the sum of a
    thousand squares, through an Argo Workflow whose pods Kueue admitted on the worker nodes
    and which ran in the image of the service from the registry of k3d."""
    request = submit_request(REPO / "examples" / "squares.yaml", [])
    with service.client("t-alice") as client:
        view = client.submit(request)
    service.submitted.append(view.id)
    run_id = view.id
    assert view.backend == "argo"
    succeeded(service, run_id)
    assert service.summary(run_id) == {"n": 1000, "sum": sum_of_squares(1000)}
    kinds = service.kinds(run_id)
    for kind in ("workflow-submitted", "pod-admitted", "pod-started", "merged", "succeeded"):
        assert kind in kinds, kinds
    (submitted,) = service.history(run_id, "workflow-submitted")
    assert submitted["name"] == f"simrun-{run_id}"
    assert service.units_done(run_id) == set(range(1000))
    workers = set(k3d_cluster.worker_nodes)
    assert nodes_of(service.started(run_id)) <= workers
    workflow = k3d_cluster.workflow(run_id)
    assert workflow["metadata"]["labels"][labels.RUN] == run_id
    # the pods that ran (an extra worker still gated when the run ended never got a node)
    placed = [pod for pod in k3d_cluster.pods(run_id) if pod["spec"].get("nodeName")]
    assert placed
    for pod in placed:
        assert pod["spec"]["nodeName"] in workers, pod["spec"]["nodeName"]
        assert main_container(pod)["image"] == k3d_cluster.default_image


# -- take-back and preemption ---------------------------------------------------------------------

AGENT_UNITS = 360


def hold_every_node(service: Service, cluster: K3dCluster, token: str) -> str:
    """An agent run of pods of one process whose pods run on every worker node, extra workers
    among them, and which has done a unit; its id."""
    run_id = service.submit(squares("agent", AGENT_UNITS, 1.0, workers=1), token)

    def holding() -> bool:
        not_ended(service, run_id, "its pods ran on every node")
        pods = running_pods(cluster, run_id)
        on = {pod["spec"].get("nodeName") for pod in pods}
        return (
            on >= set(cluster.worker_nodes)
            and any(is_extra_worker(pod) for pod in pods)
            and bool(service.units_done(run_id))
        )

    wait_for(holding, 600, f"the pods of agent run {run_id} to run on every worker node")
    return run_id


def test_a_run_of_the_same_priority_takes_the_extra_workers_back(
    service: Service, k3d_cluster: K3dCluster
) -> None:
    """Spec 03, take-back: a second agent run submitted while the first one's pods fill the
    nodes gets its coordinator (agent base, 200) admitted by Kueue preempting an extra worker
    (agent extra, 100) of the first; the first keeps its coordinator, both succeed and the
    first computes every unit (the preempted worker's units are computed by the others)."""
    first = hold_every_node(service, k3d_cluster, "t-alice-bot")
    second = service.submit(
        squares("second", 20, 0.5, workers=1, split="single-server"), "t-bob-bot"
    )
    assert priority(service, first) == priority(service, second) == "agent"
    succeeded(service, second)
    succeeded(service, first)
    preempted = service.history(first, "pod-preempted")
    assert preempted, service.kinds(first)
    assert all(event["worker"] != COORDINATOR for event in preempted), preempted
    assert not service.history(second, "pod-preempted")
    assert service.units_done(first) == set(range(AGENT_UNITS))
    assert service.summary(first) == {"n": AGENT_UNITS, "sum": sum_of_squares(AGENT_UNITS)}
    assert service.summary(second) == {"n": 20, "sum": sum_of_squares(20)}


def test_the_owner_preempts_an_agent(service: Service, k3d_cluster: K3dCluster) -> None:
    """An owner run (priority 1000/900) submitted while an agent run's pods run on every node
    gets its pods admitted by Kueue preempting the agent's; both succeed, the agent run's log
    has `pod-preempted` and the owner run's none."""
    agent = hold_every_node(service, k3d_cluster, "t-alice-bot")
    owner = service.submit(squares("owner", 60, 0.5, workers=1), OWNER)
    assert priority(service, owner) == "owner"
    assert priority(service, agent) == "agent"
    succeeded(service, owner)
    succeeded(service, agent)
    assert service.history(agent, "pod-preempted"), service.kinds(agent)
    assert not service.history(owner, "pod-preempted")
    assert service.units_done(agent) == set(range(AGENT_UNITS))
    assert service.summary(agent) == {"n": AGENT_UNITS, "sum": sum_of_squares(AGENT_UNITS)}
    assert service.summary(owner) == {"n": 60, "sum": sum_of_squares(60)}


# -- a kill for memory ----------------------------------------------------------------------------


def test_a_pod_killed_for_memory_is_retried_once_with_the_retry_memory(
    service: Service, k3d_cluster: K3dCluster
) -> None:
    """One pod of one process of 0.6 GiB (a limit of 1 GiB: 0.125 + 0.6, whole GiB) whose unit
    allocates 1300 MiB: the kernel kills it (`OOMKilled`, exit 137), Argo retries it with the
    retry memory (0.9 GiB per process, 2 GiB the pod, `podSpecPatch`) and the run succeeds."""
    workflow = squares(
        "hungry",
        2,
        1.0,
        workers=1,
        memory_per_worker_gb=0.6,
        memory_mb=1300,
        split="single-server",
    )
    run_id = service.submit(workflow, "t-alice")
    (submitted,) = service.history(run_id, "submitted")
    shape = submitted["plans"]["squares"]["shape"]
    assert (shape["memory_gb"], shape["retry_memory_gb"]) == (1, 2), shape
    assert shape["per_worker_gb"] == pytest.approx(0.6), shape
    assert shape["retry_per_worker_gb"] == pytest.approx(0.9), shape
    succeeded(service, run_id)
    kills = service.history(run_id, "oom-killed")
    assert len(kills) == 1, service.kinds(run_id)
    assert (kills[0]["memory_gb"], kills[0]["retry_memory_gb"]) == (1, 2), kills
    failed = service.history(run_id, "pod-failed")
    assert len(failed) == 1, failed
    assert failed[0]["exit_code"] == 137 and failed[0]["oom"], failed
    retried = [r for r in service.history(run_id, "worker-report") if r.get("attempt", 0) == 1]
    assert retried, service.history(run_id, "worker-report")
    assert retried[-1]["per_worker_gb"] == pytest.approx(0.9), retried
    pods = sorted(k3d_cluster.pods(run_id), key=lambda pod: pod["metadata"]["creationTimestamp"])
    limits = [gib(main_container(pod)["resources"]["limits"]["memory"]) for pod in pods]
    assert limits == [1, 2], limits
    assert service.summary(run_id) == {"n": 2, "sum": 1}


# -- a reservation --------------------------------------------------------------------------------


def test_a_reserved_node_is_the_runs_alone_until_it_ends(
    service: Service, k3d_cluster: K3dCluster
) -> None:
    """Spec 03, Reservations: `reserve: NODE` taints the node `simrun/reserved=<run>:NoExecute`
    (which evicts the pods of other runs) and labels it `simrun/reserved=<run>` (which the
    pods of the run select); other runs' pods stay off it, the run's own run only there, and
    the node is released when the run ends."""
    if not ArgoBackend.capabilities.reservations:
        pytest.skip(
            "reservations have not landed: ArgoBackend.capabilities.reservations is False "
            "(the service refuses `reserve` with 422 on the argo backend)"
        )
    node = k3d_cluster.worker_nodes[-1]
    other = service.submit(squares("others", 360, 1.0, workers=1), "t-alice")

    def other_on_node() -> bool:
        not_ended(service, other, f"its pods ran on {node}")
        return any(p["spec"].get("nodeName") == node for p in running_pods(k3d_cluster, other))

    wait_for(other_on_node, 600, f"a pod of run {other} on {node}")
    reserved = service.submit(squares("reserved", 40, 0.5, workers=1), "t-bob", reserve=node)
    assert service.view(reserved).reserve == node

    def held() -> bool:
        label, taints = reservation(k3d_cluster.node(node))
        ours = [(t["key"], t.get("value"), t["effect"]) for t in taints]
        return label == reserved and ours == [(labels.RESERVED, reserved, "NoExecute")]

    wait_for(held, 300, f"{node} to be tainted and labelled for run {reserved}")
    assert [e["node"] for e in service.history(reserved, "node-reserved")] == [node]
    with service.client() as client:
        (server,) = [s for s in client.servers() if s.name == node]
    assert server.reserved_by == reserved

    def evicted() -> bool:
        return not [p for p in k3d_cluster.pods(other) if on(p, node) and live(p)]

    wait_for(evicted, EVICTION_S, f"the pods of run {other} to leave {node}")
    gone = {p["metadata"]["name"] for p in k3d_cluster.pods(other) if on(p, node)}
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (service.view(reserved).state.ended and service.view(other).state.ended):
        assert time.monotonic() < deadline, f"runs {reserved} and {other} did not end"
        intruders = [
            p["metadata"]["name"]
            for p in k3d_cluster.pods(other)
            if on(p, node) and p["metadata"]["name"] not in gone
        ]
        assert not intruders, f"pods of run {other} on the reserved {node}: {intruders}"
        pods = k3d_cluster.pods(reserved)
        strays = [p["metadata"]["name"] for p in pods if not on(p, node, unscheduled=True)]
        assert not strays, f"pods of the reserved run {reserved} off {node}: {strays}"
        time.sleep(3)
    succeeded(service, reserved)
    succeeded(service, other)
    assert nodes_of(service.started(reserved)) == {node}
    assert [e["node"] for e in service.history(reserved, "node-released")] == [node]
    wait_for(
        lambda: reservation(k3d_cluster.node(node)) == (None, []),
        120,
        f"the reservation of {node} to be removed",
    )
    assert service.summary(reserved) == {"n": 40, "sum": sum_of_squares(40)}
    assert service.summary(other) == {"n": 360, "sum": sum_of_squares(360)}


def on(pod: dict[str, Any], node: str, unscheduled: bool = False) -> bool:
    """Whether a pod is on `node` (or, with `unscheduled`, not on any node yet)."""
    placed = pod["spec"].get("nodeName")
    return placed == node or (unscheduled and not placed)


# -- a lost worker --------------------------------------------------------------------------------


def test_a_lost_worker_does_not_fail_its_run(service: Service, k3d_cluster: K3dCluster) -> None:
    """`kubectl delete pod` of an extra worker that has done units, mid-run: Argo retries it
    (or the coordinator computes its units), the run succeeds with every unit and the right
    sum, and the log ends that worker's attempt without failing the run."""
    units = 240
    run_id = service.submit(squares("lost", units, 1.0, workers=1), "t-alice")

    def victim() -> dict[str, Any] | None:
        not_ended(service, run_id, "one of its extra workers was deleted")
        done_by = {e["worker"] for e in service.history(run_id, "unit-done", "units-done")}
        for pod in running_pods(k3d_cluster, run_id):
            if is_extra_worker(pod) and worker_of(pod) in done_by:
                return pod
        return None

    pod = wait_for(victim, 600, f"an extra worker of run {run_id} that has done a unit")
    worker = worker_of(pod)
    k3d_cluster.delete_pod(pod["metadata"]["name"])
    succeeded(service, run_id)
    ended = [
        event
        for event in service.history(run_id, "pod-preempted", "pod-failed")
        if event["worker"] == worker
    ]
    assert ended, f"no end of the deleted worker {worker}: {service.kinds(run_id)}"
    assert service.units_done(run_id) == set(range(units))
    assert service.summary(run_id) == {"n": units, "sum": sum_of_squares(units)}


# -- the build of an image ------------------------------------------------------------------------

PYPROJECT = """\
[project]
name = "k3d-model"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = []

[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"
"""


def test_the_image_of_a_model_is_built_and_its_pods_run_in_it(
    make_service: Any, k3d_cluster: K3dCluster, tmp_path: Path
) -> None:
    """Spec 42 and 38: a run whose model has a `pyproject.toml` and a `uv.lock` gets the image
    of its environment, built by a Job of buildctl with BuildKit and pushed to the registry of
    k3d (`environment-resolved` and `built` name it), its pods run in that image, and a second
    run of the same environment finds the image instead of building it again."""
    if not ArgoBackend.capabilities.images:
        pytest.skip(
            "the build of images has not landed: ArgoBackend.capabilities.images is False "
            "(has_image/build_image and the snapshots of sources are to come)"
        )
    uv, crane = optional_tool("uv"), optional_tool("crane")
    if uv is None or crane is None:
        pytest.skip("the build test needs uv (to lock the model) and crane (to mirror the base)")
    cluster_settings = k3d_cluster.settings["cluster"]
    # the base image of the environments, mirrored with its digest (deploy/README.md, step 5)
    named, digest = cluster_settings["base_image"].split("@", 1)
    repository = named.rsplit(":", 1)[0]
    base = f"{k3d_cluster.host_registry}/{named}"
    run([crane, "copy", "--insecure", f"ghcr.io/{repository}@{digest}", base], timeout=900)
    # the wheel of simrun the images install (`simrun_wheel`): the one in the service image
    wheel = tmp_path / Path(k3d_cluster.settings["simrun_wheel"]).name
    container = k3d_cluster.docker("create", k3d_cluster.host_image).strip()
    try:
        k3d_cluster.docker("cp", f"{container}:{k3d_cluster.settings['simrun_wheel']}", str(wheel))
    finally:
        k3d_cluster.docker("rm", container, check=False)
    model = model_repository(tmp_path / "model", uv)
    service = make_service({"simrun_wheel": str(wheel)})
    workflow = tmp_path / "model.yaml"
    workflow.write_text(yaml.safe_dump(msgspec.to_builtins(squares("model", 20, 0.1, workers=1))))

    first = submit_with_source(service, k3d_cluster, workflow, model)
    (resolved,) = service.history(first, "environment-resolved")
    image = resolved["image"]
    assert image and image.startswith(f"{k3d_cluster.registry}/"), resolved
    assert image != k3d_cluster.default_image
    assert [e["image"] for e in service.history(first, "built")] == [image]
    assert service.view(first).image == image
    assert in_registry(k3d_cluster, image), image
    for pod in k3d_cluster.pods(first):
        assert main_container(pod)["image"] == image
    assert service.summary(first) == {"n": 20, "sum": sum_of_squares(20)}

    builds = build_jobs(k3d_cluster)
    second = submit_with_source(service, k3d_cluster, workflow, model)
    assert [e["image"] for e in service.history(second, "built")] == [image]
    assert build_jobs(k3d_cluster) == builds, "the image was built again"


def model_repository(path: Path, uv: str) -> Path:
    """A git repository of a model without dependencies, with its `uv.lock`."""
    (path / "k3d_model").mkdir(parents=True)
    (path / "pyproject.toml").write_text(PYPROJECT)
    (path / "k3d_model" / "__init__.py").write_text('"""A model of the k3d tests."""\n')
    run([uv, "lock", "--directory", str(path)], timeout=300)
    git = ["git", "-C", str(path), "-c", "user.name=k3d", "-c", "user.email=k3d@tests"]
    run([*git, "init", "-q"])
    run([*git, "add", "-A"])
    run([*git, "commit", "-q", "-m", "model"])
    return path


def submit_with_source(service: Service, cluster: K3dCluster, workflow: Path, model: Path) -> str:
    """`simrun submit WORKFLOW --source model=PATH` against the service, as a person of a
    development server that mounts the store would; the id of the run, which succeeded."""
    env = os.environ | {
        "SIMRUN_URL": service.url,
        "SIMRUN_TOKEN": "t-alice",
        "SIMRUN_STORE": str(cluster.store),
    }
    argv = [sys.executable, "-m", "simrun_cli", "submit", str(workflow)]
    result = subprocess.run(
        [*argv, "--source", f"model={model}", "--timeout", "1500"],
        cwd=model,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    found = RUN_ID.findall(result.stdout + result.stderr)
    assert found, result.stdout + result.stderr
    service.submitted.append(found[0])
    assert result.returncode == 0, result.stdout + result.stderr
    return found[0]


def in_registry(cluster: K3dCluster, image: str) -> bool:
    """Whether the registry of k3d has an image (asked its API from the host)."""
    name = image[len(cluster.registry) + 1 :]
    if "@" in name:
        repository, reference = name.split("@", 1)
    else:
        repository, reference = name.rsplit(":", 1)
    accept = ", ".join(
        (
            "application/vnd.oci.image.index.v1+json",
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.docker.distribution.manifest.list.v2+json",
            "application/vnd.docker.distribution.manifest.v2+json",
        )
    )
    url = f"http://{cluster.host_registry}/v2/{repository}/manifests/{reference}"
    answer = httpx.head(url, headers={"Accept": accept}, timeout=10, trust_env=False)
    return answer.status_code == 200


def build_jobs(cluster: K3dCluster) -> list[str]:
    """The uids of the Jobs of the namespace that ran buildctl (the builds of images, spec 38;
    a Job's name is fixed by its image, so a build started again has the name of the first)."""
    buildctl = cluster.settings["cluster"]["buildctl_image"]
    jobs = cluster.get("jobs", "-n", NAMESPACE)["items"]
    return sorted(
        job["metadata"]["uid"]
        for job in jobs
        if any(
            c.get("image") == buildctl
            for c in job["spec"]["template"]["spec"].get("containers") or []
        )
    )
