"""The backend contract against the Slurm backend on the real Slurm of the tests: each pod a batch
job whose `command` plays the script (as the local backend's processes do), run by slurmd on one
of three emulated nodes. The contract reads the backend's capabilities: Slurm's jobs outlive
the service (a restart takes the run over by the jobs' names) and nodes can be reserved (a Slurm
reservation); Slurm starts a retry only on `retry` (a failed job is not requeued by Slurm).

The cluster is this module's own, its nodes of 4,000 MB: the contract plans a pod of 1 GiB whose
retry memory is 2 GiB (`--mem=2048M`), more than the 2,000 MB of the suite's shared cluster. Its
run ids are unique within the module, since Slurm shows the ended jobs of earlier tests (and
the backend takes over a run's jobs by name) for `MinJobAge`.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from backends.contract import BackendContract, Script
from backends.test_local import PROGRAM
from slurm_cluster import SlurmCluster, start_slurm_cluster

from simrun_api.backends.slurm import SlurmBackend
from simrun_core.slurm_jobs import SlurmSettings

_RUN_IDS = itertools.count(1)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The cluster of this module (it overrides the suite's for `idle_slurm`)."""
    cluster = start_slurm_cluster(tmp_path_factory.mktemp("slurm-contract"), memory_mb=4000)
    try:
        yield cluster
    finally:
        cluster.stop()


class TestSlurmBackend(BackendContract):
    """The Slurm backend on the module's cluster, polling its queue every 0.2 s."""

    @pytest.fixture(autouse=True)
    def on_the_cluster(self, idle_slurm: SlurmCluster) -> None:
        self.cluster = idle_slurm

    def make_backend(self, store: Path) -> SlurmBackend:
        settings = SlurmSettings(
            poll_s=0.2, grace_s=5, scratch_path=str(store.parent / "scratch"), python=sys.executable
        )
        return SlurmBackend(store, settings, env=self.cluster.env)

    def args(self, script: Script) -> list[str]:
        return [sys.executable, "-c", PROGRAM.replace("EXITS", repr(list(script.exits)))]

    def run_id(self) -> str:
        return f"20260101-000000-{next(_RUN_IDS):06x}"
