"""The demo split task through the real service and harness: the log, failures, cancel, kill."""

from __future__ import annotations

import os
import signal
from collections import Counter

from live_service import (
    command,
    python,
    run_processes,
    start_service,
    stop_service,
    wait_until,
)
from unit_events import unit_indices


def squares(n: int, **settings) -> dict:
    return {"id": "squares", "type": "demo.squares", "settings": {"n": n, **settings}}


def test_the_log_of_a_split_run_has_every_unit_once_and_ends_succeeded(local_service):
    run = local_service.submit({"name": "squares", "tasks": [squares(60)]})
    end = local_service.wait(run["id"])
    assert end["state"] == "succeeded", end
    events = local_service.events(run["id"])
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "submitted" and events[-1]["type"] == "succeeded"
    kinds = [e["type"] for e in events]
    assert kinds.index("pod-started") < kinds.index("units-done"), kinds  # a warm spare is quick
    units = Counter(unit_indices(events))
    assert units == Counter(range(60))
    assert sum(e["type"] == "merged" for e in events) == 1
    assert sum(e["type"] == "worker-report" for e in events) == 1
    summary = local_service.run_dir(run["id"]) / "tasks/squares/out/summary.json"
    assert summary.read_text() == f'{{"n": 60, "sum": {sum(i * i for i in range(60))}}}'
    progress = local_service.client.get(f"/runs/{run['id']}/progress").json()
    assert progress["tasks"]["squares"]["done"] == 60
    assert progress["tasks"]["squares"]["units"] == 60


def test_a_failing_unit_fails_the_run_naming_the_task_and_the_unit(local_service):
    run = local_service.submit({"name": "f", "tasks": [squares(20, fail_at=13)]})
    end = local_service.wait(run["id"])
    assert end["state"] == "failed"
    assert "task 'squares' failed" in end["message"]
    assert "unit 13 failed" in end["message"]
    assert run_processes(run["id"]) == []


def test_a_command_reads_the_output_of_a_split_task(local_service):
    count = (
        "import sys, os; port, path = sys.argv[1].split('=', 1); print(port, len(os.listdir(path)))"
    )
    workflow = {
        "name": "read-squares",
        "tasks": [
            command("count", [*python(count), "{input}"], inputs={"sq": "squares.squares"}),
            squares(25),
        ],
    }
    run = local_service.submit(workflow)
    end = local_service.wait(run["id"])
    assert end["state"] == "succeeded", end
    assert "sq 25" in local_service.client.get(f"/runs/{run['id']}/logs/count").text


def test_cancelling_a_split_run_leaves_no_process(local_service):
    run = local_service.submit({"name": "c", "tasks": [squares(400, sleep_s=0.5)]})
    wait_until(
        lambda: unit_indices(local_service.events(run["id"])) != [],
        what="the first unit",
    )
    assert run_processes(run["id"])
    assert local_service.client.post(f"/runs/{run['id']}/cancel").status_code == 200
    end = local_service.wait(run["id"])
    assert end["state"] == "cancelled"
    assert end["tasks"] == {"squares": "cancelled"}  # stopped while it ran: not skipped
    assert run_processes(run["id"]) == []
    assert local_service.events(run["id"])[-1]["type"] == "cancelled"


def test_a_killed_service_resumes_a_split_run_from_its_ledger(tmp_path):
    service = start_service(tmp_path)
    try:
        run = service.submit({"name": "k", "tasks": [squares(200, sleep_s=0.02)]})
        wait_until(
            lambda: len(unit_indices(service.events(run["id"]))) >= 20,
            what="twenty units",
        )
        os.kill(service.process.pid, signal.SIGKILL)
        service.process.wait()
    finally:
        stop_service(service)
    service = start_service(tmp_path)
    try:
        end = service.wait(run["id"])
        assert end["state"] == "succeeded", end
        events = service.events(run["id"])
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert Counter(unit_indices(events)) == Counter(range(200))
        assert {e.get("attempt", 0) for e in events if e["type"] == "pod-started"} == {0, 1}
        summary = service.run_dir(run["id"]) / "tasks/squares/out/summary.json"
        assert f'"sum": {sum(i * i for i in range(200))}' in summary.read_text()
        assert run_processes(run["id"]) == []
    finally:
        stop_service(service)
