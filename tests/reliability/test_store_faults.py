"""A store that cannot be written, through the real local service made faulty by `SIMRUN_FAULTS`
(`simrun_core.faults`): no partial line, 507 for submissions while it lasts, the runs that hit
it stopped with a message once the disk has room, every other run unaffected; and a harness
whose own event log fails exits with an error code and a message."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.helpers import make_harness_task, script
from live_service import (
    LocalService,
    command,
    python,
    run_processes,
    start_service,
    stop_service,
    wait_until,
)

from simrun_core import events as ev
from simrun_core import exits, faults
from simrun_core.fold import fold
from simrun_core.store import read_log

STORE_ERROR = "the store cannot be written"


@pytest.fixture
def faulty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """`faulty(spec)` starts the local service of `tmp_path` with `SIMRUN_FAULTS=spec`; this
    process never reads the variable itself."""
    faults.install(None)
    started: list[LocalService] = []

    def start(spec: str) -> LocalService:
        print(f"SIMRUN_FAULTS={spec}")
        with monkeypatch.context() as env:
            env.setenv("SIMRUN_FAULTS", spec)
            service = start_service(tmp_path)
        started.append(service)
        return service

    yield start
    for service in started:
        stop_service(service)


def wait_for_file(path: Path, then: str = "") -> list[str]:
    """A command that waits for `path` to exist, then runs `then`, then exits 0."""
    return python(
        f"import pathlib, sys, time\n"
        f"while not pathlib.Path({str(path)!r}).exists(): time.sleep(0.02)\n{then}"
    )


def check_log(path: Path) -> list[ev.Event]:
    """Whole lines only, a gap-free sequence from 1 that folds; the events."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), f"{path}: a partial last line"
    events = read_log(path)  # raises LogCorrupt on a line that is not an event
    assert len(events) == data.count(b"\n")
    assert [event.seq for event in events] == list(range(1, len(events) + 1)), f"{path}: a gap"
    fold(events)
    return events


def stopping(service: LocalService, run_id: str) -> bool:
    """Whether the actor of a run said (in the service's log) that it stops it."""
    return (
        f"run {run_id}: stopping it: {STORE_ERROR}"
        in (service.root / "service-test.log").read_text()
    )


def running(service: LocalService, run_id: str) -> bool:
    return service.client.get(f"/runs/{run_id}").json()["state"] == "running"


def task_queued(service: LocalService, run_id: str) -> bool:
    return service.client.get(f"/runs/{run_id}").json()["tasks"]["t"]["state"] == "queued"


@pytest.mark.parametrize(
    ("error", "strerror"),
    [("ENOSPC", "No space left on device"), ("EROFS", "Read-only file system")],
)
def test_a_full_disk_refuses_submissions_stops_the_runs_it_hit_and_no_other(
    tmp_path: Path, faulty, error: str, strerror: str
) -> None:
    """While the file `disk-full` exists every write of the store fails with `error`."""
    full = tmp_path / "disk-full"
    service: LocalService = faulty(f"append:{error}:while={full},atomic:{error}:while={full}")
    # Two cores: `hit` and `other` run, `cancelled` waits for a core.
    go = {name: tmp_path / f"go-{name}" for name in ("hit", "other", "cancelled")}
    runs = {
        name: service.submit({"name": name, "tasks": [command("t", wait_for_file(path))]})["id"]
        for name, path in go.items()
    }
    for name in ("hit", "other"):
        wait_until(lambda n=name: running(service, runs[n]), what=f"the run {name} to run")
    # `cancelled` has appended all it will before the disk is full: its task waits for a core
    wait_until(lambda: task_queued(service, runs["cancelled"]), what="the run cancelled to queue")
    other_log = service.run_dir(runs["other"]) / "events.jsonl"
    other_before = other_log.read_bytes()

    full.touch()
    quick = {"name": "quick", "tasks": [command("t", python("print(1)"))]}
    refused = service.client.post("/runs", json={"workflow": quick})
    assert refused.status_code == 507, refused.text
    assert STORE_ERROR in refused.json()["detail"]
    assert strerror in refused.json()["detail"]
    assert sorted(p.name for p in (service.store / "runs").iterdir()) == sorted(runs.values())

    cancel = service.client.post(f"/runs/{runs['cancelled']}/cancel")
    assert cancel.status_code == 507, cancel.text
    assert strerror in cancel.json()["detail"]
    go["hit"].touch()  # its process ends: the actor's append fails
    for name in ("hit", "cancelled"):
        wait_until(lambda n=name: stopping(service, runs[n]), what=f"the actor of {name} to fail")
        wait_until(lambda n=name: not run_processes(runs[n]), what=f"the run {name} to stop")
    # While the disk is full: the service answers, the logs hold whole lines only.
    assert service.client.get("/me").status_code == 200
    assert {item["id"] for item in service.client.get("/runs").json()} == set(runs.values())
    assert service.client.post("/runs", json={"workflow": quick}).status_code == 507
    for run_id in runs.values():
        check_log(service.run_dir(run_id) / "events.jsonl")
    assert running(service, runs["other"])

    full.unlink()  # the disk has room again
    for name in ("hit", "cancelled"):
        end = service.wait(runs[name], timeout=30)
        assert end["state"] == "failed", end
        assert STORE_ERROR in end["message"] and strerror in end["message"]
        events = check_log(service.run_dir(runs[name]) / "events.jsonl")
        assert not any(isinstance(event, ev.CancelRequested) for event in events)  # refused
    hit = check_log(service.run_dir(runs["hit"]) / "events.jsonl")
    assert any(isinstance(event, ev.PodSucceeded) for event in hit), "the retried events"

    after = service.submit(quick)["id"]  # a probe finds the room
    assert service.wait(after, timeout=30)["state"] == "succeeded"
    go["other"].touch()
    assert service.wait(runs["other"], timeout=30)["state"] == "succeeded"
    other = check_log(other_log)
    assert other_log.read_bytes().startswith(other_before)
    assert not any(isinstance(event, ev.Failed) for event in other)


