"""Runs through `simrun serve` with `backend: slurm` on the real Slurm of the tests (issue 27's
and 28's end-to-end bullets): a workflow of split tasks read by a `command` gives the outputs of
local mode, a split task spreads over the nodes, a kill for memory is retried once with the retry
memory, a node set DOWN mid-run and a service killed mid-run leave the run whole, and GPUs are
asked from Slurm and checked at submission."""

from __future__ import annotations

import json
import re
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slurm_cluster import SlurmCluster, poll_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from live_service import end_service_process
from service_helpers import ConfiguredService, start_configured_service

TERMINAL = {"succeeded", "failed", "cancelled"}


def serve(root: Path) -> ConfiguredService:
    """`simrun serve` of `root` (its settings, store and database there) with `backend: slurm`."""
    return start_configured_service(
        root,
        backend="slurm",
        slurm={"poll_s": 0.5, "grace_s": 5, "scratch_path": str(root / "scratch")},
        poll_s=0.5,
    )


@pytest.fixture
def service_root(idle_slurm: SlurmCluster, tmp_path: Path, monkeypatch) -> Path:
    """The directory of a service of the tests' Slurm (its client finds it by SLURM_CONF)."""
    monkeypatch.setenv("SLURM_CONF", str(idle_slurm.conf))
    root = tmp_path / "service"  # beside the local service of `tmp_path` in a test of both
    root.mkdir()
    return root


@pytest.fixture
def slurm_service(service_root: Path) -> Iterator[ConfiguredService]:
    service = serve(service_root)
    try:
        yield service
    finally:
        end_service_process(service.process, 30)


def squares(task_id: str, n: int, sleep_s: float, **extra: Any) -> dict[str, Any]:
    return {
        "id": task_id,
        "type": "demo.squares",
        "settings": {"n": n, "sleep_s": sleep_s},
        **extra,
    }


def workflow(name: str, *tasks: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "tasks": list(tasks)}


def sum_of_squares(n: int) -> int:
    return sum(i * i for i in range(n))


def summary(service: Any, run_id: str, task: str) -> dict[str, Any]:
    path = service.run_dir(run_id) / "tasks" / task / "out" / "summary.json"
    return json.loads(path.read_text())


def succeeded(service: Any, run_id: str, timeout: float = 90) -> dict[str, Any]:
    record = service.wait(run_id, timeout=timeout)
    assert record["state"] == "succeeded", json.dumps(record)[-3000:]
    return record


def slurm_jobs(cluster: SlurmCluster, run_id: str) -> list[dict[str, str]]:
    """Slurm's records of the run's jobs (`scontrol show job`, ended ones kept `MinJobAge`)."""
    out = cluster.run("scontrol", "show", "job", "--oneliner", check=False).stdout
    jobs = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in out.splitlines() if line.strip()]
    return [job for job in jobs if job.get("JobName", "").startswith(f"simrun-{run_id}-")]


def live_jobs(cluster: SlurmCluster, run_id: str) -> list[dict[str, str]]:
    """The run's jobs that have not ended (waiting, requeued, running or ending)."""
    ended = {"COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY", "NODE_FAIL", "TIMEOUT"}
    return [job for job in slurm_jobs(cluster, run_id) if job["JobState"] not in ended]


