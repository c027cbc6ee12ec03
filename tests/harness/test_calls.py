"""Calls of the pool: short units go several to a call, and what becomes of the rest of a call
when one of its units fails or the worker stops in the middle of it."""

from __future__ import annotations

import os
import threading
import traceback
import zlib

import pytest

from simrun_core.events import UnitStarted
from simrun_harness import split
from simrun_harness.env import sizing_from_env, task_from_env, timing_from_env
from simrun_harness.errors import Terminated, UnitError
from simrun_harness.memory import MemorySampler, OomKillCounter
from simrun_harness.merge import describe_indices
from simrun_harness.pool import UnitPool
from simrun_harness.report import EventLog, Tally
from simrun_harness.split import CALL_S, CALL_UNITS, units_per_call

from .helpers import PLUGINS, HarnessTask, ledger_entries, wait_until

SELECTED = "in_flight_plugin:SELECTED"
N = 300


@pytest.mark.parametrize(
    ("seconds", "units", "expected"),
    [
        (0.0, 0, 1),  # nothing timed yet: one unit a call
        (5.0, 0, 1),
        (0.0, 4, CALL_UNITS),  # units that took no measurable time
        (CALL_S * 4 / 10, 4, 10),  # units of a tenth of the call's time: ten a call
        (CALL_S * 4 / 3, 4, 3),
        (CALL_S * 4, 4, 1),  # units as long as a call
        (CALL_S * 40, 4, 1),
        (1e-6, 1000, CALL_UNITS),  # never more than CALL_UNITS
    ],
)
def test_units_per_call_take_about_call_s(seconds: float, units: int, expected: int) -> None:
    assert units_per_call(seconds, units) == expected


