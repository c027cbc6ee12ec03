"""The live views of the real local service: the event stream of the runs and servers, the
servers, the workers of a task, and the logs kept once a task is final."""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile
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
from unit_events import UNIT_TYPES, unit_indices

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
            "gpus": 0,
        }
    ]
    assert service.client.post(f"/runs/{run['id']}/cancel").status_code == 200
    service.wait(run["id"])
    assert pods_of(service.client.get("/servers").json(), run["id"]) == []


def test_the_workers_of_a_task_live_and_ended(service):
    run = service.submit(squares(400, sleep_s=0.2))
    base = f"/runs/{run['id']}/tasks/squares/workers"
    wait_until(
        lambda: unit_indices(service.events(run["id"])) != [],
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


PLANT_OUTPUTS = (
    "import os, sys, pathlib; out = pathlib.Path(sys.argv[1]); "
    "(out / 'deep' / 'er').mkdir(parents=True, exist_ok=True); "
    "(out / 'a.txt').write_text('a'); "
    "(out / 'deep' / 'er' / 'b.bin').write_bytes(bytes(range(256)) * 5000); "
    "[(out / 'deep' / (str(i) + '.json')).write_text(str(i)) for i in range(300)]; "
    "(out / '.hidden').write_text('h'); "
    "os.symlink('/etc/passwd', out / 'passwd'); "
    "os.symlink('/etc', out / 'deep' / 'etc'); "
    "os.mkfifo(out / 'pipe')"
)


def test_the_outputs_of_a_task_come_as_one_tar_of_what_the_list_shows(service):
    plant = command("t", [*python(PLANT_OUTPUTS), "{out}"])
    run = service.submit({"name": "tar", "tasks": [plant]})
    assert service.wait(run["id"])["state"] == "succeeded"
    listed = service.client.get(f"/runs/{run['id']}/outputs/t", params={"limit": 0}).json()
    archive = f"/runs/{run['id']}/tasks/t/outputs.tar"
    with service.client.stream("GET", archive) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "application/x-tar"
        body = response.read()
    assert b"root:" not in body, "no link is followed"
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        members = tar.getmembers()
        assert all(member.isreg() for member in members)
        out = f"runs/{run['id']}/tasks/t/out/"  # the list is relative to the store, the tar to out/
        assert sorted((m.name, m.size) for m in members) == sorted(
            (file["path"].removeprefix(out), file["bytes"]) for file in listed["files"]
        )
        assert len(members) == 302 and ".hidden" not in {m.name for m in members}
        assert tar.extractfile("deep/er/b.bin").read() == bytes(range(256)) * 5000
        assert tar.extractfile("deep/7.json").read() == b"7"
    missing = service.client.get(f"/runs/{run['id']}/tasks/nope/outputs.tar")
    assert missing.status_code == 404 and "no task 'nope'" in missing.json()["detail"]

    out = service.run_dir(run["id"]) / "tasks/t/out"
    out.rename(out.with_name("out-real"))
    os.symlink("/etc", out)
    linked = service.client.get(archive)
    assert linked.status_code == 404 and "out/ is a link" in linked.json()["detail"]
    out.unlink()
    with tarfile.open(fileobj=io.BytesIO(service.client.get(archive).content)) as tar:
        assert tar.getmembers() == [], "a task without out/ has an empty archive"


def test_the_history_is_filtered_and_tailed_by_the_service(service):
    run = service.submit(squares(12))
    assert service.wait(run["id"])["state"] == "succeeded"
    base = f"/runs/{run['id']}/history"

    def history(params) -> list[dict]:
        response = service.client.get(base, params=params)
        assert response.status_code == 200, response.text
        return response.json()

    every = history({})
    units = [event for event in every if event["type"] in UNIT_TYPES]
    assert sorted(unit_indices(units)) == list(range(12))
    assert history([("type", "unit-done"), ("type", "units-done")]) == units
    ends = [event for event in every if event["type"] in ("task-state", "succeeded")]
    assert history([("type", "task-state"), ("type", "succeeded")]) == ends
    assert history({"task": "squares"}) == [e for e in every if e.get("task") == "squares"]
    assert history({"type": "units-done", "tail": 3}) == units[-3:]
    assert history({"tail": 2}) == every[-2:]
    assert history({"after": 3, "limit": 2}) == every[3:5]
    assert history({"type": "submitted", "task": "squares"}) == []
    refused = service.client.get(base, params={"type": "unit_done"})
    assert refused.status_code == 400, refused.text