def check_log_whole(events: list[dict[str, Any]]) -> None:
    """The run's log: seq 1, 2, 3 ... without a gap or a repeat, one terminal event, the last,
    and no pod attempt started twice."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    ends = [e["type"] for e in events if e["type"] in TERMINAL]
    assert ends == [events[-1]["type"]], ends
    started = Counter(
        (e["task"], e["worker"], e.get("attempt", 0)) for e in events if e["type"] == "pod-started"
    )
    assert all(count == 1 for count in started.values()), started


# -- a workflow of two split tasks read by a command: the outputs of local mode -----------------

TOTAL = (
    "import json, pathlib, sys\n"
    "out, totals = pathlib.Path(sys.argv[1]), dict()\n"
    "for pair in sys.argv[2:]:\n"
    "    port, path = pair.split('=', 1)\n"
    "    files = pathlib.Path(path).glob('*.json')\n"
    "    totals[port] = sum(json.loads(f.read_text())['square'] for f in files)\n"
    "(out / 'total.json').write_text(json.dumps(totals, sort_keys=True))\n"
)


def two_squares_and_a_total() -> dict[str, Any]:
    total = {
        "id": "total",
        "type": "command",
        "inputs": {"a": "a.squares", "b": "b.squares"},
        "settings": {
            "image": "none",
            "args": [sys.executable, "-c", TOTAL, "{out}", "{input}"],
            "cores": 1,
            "memory_gb": 0.5,
        },
    }
    return workflow("totals", squares("a", 14, 0.05), squares("b", 22, 0.05), total)


def outputs(service: Any, run_id: str) -> dict[str, str]:
    tasks = service.run_dir(run_id) / "tasks"
    return {
        "a": (tasks / "a" / "out" / "summary.json").read_text(),
        "b": (tasks / "b" / "out" / "summary.json").read_text(),
        "total": (tasks / "total" / "out" / "total.json").read_text(),
    }


def test_split_tasks_read_by_a_command_give_the_outputs_of_local_mode(
    slurm_service, idle_slurm, local_service
):
    on_slurm = slurm_service.submit("mk", two_squares_and_a_total())["id"]
    local = local_service.submit(two_squares_and_a_total())["id"]
    succeeded(slurm_service, on_slurm)
    succeeded(local_service, local)
    assert outputs(slurm_service, on_slurm) == outputs(local_service, local)
    assert json.loads(outputs(slurm_service, on_slurm)["total"]) == {
        "a": sum_of_squares(14),
        "b": sum_of_squares(22),
    }
    names = {job["JobName"] for job in slurm_jobs(idle_slurm, on_slurm)}
    assert f"simrun-{on_slurm}-total-total" in names, names


# -- a split task on three idle nodes ----------------------------------------------------------


def test_a_split_task_runs_on_several_nodes_with_the_results_of_one_worker(
    slurm_service, idle_slurm
):
    n = 60  # 30 s of units: 0.5 s each
    run_id = slurm_service.submit("mk", workflow("spread", squares("squares", n, 0.5)))["id"]
    succeeded(slurm_service, run_id)
    plans = slurm_service.events(run_id)[0]["plans"]
    assert plans["squares"]["pods"] == 3, plans
    nodes = {job["NodeList"] for job in slurm_jobs(idle_slurm, run_id)}
    assert len(nodes) >= 2, nodes
    started = {e["node"] for e in slurm_service.events(run_id) if e["type"] == "pod-started"}
    assert started == nodes, (started, nodes)
    out = slurm_service.run_dir(run_id) / "tasks" / "squares" / "out"
    squares_written = {
        json.loads(path.read_text())["index"]: json.loads(path.read_text())["square"]
        for path in (out / "squares").glob("*.json")
    }
    assert squares_written == {index: index * index for index in range(n)}
    assert summary(slurm_service, run_id, "squares") == {"n": n, "sum": sum_of_squares(n)}


# -- kills for memory --------------------------------------------------------------------------


def hungry(memory_mb: int) -> dict[str, Any]:
    """One pod of one process of 0.6 GiB: `--mem` 1 GiB (0.125 + 0.6, whole GiB), the retry
    memory 0.9 GiB per process and 2 GiB the pod (0.125 + 0.9); each of its two units takes
    `memory_mb` MiB for a second."""
    task = squares("hungry", 2, 1.0, resources={"workers": 1, "memory_per_worker_gb": 0.6})
    task["settings"]["memory_mb"] = memory_mb
    return workflow("hungry", task)


def memory_of_jobs(cluster: SlurmCluster, run_id: str) -> list[str]:
    """The memory each job of the run asked Slurm for (`--mem`), in submission order."""
    jobs = sorted(slurm_jobs(cluster, run_id), key=lambda job: int(job["JobId"]))
    return [job["MinMemoryNode"] for job in jobs]


def test_a_job_killed_for_memory_is_retried_once_with_the_retry_memory(slurm_service, idle_slurm):
    # 750 MiB: above 0.6 GiB (614 MiB), below the retry memory of 0.9 GiB (922 MiB)
    run_id = slurm_service.submit("mk", hungry(750), split="single-server")["id"]
    succeeded(slurm_service, run_id)
    events = slurm_service.events(run_id)
    assert [e["type"] for e in events].count("oom-killed") == 1, [e["type"] for e in events]
    failed = [e for e in events if e["type"] == "pod-failed"]
    assert len(failed) == 1 and failed[0]["exit_code"] == 137, failed
    assert memory_of_jobs(idle_slurm, run_id) == ["1G", "2G"]
    assert summary(slurm_service, run_id, "hungry") == {"n": 2, "sum": 1}
    check_log_whole(events)


def test_a_second_kill_for_memory_fails_the_run_naming_the_retry_memory(slurm_service, idle_slurm):
    run_id = slurm_service.submit("mk", hungry(1000), split="single-server")["id"]
    record = slurm_service.wait(run_id, timeout=90)
    assert record["state"] == "failed", json.dumps(record)[-3000:]
    events = slurm_service.events(run_id)
    assert [e["type"] for e in events].count("oom-killed") == 2, [e["type"] for e in events]
    assert (
        "killed for memory again with the retry memory of 0.9 GiB per process"
        in (events[-1]["message"])
    ), events[-1]
    assert memory_of_jobs(idle_slurm, run_id) == ["1G", "2G"]
    check_log_whole(events)


def greedy_command(memory_mb: int) -> dict[str, Any]:
    """A `command` of 1 GiB (its retry memory 1.5 GiB, `--mem` 2G) that holds `memory_mb` MiB
    for three seconds: no harness watches it, Slurm's own memory enforcement kills it."""
    hold = f"import time; ballast = bytearray({memory_mb} * 2**20); time.sleep(3); print('held')"
    settings = {"image": "none", "args": [sys.executable, "-c", hold], "cores": 1, "memory_gb": 1}
    return workflow("greedy", {"id": "greedy", "type": "command", "settings": settings})


