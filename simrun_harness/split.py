"""The work of `simrun-worker`: claim units of the ledger and compute them in a pool.

`run_worker` keeps `2 * processes` calls of the pool in flight: each process computes one
and has the next one waiting (`IN_FLIGHT_PER_PROCESS`), so it never waits while the worker
records completions and claims. A call is one unit until units were timed, then as many units
as take about `CALL_S` (at most `CALL_UNITS`, `units_per_call`): short units share the round
trip of a call, long ones keep one to a call and spread over the processes. A unit is in
flight from its claim, which its `UnitStarted` event marks, to its completion or release.

A completed unit's event is written first and then its `done/<index>` in the ledger,
group-commit style: the completed units (and the `UnitStarted` events of the claims since) pile
up while the worker goes on collecting and claiming, and one write records them all as soon as
no unit finished within `QUIET_S` (the worker would wait), `BATCH_UNITS` are piled up, or the
oldest waited `BATCH_S`; and always before the worker returns or raises. A lone unit is so
written within `QUIET_S`, and a run of many short units is neither a line nor a write per unit.
An extra worker returns when nothing is pending; the coordinator returns once the ledger is
complete, releasing (every `poll_s`) the claims of workers whose heartbeat is older than
`stale_s` and computing them, and then merges when asked to. The log of the process says what the
worker does: its units and processes at the start, the units it computed and their seconds at
the end (and the merge its seconds), so `simrun logs` of a task is never empty.

On SIGTERM it stops claiming and releases at once the units the pool has not begun (they wait
for no grace), waits up to `grace_s` for the running units and releases the rest
(`Terminated`, naming every unit released). A unit that raises is released and ends the worker
(`UnitError`); a process of the pool that dies ends it too (`Killed`). The units in flight at
such an end, begun or not, are released (after the pool is killed, so none runs twice), so the
coordinator or the retry computes them.

The memory is sampled every `memory_sample_s`. Where the limit is real
(`SIMRUN_MEMORY_ENFORCED=1`) but no cgroup of its own enforces it
(`SIMRUN_MEMORY_SOURCE=process`), with `SIMRUN_MEMORY_PER_WORKER_GB` set, a process of the
pool above that memory is killed by the sampler (`MemoryGuard`) and counted as a kill for
memory: the pool breaks and the worker exits 137 with `oom_kills` in its report, as the kernel
would make it in a pod. Locally (not enforced) the memory only sizes the pool.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures.process import BrokenProcessPool

from simrun_core.events import Event, UnitStarted, units_done_event
from simrun_harness.env import GIB, LoadedTask, Sizing, Timing
from simrun_harness.errors import Killed, Terminated, UnitError
from simrun_harness.ledger import Ledger
from simrun_harness.memory import MemoryGuard
from simrun_harness.merge import describe_indices, ledger_of, run_merge
from simrun_harness.periodic import Periodic
from simrun_harness.pool import CallResult, UnitPool
from simrun_harness.report import EventLog, Tally, say

TICK_S = 0.1
IN_FLIGHT_PER_PROCESS = 2
BATCH_UNITS = 1000
BATCH_S = 0.1
QUIET_S = 0.002
"""How long the worker waits for a unit to finish before it writes what piled up: units that
finish within it (short ones, a pool kept busy) are written together."""
CALL_S = 0.01
"""About how long a call of the pool computes: its round trip costs ~0.3 ms, a few percent of
it, and the processes end a task at most about that much apart."""
CALL_UNITS = 64
FIRST_COMPLETE_CHECK_S = 0.02
"""The first wait of a coordinator with nothing left to claim before it looks whether the others
completed the ledger; it doubles up to `Timing.poll_s` while they have not (a task of short
units merges within tens of milliseconds of its last unit, a long wait costs few listings)."""


def units_per_call(seconds: float, units: int) -> int:
    """The units of the next call of the pool, from the `seconds` the `units` timed so far
    took: one until one was timed, then as many as take `CALL_S`, within 1..`CALL_UNITS`."""
    if units == 0:
        return 1
    if seconds <= 0:
        return CALL_UNITS
    return max(1, min(CALL_UNITS, int(CALL_S * units / seconds)))


def run_worker(
    task: LoadedTask,
    worker: str,
    *,
    log: EventLog,
    tally: Tally,
    sizing: Sizing,
    timing: Timing,
    stop: threading.Event,
    coordinator: bool = False,
    merge: bool = False,
) -> None:
    """Compute units of the task's ledger until none is pending (see the module).

    Updates `tally` as units complete; the caller writes the report. Raises UnitError,
    Killed, Terminated, or MergeError from the merge.
    """
    ledger = ledger_of(task)
    ledger.heartbeat(worker)
    ledger.release_all(worker)
    if stop.is_set():
        raise Terminated("stopped on SIGTERM before the first claim")
    # No more processes than units: each costs a fork and its setup.
    tally.processes = max(1, min(sizing.processes, ledger.n_units))
    say(worker, _starting(task, coordinator, ledger.n_units, tally.processes, sizing))
    pool = UnitPool(task.task_type, task.settings, task.paths, tally.processes)
    pool.start()
    heartbeats = Periodic(timing.heartbeat_s, lambda: ledger.heartbeat(worker), "heartbeat")
    samples = Periodic(timing.memory_sample_s, _memory_watch(pool, sizing, tally), "memory")
    tally.work_begins()
    with contextlib.ExitStack() as threads:

        def first_claims_made() -> None:
            # The threads start once the first units are in the pool: a thread's start and
            # its first heartbeat or sample would hold up those claims.
            threads.enter_context(heartbeats)
            threads.enter_context(samples)

        units = _UnitLoop(task, worker, ledger, pool, log, tally, stop)
        began = time.monotonic()
        try:
            units.run(coordinator, timing, first_claims_made)
        except BaseException:
            units.abandon()
            raise
        pool.close()
        say(worker, _computed(tally, ledger.n_units, time.monotonic() - began))
        if coordinator and merge:
            run_merge(task, ledger, worker, log, stop)


def _starting(
    task: LoadedTask, coordinator: bool, n_units: int, processes: int, sizing: Sizing
) -> str:
    """The first line of the log of a worker: its role, its units and its pool."""
    role = "the coordinator" if coordinator else "a worker"
    if sizing.memory_limit_bytes is None:
        memory = "no memory limit"
    else:
        limit_gb = sizing.memory_limit_bytes / GIB
        memory = f"{limit_gb:.3g} GiB of memory, {sizing.per_worker_gb:g} GiB per process"
    return (
        f"{role} of task {task.paths.task_dir.name!r} ({task.task_type.name}): {n_units} units, "
        f"{processes} processes ({sizing.cores} cores, {memory})"
    )


def _computed(tally: Tally, n_units: int, seconds: float) -> str:
    """The line of the log of a worker whose units are done: how many it computed, how long."""
    return (
        f"computed {tally.units_done} of the {n_units} units in {seconds:.2f} s "
        f"({tally.unit_seconds:.2f} s of units in {tally.processes} processes)"
    )


def _memory_watch(pool: UnitPool, sizing: Sizing, tally: Tally) -> Callable[[], None]:
    """The action of the memory sampler: the peak, and the limit per process of the pool."""
    if sizing.process_limit_bytes is None:
        return tally.memory.sample
    pids = pool.pids()  # forked all at once by `start`, never replaced
    guard = MemoryGuard(
        sizing.process_limit_bytes,
        lambda: pids,
        tally.oom,
        what="a process of the pool",
        limit_name=f"SIMRUN_MEMORY_PER_WORKER_GB={sizing.per_worker_gb:g}",
    )

    def watch() -> None:
        tally.memory.sample()
        guard.check()

    return watch


class _UnitLoop:
    """The claims, submissions and completions of one worker."""

    def __init__(
        self,
        task: LoadedTask,
        worker: str,
        ledger: Ledger,
        pool: UnitPool,
        log: EventLog,
        tally: Tally,
        stop: threading.Event,
    ) -> None:
        self.task_id = task.paths.task_dir.name
        self.worker = worker
        self.ledger = ledger
        self.pool = pool
        self.log = log
        self.tally = tally
        self.stop = stop
        self.in_flight: dict[Future[CallResult], list[int]] = {}  # the units of each call
        self.limit = IN_FLIGHT_PER_PROCESS * pool.processes
        self.timed_seconds = 0.0  # the seconds of the units computed so far (without the
        # setup of a process: a slow setup would keep short units one to a call), their number
        self.timed_units = 0
        self.not_started: list[int] = []  # released after the SIGTERM, never begun
        self.completed: list[tuple[int, float]] = []  # computed, no event yet, not yet done
        self.started: list[UnitStarted] = []  # the claims since the last write
        self.completed_since = 0.0  # time.monotonic() of the oldest of them

    def run(self, coordinator: bool, timing: Timing, first_claims_made: Callable[[], None]) -> None:
        """Claim and compute until nothing is pending (an extra worker) or the ledger is
        complete (the coordinator); after a SIGTERM, drain within the grace and raise. The
        units completed are written to the log before it returns or raises.
        `first_claims_made` is called once, after the first claims went to the pool (or none
        was to be made)."""
        try:
            self._fill()
            first_claims_made()
            self._run(coordinator, timing)
        finally:
            self._write_completed()

    def _run(self, coordinator: bool, timing: Timing) -> None:
        next_stale_check = time.monotonic() + timing.poll_s
        complete_wait = FIRST_COMPLETE_CHECK_S
        while not self.stop.is_set():
            self._fill()
            if coordinator and time.monotonic() >= next_stale_check:
                next_stale_check = time.monotonic() + timing.poll_s
                if self.ledger.release_stale(timing.stale_s, self.worker):
                    continue
            if not self.in_flight:
                self._write_completed()
                if self.stop.is_set():
                    break
                if coordinator:
                    if self.ledger.complete_ledger():
                        return
                    # a SIGTERM sets the event: no delay
                    self.stop.wait(min(complete_wait, timing.poll_s))
                    complete_wait *= 2
                    continue
                if self.ledger.refresh():
                    continue
                return
            complete_wait = FIRST_COMPLETE_CHECK_S
            self._collect(TICK_S)
        self._drain(timing.grace_s)

    def _fill(self) -> None:
        while len(self.in_flight) < self.limit and not self.stop.is_set():
            wanted = units_per_call(self.timed_seconds, self.timed_units)
            indices: list[int] = []
            while len(indices) < wanted:
                index = self.ledger.claim(self.worker)
                if index is None:
                    break
                indices.append(index)
                self.started.append(UnitStarted(task=self.task_id, index=index, worker=self.worker))
            if indices:
                self.in_flight[self.pool.submit(indices)] = indices
            if len(indices) < wanted:
                return

    def _in_flight_units(self) -> list[int]:
        return sorted(index for indices in self.in_flight.values() for index in indices)

    def _collect(self, timeout: float) -> None:
        """Complete the units that finish within `timeout`; raise on the first failure.

        The completed units are written first when the worker would wait for one."""
        finished, _ = wait(
            self.in_flight, timeout=min(QUIET_S, timeout), return_when=FIRST_COMPLETED
        )
        if not finished:
            self._write_completed()
            finished, _ = wait(self.in_flight, timeout=timeout, return_when=FIRST_COMPLETED)
        failure: UnitError | None = None
        for future in sorted(finished, key=self.in_flight.__getitem__):
            indices = self.in_flight.pop(future)
            try:
                call = future.result()
            except BrokenProcessPool:
                self.in_flight[future] = indices
                units = describe_indices(self._in_flight_units())
                cause = self.tally.oom.last_kill()
                if cause is None:
                    raise Killed(
                        f"a process of the pool died (killed?) with units {units} in flight"
                    ) from None
                raise Killed(f"{cause}; units {units} were in flight") from None
            except Exception as error:  # the call's answer could not come back
                for index in indices:
                    self.ledger.release(index, self.worker)
                failure = failure or UnitError(indices[0], error)
                continue
            self._completed(call)
            if call.failure is not None:
                self.ledger.release(call.failure.index, self.worker)
                failure = failure or UnitError(call.failure.index, call.failure.cause())
            for index in call.not_begun:
                self.ledger.release(index, self.worker)
                self.not_started.append(index)
        if failure is not None:
            raise failure
        if len(self.completed) >= BATCH_UNITS or time.monotonic() - self.completed_since >= BATCH_S:
            self._write_completed()

    def _completed(self, call: CallResult) -> None:
        """Take up the units a call computed, to be written."""
        if call.results and not self.completed:
            self.completed_since = time.monotonic()
        for result in call.results:
            self.completed.append((result.index, round(result.seconds, 6)))
            self.tally.unit_done(result.seconds, result.cpu_seconds)
            self.timed_seconds += result.seconds - result.setup_seconds
        self.timed_units += len(call.results)

    def _write_completed(self) -> None:
        """Write the claims and the units completed since the last write, the units as one
        event, in one write (nothing when there are none); then mark those units done in the
        ledger. In that order: a worker killed in between leaves units done in its log and
        still claimed in the ledger, computed again by whoever takes them up (a unit done twice
        counts once), never units done in the ledger that no event records."""
        events: list[Event] = list(self.started)
        if self.completed:
            events.append(units_done_event(self.task_id, self.worker, self.completed))
        if events:
            self.log.append_all(events)
        for index, _ in self.completed:
            self.ledger.complete(index, self.worker)
        self.started, self.completed = [], []

    def _drain(self, grace_s: float) -> None:
        """After SIGTERM: release the units not begun, let the running ones finish within
        `grace_s`, then give up (`abandon` releases what is left)."""
        self.pool.stop_starting()
        deadline = time.monotonic() + grace_s
        while self.in_flight and time.monotonic() < deadline:
            self._collect(min(TICK_S, max(0.0, deadline - time.monotonic())))
        released = sorted([*self.not_started, *self._in_flight_units()])
        detail = f"; released units {describe_indices(released)}" if released else ""
        raise Terminated(f"stopped on SIGTERM{detail}")

    def abandon(self) -> None:
        """Kill the pool and release the units still in flight."""
        self.pool.kill()
        for index in self._in_flight_units():
            self.ledger.release(index, self.worker)
        self.in_flight.clear()
