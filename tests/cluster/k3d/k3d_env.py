"""The k3d cluster of the cluster tests, and a service on the host against it (test_k3d.py).

`K3dCluster` creates (or reuses) the cluster of `deploy/k3d/k3d.yaml`, applies
`deploy/cluster/upstream` and `deploy/k3d` as deploy/README.md says, pushes the image of
`deploy/service/Dockerfile` into the registry of k3d and deletes it all again at the end (unless
`SIMRUN_K3D_KEEP=1`). `start_service` runs `simrun serve` on the host with the settings of
`deploy/k3d/simrun-config.yaml` (the Deployment of the service has no replica on k3d: the service
runs beside the tests), the store the nodes mount and a tokens file of its own, and
`Service` talks to it through `simrun_cli.client.Client`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml
from unit_events import UNIT_TYPES, unit_indices

from simrun_cli.client import Client
from simrun_core.argo import labels
from simrun_core.launch import COORDINATOR
from simrun_core.wire import RunItem, RunView, SubmitRequest
from simrun_core.workflow import Workflow, workflow_from_data

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
K3D_CONFIG = DEPLOY / "k3d" / "k3d.yaml"
K3D_SETTINGS = DEPLOY / "k3d" / "simrun-config.yaml"
UPSTREAM = DEPLOY / "cluster" / "upstream"
OVERLAY = DEPLOY / "k3d"
DOCKERFILE = DEPLOY / "service" / "Dockerfile"
TOOLS = REPO / ".tools"
KUBECONFIG = TOOLS / "kubeconfig"
DEFAULT_STORE = TOOLS / "k3d" / "store"

NAMESPACE = "simrun"
WORKFLOWS = "workflows.argoproj.io"
MAIN = "main"
"""The container of a pod of Argo that runs the harness."""
DEPLOYMENTS = (
    ("kueue-system", "kueue-controller-manager"),
    (NAMESPACE, "workflow-controller"),
    (NAMESPACE, "buildkitd"),
    # no replica on k3d (the service runs beside the tests): Available as soon as it is applied
    (NAMESPACE, "simrun"),
)
"""The Deployments (namespace, name) that have to be Available before a test runs."""
UPSTREAM_FIRST = (("kueue-system", "kueue-controller-manager"), (NAMESPACE, "workflow-controller"))
"""What `deploy/k3d` needs up before it is applied: Kueue's webhooks validate its queues."""

OWNER = "t-mk"
TOKENS: dict[str, dict[str, str]] = {
    # the owner of the cluster (`owner: mk` of the settings): priority owner, its agents too
    "t-mk": {"name": "mk", "kind": "person"},
    "t-mk-bot": {"name": "mk-bot", "kind": "agent", "owner": "mk"},
    # other people: priority standard; their agents: priority agent
    "t-alice": {"name": "alice", "kind": "person"},
    "t-alice-bot": {"name": "alice-bot", "kind": "agent", "owner": "alice"},
    "t-bob": {"name": "bob", "kind": "person"},
    "t-bob-bot": {"name": "bob-bot", "kind": "agent", "owner": "bob"},
}
"""The tokens file of the service of the tests (the Secret `simrun-tokens` is `{}` in deploy/)."""

RUN_TIMEOUT_S = 900.0
T = TypeVar("T")


class CommandFailed(AssertionError):
    """A command of the setup failed: its argv, exit code and the end of its output."""

    def __init__(self, argv: list[str], result: subprocess.CompletedProcess[str]) -> None:
        output = (result.stdout or "")[-3000:] + (result.stderr or "")[-3000:]
        super().__init__(f"{' '.join(argv)} exited {result.returncode}:\n{output}")
        self.result = result


def run(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 600.0,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command in the repository; CommandFailed for a non-zero exit when `check`."""
    result = subprocess.run(
        argv,
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise CommandFailed(argv, result)
    return result


def wait_for(condition: Callable[[], T | None], timeout: float, what: str, every: float = 2.0) -> T:
    """Poll `condition` until it returns a truthy value, which is returned; fail after
    `timeout` seconds naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:.0f} s for {what}")
        time.sleep(every)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sum_of_squares(n: int) -> int:
    return sum(i * i for i in range(n))