@pytest.mark.parametrize("memory_mb", [1300, 2300])
def test_a_command_killed_by_slurm_for_memory_is_retried_once_with_the_retry_memory(
    slurm_service, idle_slurm, memory_mb
):
    run_id = slurm_service.submit("mk", greedy_command(memory_mb))["id"]
    record = slurm_service.wait(run_id, timeout=90)
    events = slurm_service.events(run_id)
    kinds = [e["type"] for e in events]
    assert memory_of_jobs(idle_slurm, run_id) == ["1G", "2G"]
    if memory_mb < 2048:  # above 1 GiB, below the retry memory of 2 GiB
        assert record["state"] == "succeeded", json.dumps(record)[-3000:]
        assert kinds.count("oom-killed") == 1, kinds
    else:
        assert record["state"] == "failed", json.dumps(record)[-3000:]
        assert kinds.count("oom-killed") == 2, kinds
        assert "killed for memory again with the retry memory of 1.5 GiB" in events[-1]["message"]
    check_log_whole(events)


# -- a node set DOWN mid-run -------------------------------------------------------------------


def running_node(cluster: SlurmCluster, run_id: str, worker: str) -> str:
    """The node the job of the run's worker runs on, "" while none runs."""
    for job in slurm_jobs(cluster, run_id):
        if job["JobName"].endswith(f"-{worker}") and job["JobState"] == "RUNNING":
            return job["NodeList"]
    return ""


def units_done(service: Any, run_id: str) -> int:
    """The units the run's log says are done."""
    return sum(len(e["indices"]) for e in service.events(run_id) if e["type"] == "units-done")


