"""A corrupt line in the middle of a run's log, made on disk between two starts of the local
service: that run answers 500 naming the file and the line, is still listed (not resumed), and
every other run is served as before; a torn last line is ignored."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

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

from simrun_cli.client import Client, ServiceError
from simrun_core.store import read_log

QUICK = python("print('ok')")
SLEEP = python("import time; time.sleep(600)")


def workflow(name: str, args: list[str]) -> dict:
    return {"name": name, "tasks": [command("t", args)]}


def corrupt_line(path: Path, number: int) -> bytes:
    """Overwrite line `number` (from 1) with as many bytes that are not JSON; the old line."""
    lines = path.read_bytes().splitlines(keepends=True)
    old = lines[number - 1]
    lines[number - 1] = b"#" * (len(old) - 1) + b"\n"
    path.write_bytes(b"".join(lines))
    return old


def simrun_list(root: Path) -> list[dict]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SIMRUN_")}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "simrun"), "list", "--local", "--json"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_corrupt_line_fails_its_run_only_and_every_run_stays_listed(tmp_path: Path) -> None:
    service = start_service(tmp_path)
    try:
        ended = service.submit(workflow("ended", QUICK))["id"]
        torn = service.submit(workflow("torn", QUICK))["id"]
        first = service.submit(workflow("first", QUICK))["id"]
        live = service.submit(workflow("live", SLEEP))["id"]
        assert service.wait(ended)["state"] == "succeeded"
        assert service.wait(torn)["state"] == "succeeded"
        assert service.wait(first)["state"] == "succeeded"
        wait_until(lambda: run_processes(live), what="the process of the live run")
        # Its pid file is written (the next service kills the process by it) before the pod's
        # start is logged; a kill between the two would leave a process no service knows.
        wait_until(
            lambda: any(e["type"] == "pod-started" for e in service.events(live)),
            what="the start of the live run's pod in its log",
        )
        torn_history = service.client.get(f"/runs/{torn}/history").json()
    finally:
        os.kill(service.process.pid, signal.SIGKILL)  # the live run stays live in its log
        service.process.wait()
        stop_service(service)

    ended_log = service.run_dir(ended) / "events.jsonl"
    live_log = service.run_dir(live) / "events.jsonl"
    corrupt_line(ended_log, 3)
    corrupt_line(live_log, 2)
    first_log = service.run_dir(first) / "events.jsonl"
    corrupt_line(first_log, 1)
    live_bytes = live_log.read_bytes()
    with open(service.run_dir(torn) / "events.jsonl", "ab") as file:
        file.write(b'{"seq": 99, "type": "succ')

    service = start_service(tmp_path)
    try:
        check_served(service, ended, ended_log, 3)
        check_served(service, live, live_log, 2)
        check_served(service, first, first_log, 1)
        assert run_processes(live) == [], "the processes of the unresumed run were not killed"

        # The other runs and the service go on: a torn last line is not read.
        record = service.client.get(f"/runs/{torn}")
        assert record.status_code == 200, record.text
        assert record.json()["state"] == "succeeded"
        assert service.client.get(f"/runs/{torn}/history").json() == torn_history
        new = service.submit(workflow("after", QUICK))["id"]
        assert service.wait(new)["state"] == "succeeded"

        listed = {item["id"]: item for item in service.client.get("/runs").json()}
        assert set(listed) == {ended, torn, live, first, new}
        corrupted = [(ended, ended_log, 3), (live, live_log, 2), (first, first_log, 1)]
        for run_id, log, line in corrupted:
            assert listed[run_id]["state"] == "failed"
            assert str(log) in listed[run_id]["message"]
            assert f"line {line} " in listed[run_id]["message"]
        assert listed[live]["workflow"] == "live"  # from the event before the corrupt line
        assert listed[first]["workflow"] == "unknown"  # no event before it
        assert listed[torn]["state"] == listed[new]["state"] == "succeeded"
        assert {item["id"] for item in simrun_list(tmp_path)} == {ended, torn, live, first, new}

        # No actor took the live run up: a run submitted after it has ended, and its log is
        # as it was corrupted.
        assert live_log.read_bytes() == live_bytes

        # A run whose log cannot be read is removed as the list shows it (ended: failed).
        for run_id in (ended, live):
            removed = service.client.delete(f"/runs/{run_id}")
            assert removed.status_code == 200, removed.text
            assert removed.json()["runs"] == [f"runs/{run_id}"]
            assert not service.run_dir(run_id).exists()
        assert {item["id"] for item in service.client.get("/runs").json()} == {torn, first, new}
    finally:
        stop_service(service)
    assert [event.seq for event in read_log(service.run_dir(new) / "events.jsonl")][-1] > 1


def check_served(service: LocalService, run_id: str, log: Path, line: int) -> None:
    """Every read of the run's state answers 500 naming the file and the corrupt line."""
    for route in ("", "/history", "/progress", "/wait?timeout=0", "/events"):
        response = service.client.get(f"/runs/{run_id}{route}")
        assert response.status_code == 500, (route, response.text)
        detail = response.json()["detail"]
        assert str(log) in detail and f"line {line} " in detail, (route, detail)


def test_a_line_corrupted_while_a_run_is_followed_ends_the_stream_with_its_error(
    tmp_path: Path,
) -> None:
    service = start_service(tmp_path)
    try:
        live = service.submit(workflow("live", SLEEP))["id"]
        log = service.run_dir(live) / "events.jsonl"
        wait_until(lambda: run_processes(live), what="the process of the live run")
        # the actor appends nothing more while its process sleeps: the line below is the last
        wait_until(
            lambda: any(
                e["type"] == "task-state" and e["state"] == "running" for e in service.events(live)
            ),
            what="the live run's task to run",
        )
        with Client(service.info["url"], service.info["token"]) as client:
            events = client.follow(live, timeout_s=60)
            assert next(events).seq == 1
            with open(log, "ab") as file:
                file.write(b"#" * 20 + b"\n")
            corrupt = len(log.read_bytes().splitlines())
            with pytest.raises(ServiceError) as raised:
                for _ in events:
                    pass
        assert raised.value.status == 500
        assert str(log) in raised.value.detail and f"line {corrupt} " in raised.value.detail
    finally:
        stop_service(service)
