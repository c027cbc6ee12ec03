"""A real service process on the Argo backend of a fake cluster, for the tests of
`test_service_process.py`.

`ServiceProcess` writes a settings file (`backend: argo`, the cluster section of the fake
cluster's `ClusterConfig`, the store its `store_dir`, so the kubelet's pods write where the
service reads), a tokens file and the cluster's kubeconfig into a directory of its own, and runs
`python -m simrun_cli serve --port P` with `SIMRUN_CONFIG` and `KUBECONFIG` until it answers
`GET /me`. `start()` may be called again after `kill()` (SIGKILL) or `stop()` (SIGTERM): the
next process serves the same store, index and settings, on a new port.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import msgspec
import yaml
from fake.cluster import FakeCluster
from unit_events import unit_indices

from simrun_core import events as ev
from simrun_core.store import RunPaths, read_log

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
PYTHONPATH = {
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
}
"""This checkout first on the path of the processes the tests start (the service, the pods, the
command line), whichever directory they run in and however simrun is installed."""
HARNESS_ENV = {"SIMRUN_MEMORY_SOURCE": "process", **PYTHONPATH}
"""The pods' environment: the harness reads its memory from its process tree (the fake
kubelet's pods share this machine's cgroup), and imports this checkout."""
TOKEN = "t-mk"
OWNER = "mk"
TIMEOUT_S = 30.0


def free_port() -> int:
    """A port free now (the service binds it right after; a clash fails its start)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(
    condition: Callable[[], T | None], what: str, timeout_s: float = TIMEOUT_S, step_s: float = 0.05
) -> T:
    """The first true value of `condition()`, polled every `step_s`; AssertionError naming
    `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s} s for {what}")
        time.sleep(step_s)


class ServiceProcess:
    """`simrun serve` of a settings file on the Argo backend of `cluster`, in `root`."""

    def __init__(self, cluster: FakeCluster, root: Path, **settings: Any) -> None:
        self.cluster = cluster
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        tokens = self.root / "tokens.yaml"
        tokens.write_text(yaml.safe_dump({TOKEN: {"name": OWNER, "kind": "person"}}))
        tokens.chmod(0o600)
        config = {
            "store": str(cluster.store_dir),
            "db": "db/simrun.sqlite",
            "tokens": "tokens.yaml",
            "owner": OWNER,
            "backend": "argo",
            "default_image": "simrun:test",
            "poll_s": 1.0,
            "cluster": msgspec.to_builtins(cluster.config),
            **settings,
        }
        self.settings = self.root / "settings.yaml"
        self.settings.write_text(yaml.safe_dump(config))
        self.kubeconfig = cluster.write_kubeconfig(self.root / "kubeconfig")
        self.process: subprocess.Popen[bytes] | None = None
        self.processes: list[subprocess.Popen[bytes]] = []
        self.url = ""
        self.client: httpx.Client | None = None

    @property
    def store(self) -> Path:
        return self.cluster.store_dir

    def env(self) -> dict[str, str]:
        """The environment of a `simrun` command line that talks to this service."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIMRUN_")}
        return {**env, **PYTHONPATH, "SIMRUN_URL": self.url, "SIMRUN_TOKEN": TOKEN}

    # -- life cycle

    def start(self) -> ServiceProcess:
        """Start a service process and wait until it answers `GET /me`."""
        assert self.process is None or self.process.poll() is not None, "one runs already"
        port = free_port()
        number = len(self.processes) + 1
        log_path = self.root / f"service-{number}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMRUN_", "KUBE"))}
        env.update(PYTHONPATH, SIMRUN_CONFIG=str(self.settings), KUBECONFIG=str(self.kubeconfig))
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "simrun_cli", "serve", "--port", str(port)],
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(self.process)
        self.url = f"http://127.0.0.1:{port}"
        if self.client is not None:
            self.client.close()
        self.client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        )
        process, client = self.process, self.client

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the service exited: {log_path.read_text()[-3000:]}")
            try:
                return client.get("/me").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, "the service to answer GET /me")
        return self

    def kill(self) -> None:
        """SIGKILL the service process (its group: nothing of it is left) and reap it."""
        assert self.process is not None and self.process.poll() is None, "no service runs"
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        assert self.process.returncode == -signal.SIGKILL

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the service and wait for its end; SIGKILL its group after `timeout_s`."""
        if self.client is not None:
            self.client.close()
            self.client = None
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def log_text(self) -> str:
        """The output of every service process so far."""
        return "\n".join(
            path.read_text(errors="replace") for path in sorted(self.root.glob("service-*.log"))
        )

    # -- the API

    @property
    def http(self) -> httpx.Client:
        assert self.client is not None, "no service runs"
        return self.client

    def submit(self, workflow: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post("/runs", json={"workflow": workflow})
        assert response.status_code == 201, response.text
        body: dict[str, Any] = response.json()
        return body

    def run(self, run_id: str) -> dict[str, Any]:
        response = self.http.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def servers(self) -> list[dict[str, Any]]:
        response = self.http.get("/servers")
        assert response.status_code == 200, response.text
        body: list[dict[str, Any]] = response.json()
        return body

    def ended(self, run_id: str, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
        """The run once the service says it ended (the fake cluster checked for errors)."""

        def ended() -> dict[str, Any] | None:
            assert self.cluster.errors == [], self.cluster.errors
            view = self.run(run_id)
            return view if view["state"] in ("succeeded", "failed", "cancelled") else None

        return wait_for(ended, f"run {run_id} to end", timeout_s, step_s=0.2)

    # -- the store

    def log(self, run_id: str) -> list[ev.Event]:
        """The run's event log as it is in the store now."""
        return read_log(RunPaths(self.store, run_id).events)

    def harness_done(self, run_id: str, task: str) -> set[int]:
        """The units of `task` the pods wrote done (`units-done`, `unit-done`) into their own
        logs so far (a torn last line skipped)."""
        found = set()
        for path in RunPaths(self.store, run_id).worker_events(task).glob("*.jsonl"):
            for line in path.read_bytes().splitlines():
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    found.update(unit_indices([event]))
        return found


@contextlib.contextmanager
def serving(cluster: FakeCluster, root: Path, **settings: Any) -> Iterator[ServiceProcess]:
    """A started `ServiceProcess`, stopped at the end; its output is printed when it fails."""
    service = ServiceProcess(cluster, root, **settings).start()
    try:
        yield service
    except BaseException:
        print(service.log_text()[-6000:])
        raise
    finally:
        service.stop()