@pytest.mark.parametrize("worker", ["w0", "w2"])
def test_a_node_set_down_mid_run_leaves_the_run_whole(slurm_service, idle_slurm, worker):
    n = 48
    run_id = slurm_service.submit("mk", workflow("down", squares("squares", n, 0.5)))["id"]
    node = poll_until(
        lambda: running_node(idle_slurm, run_id, worker), what=f"{worker} to run", timeout=60
    )
    poll_until(lambda: units_done(slurm_service, run_id) >= 4, what="units done", timeout=60)
    try:
        idle_slurm.run("scontrol", "update", f"nodename={node}", "state=down", "reason=test")
        succeeded(slurm_service, run_id)
    finally:
        idle_slurm.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    assert summary(slurm_service, run_id, "squares") == {"n": n, "sum": sum_of_squares(n)}
    events = slurm_service.events(run_id)
    check_log_whole(events)
    lost = [e for e in events if e["type"] == "pod-preempted" and e["worker"] == worker]
    assert lost, [e["type"] for e in events]
    poll_until(lambda: not live_jobs(idle_slurm, run_id), what="the run's jobs to end", timeout=30)


# -- the service killed mid-run ----------------------------------------------------------------


def attempts_submitted(cluster: SlurmCluster, run_id: str) -> Counter[tuple[str, int]]:
    """How many of the run's jobs Slurm records for each (job name, attempt): a job covers the
    attempt of its comment (`simrun:<attempt>`) and one more for each requeue."""
    covered: Counter[tuple[str, int]] = Counter()
    for job in slurm_jobs(cluster, run_id):
        first = int(job["Comment"].removeprefix("simrun:"))
        for attempt in range(first, first + int(job["Restarts"]) + 1):
            covered[(job["JobName"], attempt)] += 1
    return covered


def jobs_of_task_ended(cluster: SlurmCluster, run_id: str, task: str) -> bool:
    """Whether Slurm ended every job of the run's task (and has some)."""
    prefix = f"simrun-{run_id}-{task}-"
    jobs = [job for job in slurm_jobs(cluster, run_id) if job["JobName"].startswith(prefix)]
    return bool(jobs) and all(job["JobState"] == "COMPLETED" for job in jobs)


@pytest.mark.parametrize("a_ends_while_down", [False, True])
def test_a_service_killed_mid_run_and_started_again_takes_the_run_over(
    service_root, idle_slurm, a_ends_while_down
):
    """SIGKILL while the first task runs; started again at once, or once Slurm ended that
    task's jobs (so what they did while no service ran is read from Slurm and the store)."""
    chain = workflow(
        "chain",
        squares("a", 24, 0.5),
        squares("b", 12, 0.2, inputs={"after": "a.squares"}),
    )
    service = serve(service_root)
    try:
        run_id = service.submit("mk", chain)["id"]
        poll_until(lambda: running_node(idle_slurm, run_id, "w0"), what="a's coordinator to run")
        poll_until(lambda: units_done(service, run_id) >= 2, what="units of a done", timeout=60)
        service.process.send_signal(signal.SIGKILL)
        service.process.wait(30)
        for client in service.clients.values():
            client.close()
        if a_ends_while_down:
            poll_until(lambda: jobs_of_task_ended(idle_slurm, run_id, "a"), what="a's jobs to end")
        service = serve(service_root)
        succeeded(service, run_id)
    finally:
        end_service_process(service.process, 30)
    assert summary(service, run_id, "a") == {"n": 24, "sum": sum_of_squares(24)}
    assert summary(service, run_id, "b") == {"n": 12, "sum": sum_of_squares(12)}
    submitted = attempts_submitted(idle_slurm, run_id)
    assert submitted and all(count == 1 for count in submitted.values()), submitted
    assert {name.rsplit("-", 2)[-2] for name, _ in submitted} == {"a", "b"}, submitted
    events = service.events(run_id)
    check_log_whole(events)
    for task, n in [("a", 24), ("b", 12)]:
        done = [
            i
            for e in events
            if e["type"] == "units-done" and e["task"] == task
            for i in e["indices"]
        ]
        assert sorted(done) == list(range(n)), (task, sorted(done))
    poll_until(lambda: not live_jobs(idle_slurm, run_id), what="the run's jobs to end", timeout=30)