class Calls:
    """The units of each call the worker submitted to its pool, in order, and whether it told
    the pool to begin no more units."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[list[int]] = []
        self.stopped_starting = threading.Event()
        submit, stop_starting = UnitPool.submit, UnitPool.stop_starting

        def recorded(pool: UnitPool, indices: list[int]):  # type: ignore[no-untyped-def]
            self.made.append(list(indices))
            return submit(pool, indices)

        def stop_recorded(pool: UnitPool) -> None:
            stop_starting(pool)
            self.stopped_starting.set()

        monkeypatch.setattr(UnitPool, "submit", recorded)
        monkeypatch.setattr(UnitPool, "stop_starting", stop_recorded)

    def of(self, index: int) -> list[int]:
        """The call a unit was sent in."""
        return next(call for call in self.made if index in call)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """The calls of the worker run in this process (its pool's types found on `sys.path`)."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    return Calls(monkeypatch)


def run_in_process(task: HarnessTask, stop: threading.Event) -> None:
    """Run the coordinator `w0` of a task in this process, writing its log; no merge."""
    loaded = task_from_env(task.env, "split")
    log = EventLog(task.log_path())
    try:
        split.run_worker(
            loaded,
            "w0",
            log=log,
            tally=Tally(MemorySampler(), OomKillCounter()),
            sizing=sizing_from_env(task.env, loaded.task_type),
            timing=timing_from_env(task.env),
            stop=stop,
            coordinator=True,
        )
    finally:
        log.close()


def claimed_at(position: int, n: int = N, worker: str = "w0") -> int:
    """The unit a fresh ledger gives `worker` at that position of its claims (its cursor
    starts at an offset of its own, `Ledger.claim`)."""
    return (zlib.crc32(worker.encode()) % n + position) % n


def begun(task: HarnessTask) -> set[int]:
    """The units a process of the pool began (see the plugin)."""
    directory = task.task_dir / "begun"
    return {int(name) for name in os.listdir(directory)} if directory.exists() else set()


def test_short_units_share_calls_and_each_is_done_once(make_task, calls: Calls) -> None:
    task: HarnessTask = make_task({"n": N}, task_type=SELECTED)
    run_in_process(task, threading.Event())
    in_flight = split.IN_FLIGHT_PER_PROCESS * min(2, len(os.sched_getaffinity(0)))
    assert calls.made[:in_flight] == [[claimed_at(p)] for p in range(in_flight)]
    sizes = [len(call) for call in calls.made]
    assert max(sizes) > 1, f"timed zero-work units share calls: {sizes}"
    units = [index for call in calls.made for index in call]
    assert sorted(units) == list(range(N)), "every unit sent once"
    assert sorted(task.units_done()) == list(range(N))
    started = [e.index for e in task.events() if isinstance(e, UnitStarted)]
    assert started == units, "each unit's claim is recorded, in the order of the calls"
    assert set(ledger_entries(task.task_dir / "ledger", "done")) == {str(i) for i in range(N)}
    assert ledger_entries(task.task_dir / "ledger", "release") == {}


def test_a_slow_setup_does_not_keep_short_units_one_to_a_call(make_task, calls: Calls) -> None:
    """The first unit of each process carries its setup's seconds; the size of the calls is
    taken from the units' own."""
    task: HarnessTask = make_task({"n": N, "setup_s": 0.3}, task_type=SELECTED)
    run_in_process(task, threading.Event())
    in_flight = split.IN_FLIGHT_PER_PROCESS * min(2, len(os.sched_getaffinity(0)))
    sizes = [len(call) for call in calls.made]
    assert sizes[:in_flight] == [1] * in_flight
    assert sizes[in_flight] > 1, f"the call after the first results: {sizes}"
    assert sorted(task.units_done()) == list(range(N))


CALL = 10
"""The units of every call in the tests of a call's end (`ten_a_call`), so the units of the call
a unit is sent in are known: the claims at positions 40..49 are one call."""


@pytest.fixture
def ten_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(split, "units_per_call", lambda seconds, units: CALL)


@pytest.mark.usefixtures("ten_a_call")
def test_a_unit_failing_in_a_call_ends_the_rest_of_it_unbegun(make_task, calls: Calls) -> None:
    """The units of the call before the failing one are done; it and those after it are
    released, and no process began those after it."""
    failing = claimed_at(45)
    task: HarnessTask = make_task({"n": N, "failing": [failing]}, task_type=SELECTED)
    message = f"unit {failing} failed: ValueError: unit {failing} fails"
    with pytest.raises(UnitError, match=message) as raised:
        run_in_process(task, threading.Event())
    trace = "".join(traceback.format_exception(raised.value.cause))
    assert "in compute_selected" in trace, "the traceback of the unit in its process"
    call = calls.of(failing)
    assert call == [claimed_at(position) for position in range(40, 50)]
    before, after = call[: call.index(failing)], call[call.index(failing) + 1 :]
    done = set(task.units_done())
    assert set(before) <= done
    assert failing not in done and not done & set(after)
    assert not begun(task) & set(after), "no process began the rest of the call"
    releases = ledger_entries(task.task_dir / "ledger", "release")
    assert {f"{index}.0" for index in [failing, *after]} <= set(releases)
    assert task.ledger(N).claims() == {}, "every unit not done is released"
    assert set(task.units_started()) == done | {int(name.split(".")[0]) for name in releases}


@pytest.mark.usefixtures("ten_a_call")
def test_a_stop_in_the_middle_of_a_call_releases_the_rest_of_it(make_task, calls: Calls) -> None:
    """The running unit ends within the grace; the rest of its call comes back not begun
    and is released with every other unit not begun, which the message names."""
    gated = claimed_at(45)
    task: HarnessTask = make_task({"n": N, "gated": [gated]}, task_type=SELECTED)
    stop = threading.Event()
    ended: list[BaseException] = []

    def work() -> None:
        try:
            run_in_process(task, stop)
        except BaseException as error:
            ended.append(error)

    worker = threading.Thread(target=work)
    worker.start()
    wait_until(lambda: gated in begun(task), what="the gated unit to begin")
    stop.set()  # what the SIGTERM handler does
    assert calls.stopped_starting.wait(timeout=10)
    (task.task_dir / "gate").touch()
    worker.join(timeout=30)
    assert not worker.is_alive()
    [error] = ended
    assert isinstance(error, Terminated)
    call = calls.of(gated)
    assert call == [claimed_at(position) for position in range(40, 50)]
    after = call[call.index(gated) + 1 :]
    done = set(task.units_done())
    assert gated in done
    released = sorted(set(task.units_started()) - done)
    assert set(after) <= set(released)
    assert not begun(task) & set(released), "no released unit was begun"
    assert str(error) == f"stopped on SIGTERM; released units {describe_indices(released)}"
    releases = ledger_entries(task.task_dir / "ledger", "release")
    assert releases == {f"{index}.0": "w0" for index in released}