def gib(quantity: str) -> float:
    """A Kubernetes quantity of memory in GiB (`1Gi`, `1536Mi`, `1073741824`)."""
    units = {"Gi": 1.0, "Mi": 1 / 1024, "Ki": 1 / 1024**2, "G": 1e9 / 1024**3, "M": 1e6 / 1024**3}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * factor
    return float(quantity) / 1024**3


# -- tools --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Tools:
    """The commands the setup needs: from `.tools/bin` if there, else from PATH."""

    docker: str
    k3d: str
    kubectl: str

    @classmethod
    def find(cls) -> Tools:
        found: dict[str, str] = {}
        missing: list[str] = []
        for name in ("docker", "k3d", "kubectl"):
            local = TOOLS / "bin" / name
            path = str(local) if os.access(local, os.X_OK) else shutil.which(name)
            if path is None:
                missing.append(name)
            else:
                found[name] = path
        if missing:
            pytest.fail(
                f"SIMRUN_K3D=1 needs docker, k3d (v5.9) and kubectl (kustomize v5): "
                f"{', '.join(missing)} not found in .tools/bin or on PATH"
            )
        tools = cls(**found)
        engine = run([tools.docker, "info", "--format", "{{.ServerVersion}}"], check=False)
        if engine.returncode != 0:
            pytest.fail(f"SIMRUN_K3D=1 needs a running Docker engine: {engine.stderr.strip()}")
        return tools


def optional_tool(name: str) -> str | None:
    """A command that only some tests need (crane, uv), or None."""
    local = TOOLS / "bin" / name
    return str(local) if os.access(local, os.X_OK) else shutil.which(name)


# -- the cluster --------------------------------------------------------------------------------


def k3d_settings() -> dict[str, Any]:
    """The settings of the service on k3d: `settings.yaml` of the ConfigMap `simrun-config`."""
    config_map = yaml.safe_load(K3D_SETTINGS.read_text())
    settings = yaml.safe_load(config_map["data"]["settings.yaml"])
    assert isinstance(settings, dict)
    return settings


