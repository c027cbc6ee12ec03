"""The live views of the real local service: the event stream of the runs and servers, the
servers, the workers of a task, and the logs kept once a task is final."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator

import httpx
import pytest
from live_service import (
    LocalService,
    command,
    python,
    run_processes,
    start_service,
    stop_service,
    wait_until,
)
from service_helpers import next_event, sse

SLEEP = python("import time; time.sleep(600)")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
    started = start_service(tmp_path_factory.mktemp("live"))
    try:
        yield started
    finally:
        stop_service(started)


def squares(n: int, **settings) -> dict:
    return {
        "name": "squares",
        "tasks": [{"id": "squares", "type": "demo.squares", "settings": {"n": n, **settings}}],
    }


def pods_of(servers: list[dict], run_id: str) -> list[dict]:
    return [pod for server in servers for pod in server["pods"] if pod["run_id"] == run_id]


def test_the_event_stream_sends_runs_and_servers_on_connect_and_on_change(service):
    client = httpx.Client(
        base_url=service.info["url"],
        headers=service.client.headers,
        timeout=httpx.Timeout(30, read=15),
    )
    with client, client.stream("GET", "/events", params={"group": "streamed"}) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        messages = sse(stream.iter_lines())
        assert next_event(messages, "runs") == []
        first_servers = next_event(messages, "servers")
        assert [server["name"] for server in first_servers] == [socket.gethostname()]

        run = service.submit(
            {"name": "streamed", "tasks": [command("sleep", SLEEP)]}, group="streamed"
        )
        runs = next_event(messages, "runs", lambda items: items)
        assert [item["id"] for item in runs] == [run["id"]]
        assert runs[0]["workflow"] == "streamed" and runs[0]["owner"] == run["owner"]
        servers = next_event(messages, "servers", lambda data: pods_of(data, run["id"]))
        assert pods_of(servers, run["id"])[0]["task_id"] == "sleep"

        assert service.client.post(f"/runs/{run['id']}/cancel").status_code == 200
        ended = next_event(messages, "runs", lambda items: items[0]["state"] == "cancelled")
        assert ended[0]["progress"] is None
        next_event(messages, "servers", lambda data: not pods_of(data, run["id"]))


def test_servers_are_this_machine_with_the_processes_of_runs(service):
    response = service.client.get("/servers")
    assert response.status_code == 200, response.text
    [server] = response.json()
    assert server["name"] == socket.gethostname()
    assert server["cores"] == len(os.sched_getaffinity(0))
    assert server["memory_gb"] > 0 and server["gpus"] == 0 and server["reserved_by"] is None
    run = service.submit({"name": "placed", "tasks": [command("sleep", SLEEP)]})
    pods = wait_until(
        lambda: pods_of(service.client.get("/servers").json(), run["id"]), what="the pod listed"
    )
    assert pods == [
        {
            "run_id": run["id"],
            "task_id": "sleep",
            "pod": "sleep-0",
            "phase": "running",
            "cores": 1.0,
            "memory_gb": run["tasks"]["sleep"]["plan"]["memory_gb"],
        }
    ]
    assert service.client.post(f"/runs/{run['id']}/cancel").status_code == 200
    service.wait(run["id"])
    assert pods_of(service.client.get("/servers").json(), run["id"]) == []


def test_the_workers_of_a_task_live_and_ended(service):
    run = service.submit(squares(400, sleep_s=0.2))
    base = f"/runs/{run['id']}/tasks/squares/workers"
    wait_until(
        lambda: any(e["type"] == "unit-done" for e in service.events(run["id"])),
        what="the first unit",
    )
    [live] = service.client.get(base).json()
    assert live["worker"] == "w0" and live["state"] == "running"
    assert live["node"] == socket.gethostname() and live["attempts"] == 1
    assert live["units_done"] >= 1 and live["units_claimed"] >= 1
    assert live["processes"] is None and live["peak_memory_gb"] is None
    assert service.client.post(f"/runs/{run['id']}/cancel").status_code == 200
    service.wait(run["id"])
    assert run_processes(run["id"]) == []

    done = service.submit(squares(12))
    assert service.wait(done["id"])["state"] == "succeeded"
    [worker] = service.client.get(f"/runs/{done['id']}/tasks/squares/workers").json()
    assert worker["state"] == "done" and worker["attempts"] == 1
    assert worker["units_done"] == 12 and worker["units_claimed"] == 0
    assert worker["processes"] >= 1 and worker["peak_memory_gb"] > 0
    assert worker["node"] == socket.gethostname() and worker["oom_killed"] is False
    missing = service.client.get(f"/runs/{done['id']}/tasks/nope/workers")
    assert missing.status_code == 404 and "no task 'nope'" in missing.json()["detail"]


def test_the_logs_of_a_final_task_are_kept_and_served_first(service):
    lines = python("for i in range(5): print('line', i)")
    run = service.submit({"name": "logs", "tasks": [command("talk", lines)]})
    assert service.wait(run["id"])["state"] == "succeeded"
    logs = service.run_dir(run["id"]) / "tasks/talk/logs"
    assert json.loads((logs / "index.json").read_text()) == ["talk-0"]
    kinds = [e["type"] for e in service.events(run["id"])]
    assert kinds.index("logs-kept") < kinds.index("succeeded")
    (logs / "stray-0.log").write_text("not a pod of the task\n")
    text = service.client.get(f"/runs/{run['id']}/logs/talk", params={"tail_lines": 2}).text
    assert text == "==> talk-0.log <==\nline 3\nline 4\n"
    whole = service.client.get(f"/runs/{run['id']}/logs/talk", params={"tail_lines": 0}).text
    assert whole.count("line") == 5 and "stray" not in whole
