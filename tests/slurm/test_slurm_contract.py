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
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from backends.contract import BackendContract, Reports, Script, Task
from backends.test_local import PROGRAM
from slurm_cluster import SlurmCluster, start_slurm_cluster

from simrun_api.backends.slurm import SlurmBackend
from simrun_core import exits
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

    refusing: Path | None = None
    """A directory whose `sbatch` refuses some jobs (`refuse_jobs_marked`), first on PATH."""

    def make_backend(self, store: Path) -> SlurmBackend:
        settings = SlurmSettings(
            poll_s=0.2, grace_s=5, scratch_path=str(store.parent / "scratch"), python=sys.executable
        )
        env = dict(self.cluster.env)
        if self.refusing is not None:
            env["PATH"] = f"{self.refusing}:{env['PATH']}"
        return SlurmBackend(store, settings, env=env)

    def refuse_jobs_marked(self, tmp_path: Path, *markers: str) -> None:
        """From now on, the backend's `sbatch` refuses a batch script holding every marker
        (as Slurm refuses a job it cannot take) and hands the others to Slurm's."""
        self.refusing = tmp_path / "bin"
        self.refusing.mkdir()
        sbatch = shutil.which("sbatch", path=self.cluster.env["PATH"])
        checks = " && ".join(f'grep -qF -- {marker!r} <<<"$script"' for marker in markers)
        wrapper = self.refusing / "sbatch"
        wrapper.write_text(
            "#!/bin/bash\n"
            "script=$(cat)\n"
            f"if {checks}; then\n"
            "  echo 'sbatch: error: Batch job submission failed: refused by the test' >&2\n"
            "  exit 1\n"
            "fi\n"
            f'exec {sbatch} "$@" <<<"$script"\n'
        )
        wrapper.chmod(0o755)

    def test_an_sbatch_refused_after_the_submission_fails_that_attempt(
        self, tmp_path: Path
    ) -> None:
        """A job Slurm refuses for a task started later, or for a retry, is reported as that
        attempt failed with a configuration error naming sbatch's answer (the decider fails
        its task); nothing hangs waiting for it."""
        later, retried = Script((0, 0)), Script((5, 0))
        self.refuse_jobs_marked(tmp_path, repr(list(later.exits)))

        async def scenario(backend: SlurmBackend) -> None:
            run_id = self.run_id()
            reports = Reports()
            tasks = (Task("a"), Task("b", later, after="a"), Task("t", retried))
            await backend.submit(self.submission(run_id, *tasks), reports)
            await self.started_after(backend, run_id, reports, "b", "a")
            refused = await reports.ended("b", 0)
            assert (refused.phase, refused.exit_code) == ("failed", exits.CONFIGURATION)
            assert refused.message is not None and "refused by the test" in refused.message
            assert [c.phase for c in reports.of("b")] == ["failed"], "no job of b ran"
            assert (await reports.ended("t", 0)).exit_code == 5
            assert self.refusing is not None
            (self.refusing / "sbatch").write_text(
                (self.refusing / "sbatch").read_text().replace(repr(list(later.exits)), "simrun:1")
            )
            await backend.retry(run_id, "t", "t", 1, False)
            again = await reports.ended("t", 1)
            assert (again.phase, again.exit_code) == ("failed", exits.CONFIGURATION)
            assert again.message is not None and "refused by the test" in again.message
            await backend.cancel(run_id)

        self.play(tmp_path, scenario)  # type: ignore[arg-type]

    def args(self, script: Script) -> list[str]:
        return [sys.executable, "-c", PROGRAM.replace("EXITS", repr(list(script.exits)))]

    def run_id(self) -> str:
        return f"20260101-000000-{next(_RUN_IDS):06x}"
