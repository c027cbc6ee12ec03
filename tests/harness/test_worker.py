"""`simrun-worker` and `simrun-merge` as real processes on the demo `demo.squares`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading

import pytest

from simrun_core.events import UNITS_EVENTS, Merged, UnitsDone, UnitStarted, WorkerReport
from simrun_core.store import MERGED_MARKER
from simrun_harness import split
from simrun_harness.env import GIB, sizing_from_env, task_from_env, timing_from_env
from simrun_harness.errors import Terminated
from simrun_harness.memory import MemorySampler, OomKillCounter
from simrun_harness.merge import describe_indices, ledger_of, run_merge
from simrun_harness.periodic import Periodic
from simrun_harness.report import EventLog, Tally
from simrun_harness.split import IN_FLIGHT_PER_PROCESS, run_worker

from .helpers import HarnessTask, alive, ledger_entries, ledger_entry, pool_processes, wait_until

# The units a worker of 2 processes (SIMRUN_CORES=2, at most the CPUs) holds at once.
IN_FLIGHT = IN_FLIGHT_PER_PROCESS * min(2, len(os.sched_getaffinity(0)))


def sum_of_squares(n: int) -> int:
    return sum(index * index for index in range(n))


def test_many_short_units_are_written_in_batches_each_unit_exactly_once(make_task) -> None:
    task: HarnessTask = make_task({"n": 3000})
    process = task.run("simrun-worker")
    assert process.returncode == 0, process.stderr_text

    batches = [e for e in task.events() if isinstance(e, UnitsDone)]
    done = task.units_done()
    assert len(done) == 3000 and sorted(done) == list(range(3000)), "each unit exactly once"
    assert len(batches) < 3000 / 2, f"{len(batches)} units-done events for 3000 units"
    assert all(len(e.indices) == len(e.seconds) for e in batches)
    assert task.ledger(3000).missing() == []


def test_a_lone_unit_is_one_batch_of_one(make_task) -> None:
    task: HarnessTask = make_task({"n": 1})
    process = task.run("simrun-worker")
    assert process.returncode == 0, process.stderr_text

    [batch] = [e for e in task.events() if isinstance(e, UNITS_EVENTS)]
    assert isinstance(batch, UnitsDone) and batch.indices == (0,) and len(batch.seconds) == 1


def test_one_coordinator_computes_and_merges(make_task) -> None:
    task: HarnessTask = make_task({"n": 50})
    process = task.run("simrun-worker")
    assert process.returncode == 0, process.stderr_text

    events = task.events()
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    assert sorted(task.units_done()) == list(range(50))
    assert sorted(task.units_started()) == list(range(50))
    batches = [e for e in events if isinstance(e, UNITS_EVENTS)]
    assert all(e.task == "squares" and e.worker == "w0" for e in batches)
    assert [e.worker for e in events if isinstance(e, Merged)] == ["w0"]
    report = task.report()
    assert (report.task, report.worker, report.attempt, report.node) == (
        "squares",
        "w0",
        0,
        "test-node",
    )
    assert (report.units_done, report.exit_code, report.failed, report.message) == (
        50,
        0,
        False,
        None,
    )
    assert report.processes == min(2, len(os.sched_getaffinity(0)))
    assert report.peak_memory_bytes and report.peak_memory_bytes > 10 << 20
    assert report.cpu_seconds > 0 and report.seconds >= report.unit_seconds / report.processes

    assert task.summary() == {"n": 50, "sum": sum_of_squares(50)}
    assert (task.task_dir / "out" / MERGED_MARKER).exists()
    ledger = task.ledger(50)
    assert ledger.complete_ledger() and ledger.claims() == {}
    said = process.stderr_text.splitlines()  # the log of the process, what `simrun logs` shows
    assert said[0] == (
        "simrun harness: w0: the coordinator of task 'squares' (demo.squares): 50 units, "
        f"{report.processes} processes ({report.processes} cores, no memory limit)"
    ), said
    assert re.fullmatch(
        r"simrun harness: w0: computed 50 of the 50 units in \d+\.\d\d s "
        rf"\(\d+\.\d\d s of units in {report.processes} processes\)",
        said[1],
    ), said
    assert re.fullmatch(r"simrun harness: w0: merged the 50 units in \d+\.\d\d s", said[2]), said
    assert len(said) == 3, said


def test_memory_limit_sizes_the_pool(make_task) -> None:
    task = make_task({"n": 4})
    process = task.run("simrun-worker", SIMRUN_MEMORY_LIMIT_GB="0.75", SIMRUN_MEMORY_BASE_GB="0.5")
    assert process.returncode == 0, process.stderr_text
    report = task.report()
    assert report.processes == 1  # (0.75 - 0.5) / 0.25 GiB per process of the type's hint
    assert report.memory_limit_bytes == round(0.75 * GIB)
    assert report.per_worker_gb == 0.25


def test_failing_unit_exits_3_naming_it_and_releases_it(make_task) -> None:
    task = make_task({"n": 10, "fail_at": 7})
    process = task.run("simrun-worker", SIMRUN_CORES="1")
    assert process.returncode == 3
    assert "unit 7 failed: RuntimeError: unit 7 fails as fail_at asks" in process.stderr_text
    assert "Traceback" in process.stderr_text
    report = task.report()
    assert (report.exit_code, report.failed) == (3, True)
    assert report.message == "unit 7 failed: RuntimeError: unit 7 fails as fail_at asks"
    assert 7 not in task.units_done()
    assert not any(isinstance(event, Merged) for event in task.events())
    ledger = task.ledger(10)
    assert ledger.claims() == {}
    assert 7 in ledger.missing()


def test_sigterm_releases_claims_and_a_restart_completes(make_task) -> None:
    task = make_task({"n": 6, "sleep_s": 30})
    worker = task.start("simrun-worker", SIMRUN_GRACE_S="0.2")
    wait_until(lambda: len(task.units_started()) == IN_FLIGHT, what="the units in flight")
    os.killpg(worker.pid, signal.SIGTERM)  # as the local backend does: the whole group
    _, stderr = worker.communicate(timeout=15)
    assert worker.returncode == 143, stderr

    report = task.report()
    assert (report.exit_code, report.failed, report.units_done) == (143, False, 0)
    assert report.message.startswith("stopped on SIGTERM; released units")
    ledger = task.ledger(6)
    assert ledger.claims() == {}
    assert ledger.counts().done == 0
    assert len(ledger_entries(task.task_dir / "ledger", "release")) == IN_FLIGHT

    # The retry (same worker, next attempt) takes the released units again; the units are
    # made quick so the test is, which leaves the ledger (its size) as it is.
    (task.task_dir / "settings.json").write_text(json.dumps({"n": 6}))
    restart = task.run("simrun-worker", SIMRUN_ATTEMPT="1")
    assert restart.returncode == 0, restart.stderr_text
    assert sorted(task.units_done(attempt=1)) == list(range(6))
    assert task.report(attempt=1).exit_code == 0
    assert task.summary()["sum"] == sum_of_squares(6)
    assert len(task.events(attempt=0)) == IN_FLIGHT + 1, "the first attempt's log is as it was"


def test_sigterm_lets_running_units_finish_within_the_grace(make_task) -> None:
    task = make_task({"n": 20, "sleep_s": 0.5}, task_type="in_flight_plugin:MARKED_SQUARES")
    worker = task.start("simrun-worker", SIMRUN_GRACE_S="10")
    running = wait_until(
        lambda: sorted(int(path.name) for path in (task.task_dir / "begun").glob("*")),
        what="the pool to begin its first units (of 0.5 s)",
    )
    os.killpg(worker.pid, signal.SIGTERM)
    _, stderr = worker.communicate(timeout=15)
    assert worker.returncode == 143, stderr
    started, done = task.units_started(), task.units_done()
    assert set(running) <= set(done), "the units begun before the SIGTERM were finished"
    # the units claimed ahead that no process had begun are released, not computed
    not_begun = sorted(set(started) - set(done))
    assert set(done) <= set(started) and 0 < len(done) < 20 and len(not_begun) <= IN_FLIGHT
    assert not any((task.task_dir / "out" / "squares" / f"{i}.json").exists() for i in not_begun)
    report = task.report()
    released = f"; released units {describe_indices(not_begun)}" if not_begun else ""
    assert (report.exit_code, report.units_done, report.message) == (
        143,
        len(done),
        f"stopped on SIGTERM{released}",
    )
    ledger = task.ledger(20)
    assert ledger.claims() == {} and ledger.counts().done == len(done)


def test_a_killed_pool_process_exits_137_and_releases(make_task) -> None:
    task = make_task({"n": 4, "sleep_s": 30})
    worker = task.start("simrun-worker")
    wait_until(lambda: len(task.units_started()) == min(4, IN_FLIGHT), what="units in flight")
    pool = wait_until(lambda: pool_processes(worker), what="the pool processes")
    os.kill(pool[0], signal.SIGKILL)
    _, stderr = worker.communicate(timeout=15)
    assert worker.returncode == 137, stderr
    report = task.report()
    assert (report.exit_code, report.failed) == (137, False)
    assert "a process of the pool died" in report.message
    assert task.ledger(4).claims() == {}
    wait_until(lambda: not any(alive(pid) for pid in pool), what="the pool to end with it")


def test_two_workers_give_the_same_result_as_one(make_task) -> None:
    task = make_task({"n": 40, "sleep_s": 0.05})
    base = task.start("simrun-worker", SIMRUN_CORES="1")
    extra = task.start(
        "simrun-worker", SIMRUN_CORES="1", SIMRUN_WORKER="w1", SIMRUN_ROLE="extra", SIMRUN_MERGE="0"
    )
    for process in (base, extra):
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 0, stderr
    by_base, by_extra = task.units_done("w0"), task.units_done("w1")
    assert by_base and by_extra, "both workers computed units"
    assert sorted(set(by_base) | set(by_extra)) == list(range(40))
    assert task.report("w0").units_done + task.report("w1").units_done == len(by_base + by_extra)
    assert not any(isinstance(event, Merged) for event in task.events("w1"))
    assert task.summary() == {"n": 40, "sum": sum_of_squares(40)}


def test_coordinator_releases_and_computes_claims_of_a_stale_worker(make_task) -> None:
    task = make_task({"n": 6})
    dead = task.ledger(6)
    dead.heartbeat("w9")
    lost = [dead.claim("w9"), dead.claim("w9")]
    long_ago = os.stat(task.task_dir / "ledger" / "heartbeats" / "w9").st_mtime - 1000
    os.utime(task.task_dir / "ledger" / "heartbeats" / "w9", (long_ago, long_ago))

    process = task.run("simrun-worker", SIMRUN_STALE_S="1")
    assert process.returncode == 0, process.stderr_text
    assert sorted(task.units_done()) == list(range(6))
    for index in lost:
        assert os.readlink(ledger_entry(task.task_dir / "ledger", "release", f"{index}.0")) == "w0"
    assert task.summary()["sum"] == sum_of_squares(6)


def test_coordinator_waits_for_a_live_worker_then_merges(make_task) -> None:
    task = make_task({"n": 5})
    other = task.ledger(5)
    other.heartbeat("w8")
    held = other.claim("w8")
    beating = threading.Event()
    thread = threading.Thread(target=lambda: _beat(other, "w8", beating), daemon=True)
    thread.start()
    try:
        coordinator = task.start("simrun-worker", SIMRUN_STALE_S="3")
        wait_until(lambda: len(task.units_done()) == 4, what="the other four units")
        with pytest.raises(subprocess.TimeoutExpired):  # it waits for the held unit
            coordinator.wait(timeout=1.0)
        squares = task.task_dir / "out" / "squares"
        (squares / f"{held}.json").write_text(json.dumps({"index": held, "square": held * held}))
        other.complete(held, "w8")
        _, stderr = coordinator.communicate(timeout=15)
    finally:
        beating.set()
        thread.join()
    assert coordinator.returncode == 0, stderr
    assert held not in task.units_done()
    assert task.summary()["sum"] == sum_of_squares(5)


def _beat(ledger, worker: str, stop: threading.Event) -> None:
    while not stop.wait(0.1):
        ledger.heartbeat(worker)


@pytest.mark.parametrize(
    ("changes", "settings", "message"),
    [
        ({"SIMRUN_CORES": "many"}, {"n": 3}, "SIMRUN_CORES: 'many' is not an integer"),
        ({"SIMRUN_TASK_TYPE": "nope"}, {"n": 3}, "SIMRUN_TASK_TYPE: unknown task type 'nope'"),
        (
            {"SIMRUN_TASK_TYPE": "harness_test_plugin:COPY"},
            {"n": 3},
            "SIMRUN_TASK_TYPE: 'test.copy' is not split into units",
        ),
        ({"SIMRUN_ROLE": "extra"}, {"n": 3}, "SIMRUN_MERGE: only the coordinator"),
        ({"SIMRUN_MEMORY_LIMIT_GB": "0.1"}, {"n": 3}, "SIMRUN_MEMORY_LIMIT_GB"),
        ({}, {"n": "three"}, "settings.json: settings of 'demo.squares'"),
        ({}, {"n": 3, "m": 1}, "unknown setting 'm'"),
    ],
)
def test_configuration_errors_exit_4_with_a_report(make_task, changes, settings, message) -> None:
    task = make_task(settings)
    process = task.run("simrun-worker", **changes)
    assert process.returncode == 4
    assert message in process.stderr_text
    report = task.report()
    assert report.exit_code == 4 and message in report.message


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"SIMRUN_TASK_DIR": None}, "SIMRUN_TASK_DIR is not set"),
        ({"SIMRUN_TASK_DIR": "/nonexistent/runs/r/tasks/t"}, "is not a directory"),
        ({"SIMRUN_ATTEMPT": "first"}, "SIMRUN_ATTEMPT: 'first' is not an integer"),
        ({"SIMRUN_WORKER": "w/0"}, "SIMRUN_WORKER: 'w/0' is no valid worker id"),
    ],
)
def test_errors_before_a_log_exists_exit_4_on_stderr(make_task, changes, message) -> None:
    task = make_task({"n": 3})
    process = task.run("simrun-worker", **changes)
    assert process.returncode == 4
    assert f"simrun-worker: {message}" in process.stderr_text or message in process.stderr_text
    assert not (task.task_dir / "events").exists()


def test_merge_refuses_missing_units_then_merges(make_task) -> None:
    task = make_task({"n": 8})
    ledger = task.ledger(8)
    (task.task_dir / "out" / "squares").mkdir(parents=True)
    for index in (0, 1, 2, 5):
        square = {"index": index, "square": index * index}
        (task.task_dir / "out" / "squares" / f"{index}.json").write_text(json.dumps(square))
        ledger.complete(index, "w0")
    process = task.run("simrun-merge", SIMRUN_WORKER=None)
    assert process.returncode == 3
    assert "4 of 8 units are not done: 3-4, 6-7" in process.stderr_text
    assert task.report("merge").message == "cannot merge: 4 of 8 units are not done: 3-4, 6-7"

    computed = task.run("simrun-worker", SIMRUN_MERGE="0")
    assert computed.returncode == 0, computed.stderr_text
    assert not (task.task_dir / "out" / "summary.json").exists()
    merged = task.run("simrun-merge", SIMRUN_WORKER=None, SIMRUN_ATTEMPT="1")
    assert merged.returncode == 0, merged.stderr_text
    events = task.events("merge", attempt=1)
    assert [type(event) for event in events] == [Merged, WorkerReport]
    assert re.fullmatch(
        r"simrun harness: merge: merged the 8 units in \d+\.\d\d s\n", merged.stderr_text
    ), merged.stderr_text
    assert task.summary()["sum"] == sum_of_squares(8)
    assert (task.task_dir / "out" / MERGED_MARKER).exists()


def test_merge_failure_exits_3(make_task) -> None:
    task = make_task({"n": 2})
    assert task.run("simrun-worker", SIMRUN_MERGE="0").returncode == 0
    (task.task_dir / "out" / "squares" / "1.json").write_text("not json")
    process = task.run("simrun-merge", SIMRUN_WORKER=None)
    assert process.returncode == 3
    assert task.report("merge").message.startswith("merge failed: JSONDecodeError")
    assert not (task.task_dir / "out" / MERGED_MARKER).exists()


def test_units_started_match_claims(make_task) -> None:
    task = make_task({"n": 12})
    assert task.run("simrun-worker").returncode == 0
    started = [e for e in task.events() if isinstance(e, UnitStarted)]
    claims = ledger_entries(task.task_dir / "ledger", "claim")
    assert sorted(f"{e.index}.0" for e in started) == sorted(claims)


def run_coordinator(task, loaded, log: EventLog, tally: Tally, stop: threading.Event) -> None:
    """Run the coordinator `w0` of a task, with its merge, in this process."""
    run_worker(
        loaded,
        "w0",
        log=log,
        tally=tally,
        sizing=sizing_from_env(task.env, loaded.task_type),
        timing=timing_from_env(task.env),
        stop=stop,
        coordinator=True,
        merge=True,
    )


def test_a_stop_before_the_first_claim_claims_nothing(make_task) -> None:
    task = make_task({"n": 3})
    loaded = task_from_env(task.env, "split")
    stop = threading.Event()
    stop.set()
    log = EventLog(task.log_path())
    tally = Tally(MemorySampler(), OomKillCounter())
    with pytest.raises(Terminated, match="before the first claim"):
        run_coordinator(task, loaded, log, tally, stop)
    with pytest.raises(Terminated, match="before the merge"):
        run_merge(loaded, ledger_of(loaded), "w0", log, stop)
    log.close()
    assert task.ledger(3).counts().pending == 3
    assert task.events() == []


def test_the_heartbeat_and_memory_threads_start_once_the_first_units_are_in_the_pool(
    make_task, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread's start and its first heartbeat or sample would hold up the first claims."""
    task = make_task({"n": 3, "sleep_s": 0.2})
    loaded = task_from_env(task.env, "split")
    claims_seen: dict[str, list[str]] = {}

    class Recorded(Periodic):
        def __enter__(self) -> Periodic:
            claims_seen[self.name] = sorted(ledger_entries(task.task_dir / "ledger", "claim"))
            return super().__enter__()

    monkeypatch.setattr(split, "Periodic", Recorded)
    log = EventLog(task.log_path())
    tally = Tally(MemorySampler(), OomKillCounter())
    run_coordinator(task, loaded, log, tally, threading.Event())
    log.close()
    every_unit = ["0.0", "1.0", "2.0"]  # 2 processes keep 4 units in flight: all 3 at once
    assert claims_seen == {"heartbeat": every_unit, "memory": every_unit}
    assert task.summary()["sum"] == sum_of_squares(3)
    assert tally.memory.peak is not None  # sampled while the units ran
