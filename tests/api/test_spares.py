"""Spare harness processes of the local backend: the tasks of a run, its first included, start
from processes the service keeps warm, which behave as a harness started anew (results,
environment, the run in /proc/<pid>/environ, log, report, a stop), and which no run or service
leaves behind."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from live_service import run_processes, start_service, stop_service, wait_until

from simrun_core.spare_order import UNCLAIMED_RUN


def chain(*settings: dict) -> dict:
    """Squares tasks of these settings, each waiting for the one before (its port `after`)."""
    chain = []
    for number, task_settings in enumerate(settings, start=1):
        task: dict = {"id": f"t{number}", "type": "demo.squares", "settings": task_settings}
        if number > 1:
            task["inputs"] = {"after": f"t{number - 1}.squares"}
        chain.append(task)
    return {"name": "chain", "tasks": chain}


QUICK = {"n": 1}
LONG = {"n": 40, "sleep_s": 1}  # units that end within the grace of a stop


def cmdline(pid: int) -> list[str]:
    return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")


def spares_of(run_id: str) -> list[int]:
    """The processes of the run still waiting as spares: a spare's stdout is /dev/null until it
    takes up a task (then its log)."""
    return [
        pid
        for pid in run_processes(run_id)
        if "simrun_harness.spare" in cmdline(pid) and os.readlink(f"/proc/{pid}/fd/1") == os.devnull
    ]


def warm_spares(service_pid: int) -> list[int]:
    """The spares a service keeps for any run: its children with the placeholder of a run."""
    marker = f"SIMRUN_RUN={UNCLAIMED_RUN}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[1]) == service_pid and marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def pod_started(events: list[dict], task: str) -> dict | None:
    return next((e for e in events if e["type"] == "pod-started" and e["task"] == task), None)


def test_the_later_tasks_of_a_chain_start_from_spares_and_compute_the_same(tmp_path: Path) -> None:
    service = start_service(tmp_path)
    try:
        # t1 and t2 live a few seconds: their processes are read in /proc once their start is
        # logged, which a loaded machine may show long after the spawn.
        held, quick = {"n": 3, "sleep_s": 1.0}, {"n": 3, "sleep_s": 0.2}
        run = service.submit(chain(held, held, quick))["id"]
        first = wait_until(lambda: pod_started(service.events(run), "t1"), what="t1 started")
        assert "simrun_harness.spare" in cmdline(first["pid"])  # the first task too
        started = wait_until(lambda: pod_started(service.events(run), "t2"), what="t2 started")
        assert "simrun_harness.spare" in cmdline(started["pid"])
        environ = (Path("/proc") / str(started["pid"]) / "environ").read_bytes().split(b"\0")
        assert f"SIMRUN_RUN={run}".encode() in environ  # found as ever among a run's processes
        assert started["pid"] in run_processes(run)
        assert service.wait(run)["state"] == "succeeded"
        events = service.events(run)
        reports = {e["task"]: e for e in events if e["type"] == "worker-report"}
        assert set(reports) == {"t1", "t2", "t3"}
        for report in reports.values():
            assert report["exit_code"] == 0
            assert 0 <= report["prepare_seconds"] < 5  # from the order, not from the spare's start
        for task in ("t1", "t2", "t3"):
            out = service.run_dir(run) / "tasks" / task / "out"
            summary = json.loads((out / "summary.json").read_text())
            assert summary == {"n": 3, "sum": 0 + 1 + 4}, summary
            log = (service.run_dir(run) / "tasks" / task / "logs" / "w0-0.log").read_text()
            assert "Traceback" not in log
        wait_until(lambda: not run_processes(run), what="no process of the ended run")
    finally:
        stop_service(service)


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie does not)."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_spare_task_is_stopped_by_a_cancel_and_leaves_no_spare(tmp_path: Path) -> None:
    service = start_service(tmp_path)
    try:
        run = service.submit(chain(QUICK, LONG, QUICK))["id"]
        started = wait_until(lambda: pod_started(service.events(run), "t2"), 60, "t2 started")
        assert "simrun_harness.spare" in cmdline(started["pid"])
        waiting = wait_until(lambda: warm_spares(service.process.pid), what="the spares for t3")
        cancel = service.client.post(f"/runs/{run}/cancel")
        assert cancel.status_code == 200, cancel.text
        assert service.wait(run)["state"] == "cancelled"
        wait_until(lambda: not run_processes(run), what="no process of the cancelled run")
        assert not spares_of(run)
        assert set(waiting) <= set(warm_spares(service.process.pid))  # kept for the next run
        reports = [e for e in service.events(run) if e["type"] == "worker-report"]
        assert [r["task"] for r in reports if r["exit_code"] == 143] == ["t2"]
    finally:
        stop_service(service)


def test_a_spare_ends_with_a_killed_service_and_its_task_with_the_next(tmp_path: Path) -> None:
    service = start_service(tmp_path)
    try:
        run = service.submit(chain(QUICK, {"n": 2, "sleep_s": 3}, QUICK))["id"]
        wait_until(lambda: pod_started(service.events(run), "t2"), 60, "t2 started")
        spares = wait_until(lambda: warm_spares(service.process.pid), what="the spares for t3")
    finally:
        os.kill(service.process.pid, signal.SIGKILL)
        service.process.wait()
        stop_service(service)
    # The spare reads the end of its stdin; the task started from a spare is an orphan that the
    # next service kills (its pid file, its group, `SIMRUN_RUN` in its environment).
    wait_until(lambda: not any(alive(pid) for pid in spares), what="the spare's end")
    service = start_service(tmp_path)
    try:
        assert service.wait(run, timeout=120)["state"] == "succeeded"
    finally:
        stop_service(service)
    wait_until(lambda: not run_processes(run), what="no process of the run")
