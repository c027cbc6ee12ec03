"""A service killed with SIGKILL during a run: the next one folds the log and ends the run."""

from __future__ import annotations

import os
import signal

from live_service import (
    READ,
    WRITE,
    command,
    python,
    run_processes,
    start_service,
    stop_service,
    wait_until,
)


def test_a_run_survives_a_killed_service_and_leaves_no_orphan(tmp_path):
    slow_write = python("import time; time.sleep(2)\n" + WRITE.replace("; ", "\n"))
    workflow = {
        "name": "recover",
        "tasks": [
            command("first", [*slow_write, "{out}"]),
            command("second", [*python(READ), "{input}"], inputs={"data": "first.out"}),
        ],
    }
    service = start_service(tmp_path)
    try:
        run = service.submit(workflow)
        orphans = wait_until(lambda: run_processes(run["id"]), what="the first task's process")
        wait_until(
            lambda: any(e["type"] == "pod-started" for e in service.events(run["id"])),
            what="the start of the pod in the log",
        )
        os.kill(service.process.pid, signal.SIGKILL)
        service.process.wait()
        assert run_processes(run["id"]) == orphans, "the process outlives the killed service"
    finally:
        stop_service(service)
    service = start_service(tmp_path)
    try:
        end = service.wait(run["id"])
        assert end["state"] == "succeeded", end
        assert "read 42" in service.client.get(f"/runs/{run['id']}/logs/second").text
        events = service.events(run["id"])
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        interrupted = [e for e in events if e["type"] == "pod-failed" and e["task"] == "first"]
        assert interrupted and "service stopped" in interrupted[0]["message"]
        assert sum(e["type"] == "workflow-submitted" for e in events) == 1
        for pid in orphans:
            assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
        assert run_processes(run["id"]) == []
    finally:
        stop_service(service)


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_stopped_service_cancels_its_runs_and_waits_for_their_processes(tmp_path):
    service = start_service(tmp_path)
    try:
        run = service.submit(
            {"name": "s", "tasks": [command("sleep", python("import time; time.sleep(600)"))]}
        )
        wait_until(lambda: run_processes(run["id"]), what="the process of the run")
        listed = wait_until(
            lambda: [i for i in service.client.get("/runs").json() if i["state"] == "running"],
            what="the run to be listed running",
        )
        assert [item["id"] for item in listed] == [run["id"]]
        assert listed[0]["progress"] == 0.0
    finally:
        stop_service(service)
    assert service.process.returncode == 0
    assert run_processes(run["id"]) == []
    events = service.events(run["id"])
    assert events[-1]["type"] == "cancelled"
    assert "the service stopping" in events[-1]["message"]
    assert not (tmp_path / ".simrun" / "service.json").exists()
