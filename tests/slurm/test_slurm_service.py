"""simrun serve with `backend: slurm` on the real Slurm of the tests: a run's pods are Slurm
batch jobs named after the run, in the partitions of its class, run under slurmstepd."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from slurm_cluster import SlurmCluster, poll_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from live_service import end_service_process
from service_helpers import start_configured_service

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def serve_on_slurm(idle_slurm: SlurmCluster, tmp_path: Path, monkeypatch, squeue_poll_s: float):
    """A service on the test Slurm whose `squeue` comes every `squeue_poll_s`, ended after."""
    monkeypatch.setenv("SLURM_CONF", str(idle_slurm.conf))
    service = start_configured_service(
        tmp_path,
        backend="slurm",
        slurm={"poll_s": squeue_poll_s, "grace_s": 5, "scratch_path": str(tmp_path / "scratch")},
        poll_s=0.5,
    )
    try:
        yield service
    finally:
        end_service_process(service.process, 30)


@pytest.fixture
def slurm_service(idle_slurm: SlurmCluster, tmp_path, monkeypatch):
    yield from serve_on_slurm(idle_slurm, tmp_path, monkeypatch, squeue_poll_s=0.5)


def squares(n: int, sleep_s: float) -> dict:
    workflow = yaml.safe_load((EXAMPLES / "squares.yaml").read_text())
    workflow["tasks"][0]["settings"] = {"n": n, "sleep_s": sleep_s}
    return workflow


def harness_parents(run_id: str) -> set[str]:
    """The commands of the parents of the harness processes of a run (by the run id of their
    launch; other tests' local services run harness processes of their own), leaving out the
    processes of a harness's pool, which are forks of it."""
    harness: dict[str, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if b"simrun_harness.worker" not in cmdline:
                continue
            if f"SIMRUN_RUN={run_id}".encode() not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            harness[proc.name] = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
    parents = set()
    for ppid in harness.values():
        if ppid not in harness:
            try:
                parents.add(Path(f"/proc/{ppid}/comm").read_text().strip())
            except OSError:
                continue
    return parents


def test_squares_runs_as_slurm_jobs_named_after_the_run(slurm_service, idle_slurm):
    run = slurm_service.submit("mk", squares(60, 0.05))
    run_id = run["id"]
    seen = poll_until(
        lambda: [job for job in idle_slurm.queue() if run_id in job["name"]],
        what="the run's jobs in Slurm's queue",
        timeout=60,
    )
    assert all(job["partition"].startswith("simrun-owner-") for job in seen), seen
    parents = poll_until(lambda: harness_parents(run_id), what="a harness process", timeout=60)
    assert parents <= {"slurmstepd"}, parents
    record = slurm_service.wait(run_id, timeout=120)
    assert record["state"] == "succeeded", json.dumps(record)[-3000:]
    summary = slurm_service.run_dir(run_id) / "tasks/squares/out/summary.json"
    assert summary.read_text() == f'{{"n": 60, "sum": {sum(i * i for i in range(60))}}}'
    records = poll_until(
        lambda: [line for line in idle_slurm.jobcomp.read_text().splitlines() if run_id in line],
        what="the run's job completion records",
    )
    assert all("Partition=simrun-owner-" in line for line in records), records
    assert any(f"Name=simrun-{run_id}-squares-w0 " in line for line in records), records
    logs = slurm_service.run_dir(run_id) / "tasks/squares/logs"
    assert (logs / "w0-0.log").exists(), list(logs.iterdir())


def test_an_owners_run_takes_back_the_nodes_of_an_agents_extra_workers(slurm_service, idle_slurm):
    agent = slurm_service.submit("ann-bot", squares(120, 0.25))["id"]  # an agent of another person

    def agent_extras_running() -> bool:
        jobs = [j for j in idle_slurm.queue() if agent in j["name"] and j["state"] == "RUNNING"]
        return sum(j["partition"] == "simrun-agent-extra" for j in jobs) >= 2

    poll_until(agent_extras_running, what="the agent's extra workers to run", timeout=60)
    owner = slurm_service.submit("mk", squares(30, 0.05))["id"]
    for run_id, n in [(owner, 30), (agent, 120)]:
        record = slurm_service.wait(run_id, timeout=150)
        assert record["state"] == "succeeded", json.dumps(record)[-3000:]
        summary = slurm_service.run_dir(run_id) / "tasks/squares/out/summary.json"
        assert summary.read_text() == f'{{"n": {n}, "sum": {sum(i * i for i in range(n))}}}'
    preempted = [e for e in slurm_service.events(agent) if e["type"] == "pod-preempted"]
    assert preempted, "no pod-preempted in the agent's log"
    assert not [e for e in slurm_service.events(owner) if e["type"] == "pod-preempted"]
    started = [
        (e["worker"], e.get("attempt", 0))
        for e in slurm_service.events(agent)
        if e["type"] == "pod-started"
    ]
    assert len(started) == len(set(started)), f"an attempt started twice: {started}"


@pytest.fixture
def slow_polling_service(idle_slurm: SlurmCluster, tmp_path, monkeypatch):
    """A service whose one `squeue` comes every 120 s: what it learns sooner, it learns from
    the harness logs' hints."""
    yield from serve_on_slurm(idle_slurm, tmp_path, monkeypatch, squeue_poll_s=120)


def test_a_run_learns_its_jobs_starts_and_ends_without_waiting_for_the_poll(
    slow_polling_service, idle_slurm
):
    """Two tasks, b reading a, end well within one `poll_s` of 120 s: a job's harness log and
    its coordinator's merge make the poller look at once. Then, 30 units of 0.2 s learned,
    the planner keeps a pod on each of the three nodes: Slurm's pod start is `slurm.pod_start_s`
    (1 s), not Kubernetes' 10 s (which would make 6 s of work one job)."""
    workflow = {
        "name": "chain",
        "tasks": [
            {"id": "a", "type": "demo.squares", "settings": {"n": 30, "sleep_s": 0.2}},
            {
                "id": "b",
                "type": "demo.squares",
                "settings": {"n": 4, "sleep_s": 0.05},
                "inputs": {"after": "a.squares"},
            },
        ],
    }
    run_id = slow_polling_service.submit("mk", workflow)["id"]
    record = slow_polling_service.wait(run_id, timeout=80)
    assert record["state"] == "succeeded", json.dumps(record)[-3000:]
    for task, n in (("a", 30), ("b", 4)):
        summary = slow_polling_service.run_dir(run_id) / f"tasks/{task}/out/summary.json"
        assert json.loads(summary.read_text()) == {"n": n, "sum": sum(i * i for i in range(n))}
    estimate = slow_polling_service.clients["mk"].post("/estimate", json={"workflow": workflow})
    assert estimate.status_code == 200, estimate.text
    learned = estimate.json()["a"]
    assert learned["resources"]["seconds_per_unit"] >= 0.2, learned
    assert (learned["plan"]["pods"], learned["plan"]["shape"]["cores"]) == (3, 2), learned