@dataclasses.dataclass
class K3dCluster:
    """The k3d cluster `simrun-test` of `deploy/k3d/k3d.yaml` with deploy/k3d applied."""

    tools: Tools
    store: Path
    keep: bool
    settings: dict[str, Any] = dataclasses.field(default_factory=k3d_settings)
    worker_nodes: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        config = yaml.safe_load(K3D_CONFIG.read_text())
        self.name: str = config["metadata"]["name"]
        created = config["registries"]["create"]
        self.registry_container: str = created["name"]
        self.registry: str = self.settings["cluster"]["registry"]
        """The registry as the nodes and BuildKit name it: k3d-simrun-registry:5000."""
        self.host_registry = f"localhost:{created['hostPort']}"
        """The registry as the host names it (k3d publishes it on 127.0.0.1)."""
        self.default_image: str = self.settings["default_image"]
        self.host_image = self.on_host(self.default_image)

    def on_host(self, image: str) -> str:
        """An image of the registry of the nodes, named as the host pushes it."""
        assert image.startswith(f"{self.registry}/"), image
        return self.host_registry + image[len(self.registry) :]

    @property
    def env(self) -> dict[str, str]:
        """The environment of kubectl, k3d and the service: the kubeconfig of the cluster (no
        in-cluster configuration, even when the tests run in a pod) and the store."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["KUBECONFIG"] = str(KUBECONFIG)
        env["SIMRUN_K3D_STORE"] = str(self.store)
        return env

    # the commands

    def k3d(self, *args: str, check: bool = True, timeout: float = 600.0) -> str:
        return run([self.tools.k3d, *args], env=self.env, check=check, timeout=timeout).stdout

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120.0, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run(
            [self.tools.kubectl, *args], env=self.env, check=check, timeout=timeout, stdin=stdin
        )

    def get(self, *args: str) -> dict[str, Any]:
        """`kubectl get ... -o json`, decoded."""
        result: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return result

    def docker(self, *args: str, check: bool = True, timeout: float = 1800.0) -> str:
        return run([self.tools.docker, *args], env=self.env, check=check, timeout=timeout).stdout

    # up and down

    def exists(self) -> bool:
        clusters = json.loads(self.k3d("cluster", "list", "--output", "json") or "[]")
        return any(cluster.get("name") == self.name for cluster in clusters)

    def up(self) -> None:
        """Create the cluster (or start the one kept), apply deploy/, push the service image."""
        self.store.mkdir(parents=True, exist_ok=True)
        if self.exists():
            self.k3d("cluster", "start", self.name, check=False)
        else:
            # k3d expands ${SIMRUN_K3D_STORE} of k3d.yaml from the environment
            self.k3d("cluster", "create", "--config", str(K3D_CONFIG), timeout=900)
        KUBECONFIG.parent.mkdir(parents=True, exist_ok=True)
        KUBECONFIG.write_text(self.k3d("kubeconfig", "get", self.name))
        KUBECONFIG.chmod(stat.S_IRUSR | stat.S_IWUSR)
        # deploy/README.md, "On k3d": the release manifests first, with a field manager of their own
        self.apply("--server-side", "--field-manager=simrun-upstream", "-k", str(UPSTREAM), tries=3)
        for namespace, name in UPSTREAM_FIRST:
            self.wait_available(namespace, name)
        # repeated until Kueue's webhook answers and its CRDs are known
        self.apply("--server-side", "-k", str(OVERLAY), tries=12)
        self.wait_registry()
        self.docker("build", "-f", str(DOCKERFILE), "-t", self.host_image, str(REPO))
        self.docker("push", self.host_image)
        # and into the nodes under the name the pods use, so no node pulls it (or runs a stale
        # copy of a kept cluster: the pods pull an image of a version tag only when missing)
        self.docker("tag", self.host_image, self.default_image)
        self.k3d("image", "import", self.default_image, "--cluster", self.name, timeout=900)
        for namespace, name in DEPLOYMENTS:
            self.wait_available(namespace, name)
        nodes = self.get("nodes", "-l", f"{labels.WORKER_NODE}=true")["items"]
        self.worker_nodes = sorted(node["metadata"]["name"] for node in nodes)
        assert len(self.worker_nodes) == 3, self.worker_nodes

    def apply(self, *args: str, tries: int) -> None:
        for attempt in range(1, tries + 1):
            try:
                self.kubectl("apply", *args, timeout=300)
                return
            except CommandFailed:
                if attempt == tries:
                    raise
                time.sleep(10)

    def wait_available(self, namespace: str, name: str) -> None:
        self.kubectl(
            "-n",
            namespace,
            "wait",
            f"deployment/{name}",
            "--for=condition=Available",
            "--timeout=5m",
            timeout=330,
        )

    def wait_registry(self) -> None:
        def answers() -> bool:
            try:
                url = f"http://{self.host_registry}/v2/"
                return httpx.get(url, timeout=5, trust_env=False).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, 120, f"the registry of k3d at {self.host_registry}")

    def down(self) -> None:
        """Delete the cluster, its registry, the store and the image, unless kept."""
        if self.keep:
            return
        self.give_back_store()
        self.k3d("cluster", "delete", self.name, check=False)
        # a registry of `registries.create` goes with its cluster; if not, it goes here
        self.k3d("registry", "delete", self.registry_container, check=False)
        shutil.rmtree(self.store, ignore_errors=True)
        KUBECONFIG.unlink(missing_ok=True)
        self.docker("image", "rm", self.host_image, self.default_image, check=False)

    def give_back_store(self) -> None:
        """The pods write the store as root: give its files back to the user of the tests."""
        if not self.store.exists():
            return
        owner = f"{os.getuid()}:{os.getgid()}"
        self.docker(
            "run",
            "--rm",
            "--user",
            "0",
            "--entrypoint",
            "chown",
            "-v",
            f"{self.store}:/store",
            self.host_image,
            "-R",
            owner,
            "/store",
            check=False,
            timeout=300,
        )

    # what the tests look at

    def pods(self, run_id: str) -> list[dict[str, Any]]:
        """The pods of a run (Argo puts the labels of the workflow's podMetadata on them)."""
        return self.get("pods", "-n", NAMESPACE, "-l", f"{labels.RUN}={run_id}")["items"]

    def node(self, name: str) -> dict[str, Any]:
        return self.get("node", name)

    def workflow(self, run_id: str) -> dict[str, Any]:
        return self.get(WORKFLOWS, "-n", NAMESPACE, f"simrun-{run_id}")

    def delete_pod(self, name: str) -> None:
        """Delete a pod as a lost node or an operator would: gracefully, without waiting."""
        self.kubectl("-n", NAMESPACE, "delete", "pod", name, "--wait=false")

    def clear_reservations(self) -> None:
        """Remove a reservation a failed test left on a node (its label and taint)."""
        for name in self.worker_nodes:
            node = self.node(name)
            if labels.RESERVED in (node["metadata"].get("labels") or {}):
                self.kubectl("label", "node", name, f"{labels.RESERVED}-", check=False)
            taints = node.get("spec", {}).get("taints") or []
            if any(taint.get("key") == labels.RESERVED for taint in taints):
                self.kubectl("taint", "node", name, f"{labels.RESERVED}-", check=False)

    def busy(self) -> bool:
        """Whether a pod of a run has not ended (of an earlier test or session)."""
        pods = self.get("pods", "-n", NAMESPACE, "-l", labels.RUN)["items"]
        return any(live(pod) for pod in pods)

    def delete_workflows(self) -> None:
        """Delete the workflows of runs and wait for their pods to end (the pods of a workflow
        are owned by it), e.g. those of a kept cluster."""
        self.kubectl(
            "-n", NAMESPACE, "delete", WORKFLOWS, "-l", labels.RUN, "--wait=false", timeout=120
        )
        wait_for(lambda: not self.busy(), 300, "the pods of earlier runs to end", every=5.0)


def main_env(pod: dict[str, Any]) -> dict[str, str]:
    """The environment of the harness's container of a pod (its launch contract)."""
    for container in pod["spec"].get("containers") or []:
        if container.get("name") == MAIN:
            return {e["name"]: e.get("value", "") for e in container.get("env") or []}
    return {}


def main_container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["spec"]["containers"] if c.get("name") == MAIN]
    return container