# -- GPUs --------------------------------------------------------------------------------------

SHOW_GPUS = (
    "import os; print('CUDA_VISIBLE_DEVICES=' + os.environ.get('CUDA_VISIBLE_DEVICES', '-'))"
)


def gpu_task(gpus: int) -> dict[str, Any]:
    settings = {
        "image": "none",
        "args": [sys.executable, "-c", SHOW_GPUS],
        "cores": 1,
        "memory_gb": 0.5,
        "gpus": gpus,
    }
    return workflow("gpus", {"id": "show", "type": "command", "settings": settings})


def test_a_gpu_task_runs_with_its_gres_and_sees_one_gpu(slurm_service, idle_slurm):
    run_id = slurm_service.submit("mk", gpu_task(1))["id"]
    succeeded(slurm_service, run_id)
    (job,) = slurm_jobs(idle_slurm, run_id)
    assert "gpu:1" in job.get("TresPerNode", ""), job
    logs = slurm_service.run_dir(run_id) / "tasks" / "show" / "logs"
    seen = re.findall(r"CUDA_VISIBLE_DEVICES=(\S*)", (logs / "show-0.log").read_text())
    assert seen in (["0"], ["1"]), seen


def test_a_task_asking_more_gpus_than_a_node_has_is_refused(slurm_service, idle_slurm):
    response = slurm_service.clients["mk"].post("/runs", json={"workflow": gpu_task(3)})
    assert response.status_code == 422, response.text
    assert response.json()["errors"] == [
        "task 'show': settings.gpus: a pod of 3 GPUs fits on no node: the most a node has is 2 GPUs"
    ]
    assert not (slurm_service.store / "runs").exists() or not any(
        (slurm_service.store / "runs").iterdir()
    )


# -- a job whose comment the site replaced -----------------------------------------------------


def sleeper(seconds: float) -> dict[str, Any]:
    settings = {
        "image": "none",
        "args": [sys.executable, "-c", f"import time; time.sleep({seconds})"],
        "cores": 1,
        "memory_gb": 0.5,
    }
    return workflow("sleeper", {"id": "nap", "type": "command", "settings": settings})


def test_a_job_whose_comment_was_replaced_is_still_followed_and_shown(slurm_service, idle_slurm):
    """An admin (or a site's job_submit plugin) replaces the comment simrun sets (`simrun:<n>`):
    the service still follows the job it submitted, and `GET /servers` shows it as its pod
    (it showed `nap-None`, and the run never saw it run or end)."""
    run_id = slurm_service.submit("mk", sleeper(8))["id"]
    [job] = poll_until(lambda: slurm_jobs(idle_slurm, run_id), what="the run's job")
    idle_slurm.run("scontrol", "update", f"jobid={job['JobId']}", "comment=lab-budget-7")
    assert slurm_jobs(idle_slurm, run_id)[0]["Comment"] == "lab-budget-7"

    def shown() -> list[dict[str, Any]]:
        servers = slurm_service.clients["mk"].get("/servers").json()
        return [pod for server in servers for pod in server["pods"] if pod["run_id"] == run_id]

    assert poll_until(shown, what="the job on a node in /servers") == [
        {
            "run_id": run_id,
            "task_id": "nap",
            "pod": "nap-0",
            "phase": "running",
            "cores": 1,
            "memory_gb": 1,  # the plan's: the command's 0.5 GiB in whole GiB
            "gpus": 0,
        }
    ]
    succeeded(slurm_service, run_id)
