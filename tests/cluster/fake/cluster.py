"""A whole fake cluster: the Kubernetes API with nodes, Argo, Kueue and a kubelet that run pods.

`FakeCluster` starts `FakeKubernetes` over a `Store` with graceful pod deletion, creates its
nodes (labelled `simrun/worker=true` and `kubernetes.io/hostname`, with allocatable cores,
memory, GPUs, ephemeral storage and pods) and, unless `queue=False`, the Kueue objects of the
deployment (`simrun_core.kueue.kueue_objects`: the six priority classes, the Topology, the
ResourceFlavor, the ClusterQueue of `quota`, by default the nodes' resources, and the
LocalQueue), then runs `ArgoController`, `Kueue`, `JobController` and `Kubelet` as tasks of one
asyncio loop in a thread of its own. So a test, sync or async, or a service in another process
(`write_kubeconfig`), talks to it over HTTP as to a real cluster, while the pods' commands run
here as processes with the store claim at `store` and the scratch hostPath under `scratch`.

`stop()` ends the loop (every process group is killed) and the API. `errors` collects what the
emulators refused or failed at; a test asserts it is empty. `wait_for` waits on a condition of
the store, checked after every change of a workflow and at least every 0.1 s, with a timeout.

Not emulated: more than one namespace's worth of queues (the LocalQueue is made in
`config.namespace`), nodes joining or leaving while it runs (`add_node` only adds), node
conditions and heartbeats, DaemonSets.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from simrun_core import kueue as kueue_objects
from simrun_core.argo import labels as simrun_labels
from simrun_core.cluster import ClusterConfig

from .api import FakeKubernetes
from .argo import ArgoController
from .jobs import JobController
from .kubelet import Kubelet
from .kueue import Kueue
from .store import JSON, Store

T = TypeVar("T")


@dataclass(frozen=True)
class NodeSpec:
    """A node of the fake cluster: its name, allocatable resources, labels and taints."""

    name: str
    cores: int = 4
    memory_gb: float = 8.0
    gpus: int = 0
    ephemeral_storage_gb: float = 100.0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()
    worker: bool = True

    def manifest(self) -> JSON:
        amounts = {
            "cpu": str(self.cores),
            "memory": f"{round(self.memory_gb * 1024)}Mi",
            "ephemeral-storage": f"{round(self.ephemeral_storage_gb * 1024)}Mi",
            "pods": "110",
        }
        if self.gpus:
            amounts[kueue_objects.GPU] = str(self.gpus)
        node_labels = {
            simrun_labels.HOSTNAME: self.name,
            "kubernetes.io/os": "linux",
            **({simrun_labels.WORKER_NODE: "true"} if self.worker else {}),
            **self.labels,
        }
        spec: JSON = {}
        if self.taints:
            spec["taints"] = [dict(t) for t in self.taints]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": node_labels},
            "spec": spec,
            "status": {
                "capacity": dict(amounts),
                "allocatable": dict(amounts),
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.name},
                ],
            },
        }


def default_quota(nodes: Sequence[NodeSpec]) -> kueue_objects.Quota:
    """The nominal quota of the worker nodes together (spec 11)."""
    workers = [n for n in nodes if n.worker]
    return kueue_objects.Quota(
        cores=sum(n.cores for n in workers),
        memory_gb=sum(n.memory_gb for n in workers),
        gpus=sum(n.gpus for n in workers),
        ephemeral_storage_gb=sum(n.ephemeral_storage_gb for n in workers),
    )


class FakeCluster:
    """`with FakeCluster(tmp_path) as cluster:` serves a cluster at `cluster.url`."""

    def __init__(
        self,
        root: Path,
        *,
        nodes: Sequence[NodeSpec] = (NodeSpec("node-1"),),
        config: ClusterConfig | None = None,
        quota: kueue_objects.Quota | None = None,
        queue: bool = True,
        executor_resources: Mapping[str, Any] | None = None,
        env_overrides: Mapping[str, str] | None = None,
        memory_sample_s: float = 0.05,
        resync_s: float = 0.5,
        bookmark_interval_s: float | None = 5.0,
    ) -> None:
        self.root = Path(root)
        self.config = config or ClusterConfig()
        self.store_dir = self.root / "store"
        self.scratch_dir = self.root / "scratch"
        self.work_dir = self.root / "work"
        self.nodes = list(nodes)
        self.quota = quota or default_quota(self.nodes)
        self.queue = queue
        self.store = Store(graceful_pods=True)
        self.api = FakeKubernetes(self.store, bookmark_interval_s=bookmark_interval_s)
        self.kubelet = Kubelet(
            self.store,
            nodes=[n.name for n in self.nodes],
            claims={self.config.store_claim: self.store_dir},
            scratch=self.scratch_dir,
            work=self.work_dir,
            env_overrides=env_overrides,
            memory_sample_s=memory_sample_s,
            resync_s=resync_s,
        )
        self.kueue = Kueue(self.store, resync_s=resync_s)
        self.jobs = JobController(self.store, resync_s=resync_s)
        self.argo = ArgoController(
            self.store,
            signal_pod=self.kubelet.signal,
            executor_resources=executor_resources,
            resync_s=resync_s,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._main: asyncio.Task[None] | None = None
        self._ended = threading.Event()

    # -- life cycle

    def start(self) -> FakeCluster:
        for directory in (self.store_dir, self.scratch_dir, self.work_dir):
            directory.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            self.store.create("nodes", node.manifest())
        if self.queue:
            plurals = {kind.kind: plural for plural, kind in self.store.kinds.items()}
            for obj in kueue_objects.kueue_objects(self.quota, self.config):
                plural = plurals[obj["kind"]]
                namespace = obj["metadata"].get("namespace")
                self.store.create(plural, obj, namespace)
        self.api.start()
        loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            started.set()
            loop.run_forever()
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="fake-cluster", daemon=True)
        self._thread.start()
        started.wait()
        self._ended.clear()
        self._main = asyncio.run_coroutine_threadsafe(self._start_main(), loop).result(10)
        return self

    async def _start_main(self) -> asyncio.Task[None]:
        return asyncio.create_task(self._run())

    async def _run(self) -> None:
        tasks = [
            asyncio.create_task(r.run(), name=r.name)
            for r in (self.kubelet, self.kueue, self.argo, self.jobs)
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._ended.set()

    def stop(self) -> None:
        """Stop the emulators (killing every process group), then the API."""
        loop, main = self._loop, self._main
        if loop is not None and main is not None:
            loop.call_soon_threadsafe(main.cancel)
            self._ended.wait(15)
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(15)
        self._loop = self._main = self._thread = None
        self.api.stop()

    def __enter__(self) -> FakeCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- clients

    @property
    def url(self) -> str:
        return self.api.url

    def configuration(self) -> Any:
        return self.api.configuration()

    def write_kubeconfig(self, path: Path) -> Path:
        return self.api.write_kubeconfig(path, namespace=self.config.namespace)

    def add_node(self, node: NodeSpec) -> None:
        """Add a node (served by the kubelet) while the cluster runs."""
        self.nodes.append(node)
        self.kubelet.node_names.add(node.name)
        self.store.create("nodes", node.manifest())

    # -- tests

    @property
    def errors(self) -> list[str]:
        """What the emulators refused or failed at, in order per emulator."""
        return [*self.argo.errors, *self.kueue.errors, *self.jobs.errors, *self.kubelet.errors]

    def wait_for(
        self,
        condition: Callable[[], T | None],
        timeout_s: float = 10.0,
        what: str = "",
        *,
        check_errors: bool = True,
    ) -> T:
        """The first true value of `condition()`, checked after every change of a workflow.

        Raises TimeoutError after `timeout_s` (naming `what`), and AssertionError at once when
        an emulator failed (unless `check_errors` is False), so a broken emulator does not look
        like a slow one.
        """
        watcher = self.store.watch("workflows")
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if check_errors and self.errors:
                    raise AssertionError("the fake cluster failed:\n" + "\n".join(self.errors))
                value = condition()
                if value:
                    return value
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"waited {timeout_s} s for {what or condition}")
                watcher.get_blocking(min(remaining, 0.1))
                while watcher.get_blocking(0) is not None:
                    pass
        finally:
            watcher.close()

    def workflow(self, name: str, namespace: str | None = None) -> JSON:
        return self.store.get("workflows", name, namespace or self.config.namespace)

    def wait_workflow(
        self,
        name: str,
        phases: Sequence[str] = ("Succeeded", "Failed", "Error"),
        timeout_s: float = 15.0,
        namespace: str | None = None,
        *,
        check_errors: bool = True,
    ) -> JSON:
        """The workflow once its phase is one of `phases`."""

        def done() -> JSON | None:
            workflow = self.workflow(name, namespace)
            return workflow if (workflow.get("status") or {}).get("phase") in phases else None

        what = f"workflow {name} to be {'/'.join(phases)}"
        return self.wait_for(done, timeout_s, what, check_errors=check_errors)
