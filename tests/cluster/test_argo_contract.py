"""The backend contract against the Argo backend on the fake cluster: the run's Workflow run by
the emulated Argo, Kueue and kubelet, each pod a local process of a `command` task whose argv
plays the script (as the local backend's). The contract reads the backend's capabilities:
Argo retries its pods by its `retryStrategy` (not on `retry`), Kueue admits them (`admitted`)
and they outlive the service (a restart takes the run over)."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from backends.contract import BackendContract, Script
from backends.test_local import PROGRAM
from fake.cluster import FakeCluster, NodeSpec

from simrun_api.backends.argo import ArgoBackend
from simrun_api.backends.base import Backend
from simrun_core.argo import labels

NODES = [NodeSpec("node-1", cores=4, memory_gb=16.0), NodeSpec("node-2", cores=4, memory_gb=16.0)]


class TestArgoBackend(BackendContract):
    """The Argo backend on a fake cluster of two nodes, started per test."""

    cluster: FakeCluster

    def play(self, tmp_path: Path, scenario: Callable[[Backend], Awaitable[None]]) -> None:
        with FakeCluster(tmp_path, nodes=NODES) as self.cluster:
            super().play(tmp_path, scenario)
            assert self.cluster.errors == []

    def make_backend(self, store: Path) -> ArgoBackend:
        assert store == self.cluster.store_dir
        return ArgoBackend(
            self.cluster.config,
            configuration=self.cluster.configuration(),
            default_image="simrun:test",
            settle_s=1.0,
        )

    def args(self, script: Script) -> list[str]:
        return [sys.executable, "-c", PROGRAM.replace("EXITS", repr(list(script.exits)))]

    async def workflows_of(self, backend: Backend, run_id: str) -> int | None:
        namespace = self.cluster.config.namespace
        listed, _ = self.cluster.store.list("workflows", namespace, {labels.RUN: run_id})
        return len(listed)