def worker_of(pod: dict[str, Any]) -> str:
    """The worker of a pod of a split task: `w0` the coordinator, `w1`... the extra workers."""
    return main_env(pod).get("SIMRUN_WORKER", "")


def is_extra_worker(pod: dict[str, Any]) -> bool:
    """A pod of an extra worker of a split task (its role `extra`, not the coordinator)."""
    return main_env(pod).get("SIMRUN_ROLE") == "extra" and worker_of(pod) != COORDINATOR


def live(pod: dict[str, Any]) -> bool:
    """A pod that has not ended and is not being deleted."""
    return pod["status"].get("phase") in ("Pending", "Running") and not pod["metadata"].get(
        "deletionTimestamp"
    )


def reservation(node: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """The `simrun/reserved` label of a node and its taints of that key."""
    label = (node["metadata"].get("labels") or {}).get(labels.RESERVED)
    taints = node.get("spec", {}).get("taints") or []
    return label, [t for t in taints if t.get("key") == labels.RESERVED]


# -- the service --------------------------------------------------------------------------------


def squares(
    name: str,
    n: int,
    sleep_s: float,
    *,
    workers: int | None = None,
    memory_per_worker_gb: float | None = None,
    memory_mb: int = 0,
    split: str | None = None,
) -> Workflow:
    """A workflow of one task `squares` of the demo type `demo.squares`."""
    settings: dict[str, Any] = {"n": n, "sleep_s": sleep_s}
    if memory_mb:
        settings["memory_mb"] = memory_mb
    task: dict[str, Any] = {"id": "squares", "type": "demo.squares", "settings": settings}
    resources = {"workers": workers, "memory_per_worker_gb": memory_per_worker_gb}
    resources = {key: value for key, value in resources.items() if value is not None}
    if resources:
        task["resources"] = resources
    if split is not None:
        task["split"] = split
    return workflow_from_data({"name": name, "tasks": [task]})


@dataclasses.dataclass
class Service:
    """`simrun serve` on the host against the cluster, and its clients (one per token)."""

    cluster: K3dCluster
    root: Path
    process: subprocess.Popen[bytes]
    url: str
    settings: dict[str, Any]
    submitted: list[str] = dataclasses.field(default_factory=list)

    def client(self, token: str = OWNER) -> Client:
        return Client(self.url, token, timeout=60.0)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "service.log").read_text(errors="replace")[-4000:]
        return ""

    def submit(self, workflow: Workflow, token: str = OWNER, **request: Any) -> str:
        """`POST /runs`; the id of the run (cancelled at the end of the test if still live)."""
        with self.client(token) as client:
            view = client.submit(SubmitRequest(workflow=workflow, **request))
        self.submitted.append(view.id)
        return view.id

    def wait(self, run_id: str, timeout: float = RUN_TIMEOUT_S) -> RunItem:
        """Wait for the end of a run; fail naming its state and message when it does not end."""
        with self.client() as client:
            item = client.wait(run_id, timeout)
        assert item.state.ended, f"run {run_id} still {item.state.value} after {timeout:.0f} s"
        return item

    def view(self, run_id: str) -> RunView:
        with self.client() as client:
            return client.run(run_id)

    def history(self, run_id: str, *types: str) -> list[dict[str, Any]]:
        """The events of a run (`GET /runs/{run}/history`), of `types` only if given."""
        with self.client() as client:
            return client.history(run_id, types=types)

    def kinds(self, run_id: str) -> list[str]:
        return [event["type"] for event in self.history(run_id)]

    def summary(self, run_id: str, task: str = "squares") -> dict[str, Any]:
        """The `summary.json` of a task, downloaded through the API."""
        buffer = io.BytesIO()
        with self.client() as client:
            client.download(run_id, task, "summary.json", buffer.write)
        result: dict[str, Any] = json.loads(buffer.getvalue())
        return result

    def started(self, run_id: str) -> list[tuple[str, str | None]]:
        """(worker, node) of every `pod-started` of a run."""
        return [(e["worker"], e.get("node")) for e in self.history(run_id, "pod-started")]

    def units_done(self, run_id: str) -> set[int]:
        return set(unit_indices(self.history(run_id, *UNIT_TYPES)))

    def cancel_live_runs(self, timeout: float = 300.0) -> None:
        """Cancel the runs of this test that have not ended, and wait for their end."""
        with self.client() as client:
            live_runs = [run for run in self.submitted if not client.run(run).state.ended]
            for run_id in live_runs:
                with contextlib.suppress(Exception):
                    client.cancel(run_id)
            for run_id in live_runs:
                with contextlib.suppress(Exception):
                    client.wait(run_id, timeout)


