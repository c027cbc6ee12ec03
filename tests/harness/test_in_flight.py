"""The units a worker keeps in flight: one running and one waiting per process of its pool, and
what becomes of the waiting ones when the worker stops."""

from __future__ import annotations

import os
import signal

from simrun_harness.merge import describe_indices
from simrun_harness.split import IN_FLIGHT_PER_PROCESS

from .helpers import HarnessTask, wait_until

MARKED = "in_flight_plugin:MARKED"
UNTIL_STOPPED = "in_flight_plugin:UNTIL_STOPPED"
PROCESSES = min(2, len(os.sched_getaffinity(0)))  # SIMRUN_CORES=2, at most the CPUs
IN_FLIGHT = IN_FLIGHT_PER_PROCESS * PROCESSES


def begun(task: HarnessTask) -> list[int]:
    """The units a process of the pool began (see the plugin)."""
    directory = task.task_dir / "begun"
    return sorted(int(name) for name in os.listdir(directory)) if directory.exists() else []


def test_a_worker_holds_two_units_per_process(make_task) -> None:
    """Each process computes one unit and has the next one waiting; no more are claimed.

    The worker fills its units in flight, then writes their claims while it waits for one to
    end: its first `unit-started` events are every claim it makes until a unit completes, and
    none does while the units wait at the gate."""
    task: HarnessTask = make_task({"n": 12}, task_type=MARKED)
    worker = task.start("simrun-worker")
    wait_until(lambda: len(task.units_started()) >= IN_FLIGHT, what="the units in flight")
    wait_until(lambda: len(begun(task)) >= PROCESSES, what="each process to begin a unit")
    assert len(task.units_started()) == IN_FLIGHT and len(begun(task)) == PROCESSES
    assert {worker: len(units) for worker, units in task.ledger(12).claims().items()} == {
        "w0": IN_FLIGHT
    }
    (task.task_dir / "gate").touch()
    task.finish(worker)
    assert worker.returncode == 0, worker.stderr_text
    assert sorted(task.units_started()) == sorted(task.units_done()) == list(range(12))
    assert begun(task) == list(range(12))
    assert task.summary() == {"n": 12, "sum": sum(index * index for index in range(12))}


def test_a_sigterm_releases_the_waiting_units_and_no_process_begins_them(make_task) -> None:
    """The running units finish within the grace; the ones waiting in the queue are released
    without being begun, and the next attempt computes exactly those. The running units end
    once the worker stopped starting units (`UNTIL_STOPPED`): a process that began another
    one after the SIGTERM would show among `begun`."""
    task: HarnessTask = make_task({"n": 12}, task_type=UNTIL_STOPPED)
    worker = task.start("simrun-worker", SIMRUN_GRACE_S="20")
    wait_until(lambda: len(task.units_started()) == IN_FLIGHT, what="the units in flight")
    wait_until(lambda: len(begun(task)) == PROCESSES, what="each process to begin a unit")
    running = begun(task)
    waiting = sorted(set(task.units_started()) - set(running))
    assert len(waiting) == IN_FLIGHT - PROCESSES
    os.killpg(worker.pid, signal.SIGTERM)
    task.finish(worker)
    assert worker.returncode == 143, worker.stderr_text
    assert begun(task) == running, "no process began a waiting unit after the SIGTERM"
    assert sorted(task.units_done()) == running
    report = task.report()
    assert (report.exit_code, report.units_done) == (143, PROCESSES)
    assert report.message == f"stopped on SIGTERM; released units {describe_indices(waiting)}"
    out = task.task_dir / "out" / "squares"
    assert sorted(int(path.stem) for path in out.glob("*.json")) == running

    (task.task_dir / "gate").touch()  # the next attempt's units run without a stop
    restart = task.run("simrun-worker", SIMRUN_ATTEMPT="1")
    assert restart.returncode == 0, restart.stderr_text
    assert sorted(task.units_done(attempt=1)) == sorted(set(range(12)) - set(running))
    assert task.summary() == {"n": 12, "sum": sum(index * index for index in range(12))}
