"""Fixtures of the k3d tests: the cluster (one per session) and a service per test.

Nothing here runs without SIMRUN_K3D=1: the tests of this package are skipped before their
fixtures are set up (test_k3d.py), so a default run needs neither docker, k3d nor kubectl.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .k3d_env import (
    DEFAULT_STORE,
    K3dCluster,
    Service,
    Tools,
    start_service,
    stop_service,
)


@pytest.fixture(scope="session")
def k3d_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[K3dCluster]:
    """The k3d cluster with deploy/k3d applied and the service image in its registry; deleted
    at the end unless SIMRUN_K3D_KEEP=1 (a kept cluster is reused by the next session)."""
    if os.environ.get("SIMRUN_K3D") != "1":
        pytest.skip("the k3d tests run with SIMRUN_K3D=1")
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or "1") > 1:
        pytest.fail("the k3d tests share one cluster: run them in one process (-n 0)")
    store = Path(os.environ.get("SIMRUN_K3D_STORE") or DEFAULT_STORE).resolve()
    cluster = K3dCluster(Tools.find(), store, keep=os.environ.get("SIMRUN_K3D_KEEP") == "1")
    try:
        cluster.up()
        settle(cluster, tmp_path_factory.mktemp("settle"))
        yield cluster
    finally:
        cluster.down()


def settle(cluster: K3dCluster, root: Path) -> None:
    """A kept cluster and store may hold runs of an earlier session: cancel those that have
    not ended (the owner may), delete their workflows and any reservation left on a node."""
    service = start_service(cluster, root)
    try:
        with service.client() as client:
            service.submitted = [item.id for item in client.runs() if not item.state.ended]
    finally:
        stop_service(service)  # cancels them
    cluster.delete_workflows()
    cluster.clear_reservations()


@pytest.fixture
def make_service(k3d_cluster: K3dCluster, tmp_path: Path) -> Iterator[Callable[..., Service]]:
    """Start `simrun serve` on the host against the cluster, with settings `extra` added; its
    live runs are cancelled and it is stopped at the end of the test."""
    started: list[Service] = []
    if k3d_cluster.busy():
        k3d_cluster.delete_workflows()

    def make(extra: dict[str, Any] | None = None) -> Service:
        service = start_service(k3d_cluster, tmp_path / f"service-{len(started)}", extra)
        started.append(service)
        return service

    try:
        yield make
    finally:
        for service in started:
            stop_service(service)
        k3d_cluster.clear_reservations()


@pytest.fixture
def service(make_service: Callable[..., Service]) -> Service:
    """The service of a test, with the settings of deploy/k3d."""
    return make_service()
