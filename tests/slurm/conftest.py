"""The real Slurm cluster of the Slurm tests: one per test process (xdist worker), three nodes
of two CPUs, 4,096 MB (claimed, `config_overrides`: a pod's retry memory of 2 GiB fits) and two
stand-in GPUs each, simrun's six partitions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_cluster import SlurmCluster, poll_until, start_slurm_cluster

MEMORY_MB = 4096
"""The memory of a node of the tests' cluster."""


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = start_slurm_cluster(tmp_path_factory.mktemp("slurm"), memory_mb=MEMORY_MB)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def idle_slurm(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    """The cluster with no job in its queue before and after the test."""
    slurm.run("scancel", "--full", f"--user={slurm_user()}", check=False)
    wait_empty(slurm)
    yield slurm
    slurm.run("scancel", "--full", f"--user={slurm_user()}", check=False)
    wait_empty(slurm)


def slurm_user() -> str:
    import getpass

    return getpass.getuser()


def wait_empty(cluster: SlurmCluster, timeout: float = 60.0) -> None:
    poll_until(lambda: not cluster.queue(), timeout=timeout, what="Slurm's queue to empty")
    cluster.wait_idle()
