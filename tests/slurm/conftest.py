"""The real Slurm cluster of the Slurm tests: one per test process (xdist worker), three nodes
of two CPUs, 2,000 MB and two stand-in GPUs each, simrun's six partitions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from slurm_cluster import SlurmCluster, poll_until, start_slurm_cluster


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    cluster = start_slurm_cluster(tmp_path_factory.mktemp("slurm"))
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