def start_service(cluster: K3dCluster, root: Path, extra: dict[str, Any] | None = None) -> Service:
    """`simrun serve --host 127.0.0.1 --port P` of settings written into `root`: those of
    deploy/k3d with the store of the host (the directory k3d mounts into every node), an index
    of its own (no resources learned by other tests), the tokens of `TOKENS` and `extra`."""
    root.mkdir(parents=True, exist_ok=True)
    tokens = root / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(TOKENS))
    tokens.chmod(stat.S_IRUSR | stat.S_IWUSR)  # the service refuses a tokens file others read
    settings = json.loads(json.dumps(cluster.settings))
    settings.update(
        store=str(cluster.store), db=str(root / "index.db"), tokens=str(tokens), poll_s=2.0
    )
    # the wheel of the image is no file on the host; a test of builds names one in `extra`
    settings.pop("simrun_wheel", None)
    # the service asks the registry's API whether an image exists: from the host, localhost:5000
    settings["cluster"]["registry_url"] = f"http://{cluster.host_registry}"
    settings.update(extra or {})
    path = root / "settings.yaml"
    path.write_text(yaml.safe_dump(settings, sort_keys=False))
    port = free_port()
    env = cluster.env | {"SIMRUN_CONFIG": str(path), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "simrun_cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with (root / "service.log").open("ab") as log:
        process = subprocess.Popen(
            argv,
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    service = Service(cluster, root, process, f"http://127.0.0.1:{port}", settings)

    def answers() -> bool:
        if process.poll() is not None:
            pytest.fail(f"the service exited {process.returncode}:\n{service.log_tail()}")
        try:
            with service.client() as client:
                return client.me().name == "mk"
        except Exception:
            return False

    wait_for(answers, 90, f"the service at {service.url}", every=0.5)
    return service


def stop_service(service: Service) -> None:
    """Cancel the live runs of the test, then SIGTERM the service (SIGKILL after 30 s)."""
    try:
        if service.process.poll() is None:
            service.cancel_live_runs()
    finally:
        if service.process.poll() is None:
            service.process.send_signal(signal.SIGTERM)
            try:
                service.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(service.process.pid, signal.SIGKILL)
                service.process.wait()


def nodes_of(started: Iterable[tuple[str, str | None]]) -> set[str]:
    return {node for _, node in started if node}
