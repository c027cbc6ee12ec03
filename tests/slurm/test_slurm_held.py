"""A job whose launch fails on the real Slurm of the tests: a node's `Prolog` fails once for an
extra worker's job, slurmd asks the controller to requeue it held ("launch failed requeued
held", the node drained "Prolog error"), and the job would never run. Through `simrun serve`:
the held attempt ends failed naming Slurm's reason and is retried as a new job of the next
attempt, the held job is cancelled, and the run succeeds with the right sum.

The cluster is this module's own (its nodes run the failing prolog and one is drained)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, poll_until, start_slurm_cluster
from test_slurm_runs import (
    live_jobs,
    serve,
    slurm_jobs,
    squares,
    succeeded,
    sum_of_squares,
    summary,
    workflow,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from live_service import end_service_process

FAILING_PROLOG = """#!/bin/sh
# Fails the launch of the first job of an extra partition that starts after MARKER appears.
case "$SLURM_JOB_PARTITION" in
  *-extra) if rm MARKER 2>/dev/null; then echo "prolog fails job $SLURM_JOB_ID" >&2; exit 1; fi;;
esac
exit 0
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """The cluster of this module (it overrides the suite's for `idle_slurm`): its prolog fails
    the launch of one extra worker's job once `fail-once` exists in its directory."""
    root = tmp_path_factory.mktemp("slurm-held")
    prolog = root / "prolog.sh"
    prolog.write_text(FAILING_PROLOG.replace("MARKER", str(root / "fail-once")))
    prolog.chmod(0o755)
    cluster = start_slurm_cluster(root, memory_mb=4096, extra_conf=(f"Prolog={prolog}",))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def launch_fails_once(idle_slurm: SlurmCluster) -> Iterator[Path]:
    """The next extra worker's launch fails; the drained node is resumed after the test."""
    marker = idle_slurm.root / "fail-once"
    marker.write_text("")
    try:
        yield marker
    finally:
        marker.unlink(missing_ok=True)
        for node in idle_slurm.nodes:
            idle_slurm.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)


def test_a_job_held_after_its_launch_failed_is_retried_as_a_new_job(
    idle_slurm, launch_fails_once, tmp_path, monkeypatch
):
    monkeypatch.setenv("SLURM_CONF", str(idle_slurm.conf))
    service = serve(tmp_path)
    try:
        n = 40  # 20 s of units: 0.5 s each, three jobs planned
        run_id = service.submit("mk", workflow("held", squares("squares", n, 0.5)))["id"]
        poll_until(lambda: not launch_fails_once.exists(), what="an extra worker's launch")
        succeeded(service, run_id, timeout=150)
        assert summary(service, run_id, "squares") == {"n": n, "sum": sum_of_squares(n)}
        events = service.events(run_id)
        failed = [e for e in events if e["type"] == "pod-failed"]
        named = [e for e in failed if "launch failed requeued held" in e["message"]]
        assert len(named) == 1, f"no attempt failed naming Slurm's hold: {failed}"
        [held] = named
        assert held["retry"] and held["exit_code"] == 143, held
        pod = (held["worker"], held.get("attempt", 0))
        # Whether the held attempt was logged started depends on the poll: Slurm shows the job
        # RUNNING while its prolog runs (and fails), and a poll then reports it running.
        # The run's jobs end after its success, not with it (one still waiting is cancelled
        # then); a held job nobody cancels would wait for ever.
        poll_until(
            lambda: not live_jobs(idle_slurm, run_id), what="the run's jobs to end", timeout=30
        )
        jobs = slurm_jobs(idle_slurm, run_id)
        worker = [j for j in jobs if j["JobName"].endswith(f"-{held['worker']}")]
        by_attempt = {job["Comment"]: job for job in worker}
        first, retry = f"simrun:{pod[1]}", f"simrun:{pod[1] + 1}"
        assert set(by_attempt) == {first, retry}, worker  # the retry: a new job
        assert by_attempt[first]["JobState"] == "CANCELLED", by_attempt[first]
    finally:
        end_service_process(service.process, 30)