SQUARES = 12


@pytest.mark.parametrize("seed", [7, 19, 31])
def test_seeded_faults_end_every_run_cleanly_with_whole_logs(
    tmp_path: Path, faulty, seed: int
) -> None:
    """Appends, fsyncs, atomic writes and the index fail at seeded rates: every submission is
    answered 201 or 507, every run ends succeeded with correct results or failed naming the
    error, every log is whole and gap-free, the index catches up, the service keeps answering."""
    # The first atomic write is the service's `service.json`, which it needs to start.
    spec = (
        f"append:ENOSPC:0.08:seed={seed},fsync:EIO:0.04:seed={seed + 1},"
        f"atomic:EACCES:0.04:seed={seed + 2}:nth=2,index:EIO:0.3:seed={seed + 3}"
    )
    service: LocalService = faulty(spec)
    rng = random.Random(seed)
    accepted: dict[str, str] = {}
    refusals = 0
    for number in range(8):
        kind = "squares" if number % 4 == 0 else "command"
        if kind == "squares":
            task = {"id": "t", "type": "demo.squares", "settings": {"n": SQUARES, "sleep_s": 0}}
        else:
            task = command("t", python(f"import pathlib, sys; print({number} * {number})"))
        workflow = {"name": f"{kind}-{number}", "tasks": [task]}
        for _ in range(20):
            response = service.client.post("/runs", json={"workflow": workflow})
            if response.status_code == 201:
                accepted[response.json()["id"]] = kind
                break
            assert response.status_code == 507, response.text
            assert STORE_ERROR in response.json()["detail"]
            refusals += 1
            time.sleep(rng.uniform(0.0, 0.05))
        else:
            pytest.fail("20 submissions in a row were refused")
        assert service.client.get("/me").status_code == 200

    stopped = 0
    ends: dict[str, dict] = {}
    for run_id, kind in accepted.items():
        end = service.wait(run_id, timeout=60)
        ends[run_id] = end
        events = check_log(service.run_dir(run_id) / "events.jsonl")
        record = fold(events)
        assert record.ended and record.state == end["state"], (run_id, end)
        if record.state == "succeeded":
            if kind == "squares":
                summary = service.run_dir(run_id) / "tasks/t/out/summary.json"
                assert f'"sum": {sum(i * i for i in range(SQUARES))}' in summary.read_text()
        else:
            # Only the store stops a run here: the processes of runs do not inherit the faults.
            assert record.state == "failed", (run_id, end)
            assert STORE_ERROR in (record.message or ""), (run_id, record.message)
            stopped += 1
        assert not run_processes(run_id)
    assert stopped + refusals > 0, "no fault was injected"

    expected = {run_id: end["state"] for run_id, end in ends.items()}
    listed: dict[str, str] = {}

    def index_caught_up() -> bool:
        listed.clear()
        listed.update({item["id"]: item["state"] for item in service.client.get("/runs").json()})
        return listed == expected

    deadline = time.monotonic() + 20
    while not index_caught_up() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listed == expected, "the index does not hold every run's end"
    print(f"{len(accepted)} runs, {stopped} stopped by the store, {refusals} submissions refused")


# --- the harness ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "error", "code"),
    [
        ("append:EIO", "Input/output error", exits.HARNESS_BUG),
        ("append:ENOSPC", "No space left on device", exits.DISK_FULL),
        ("append:ENOSPC:nth=3", "No space left on device", exits.DISK_FULL),
    ],
)
def test_a_harness_whose_event_log_fails_exits_with_an_error_and_a_message(
    tmp_path: Path, spec: str, error: str, code: int
) -> None:
    task = make_harness_task(tmp_path, {"n": 40, "sleep_s": 0.01})
    process = subprocess.Popen(
        [script("simrun-worker")],
        env=task.environment(SIMRUN_FAULTS=spec),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == code, stderr
    assert "simrun harness: w0: " in stderr and error in stderr, stderr
    log = task.log_path()
    if log.exists() and log.stat().st_size:
        assert log.read_bytes().endswith(b"\n")
        read_log(log)
    wait_until(lambda: not group_alive(process.pid), what="the processes of its pool to end")
    if spec.endswith("nth=3"):  # the report was written after the failure
        assert task.report().exit_code == code and error in (task.report().message or "")
        assert "the disk of the store is full" in (task.report().message or "")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_run_whose_harness_finds_the_disk_full_ends_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every write of the harness's event log fails with ENOSPC (`SIMRUN_RUN_FAULTS`, the plan
    of the runs' processes; the service's own writes succeed): the run fails saying that the
    disk of the store is full, not only "exit code 1"."""
    faults.install(None)
    monkeypatch.setenv(faults.RUNS_ENV, "append:ENOSPC")
    service = start_service(tmp_path)
    try:
        task = {"id": "t", "type": "demo.squares", "settings": {"n": 4, "sleep_s": 0}}
        run_id = service.submit({"name": "full", "tasks": [task]})["id"]
        end = service.wait(run_id, timeout=60)
        assert end["state"] == "failed", end
        message = service.client.get(f"/runs/{run_id}").json()["tasks"]["t"]["message"]
        assert "the disk of the store is full" in message, message
        assert "the disk of the store is full" in (end["message"] or ""), end
    finally:
        stop_service(service)
