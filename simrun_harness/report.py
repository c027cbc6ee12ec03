"""The event log of a harness process and its final `WorkerReport`.

Each process writes one log, `<task_dir>/events/<worker>.<attempt>.jsonl`, append-only and
single writer, which the run's actor tails by byte offset. Its last event is exactly one
`WorkerReport`, written whatever the outcome (`run_reported`).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from simrun_core import exits
from simrun_core.clock import now
from simrun_core.events import Event, WorkerReport, stamped
from simrun_core.gpus import visible_devices
from simrun_core.store import LogWriter, iter_log
from simrun_harness.env import Identity
from simrun_harness.errors import HarnessError, Killed, UnitError
from simrun_harness.memory import CpuThrottle, MemorySampler, OomKillCounter


class EventLog:
    """The event log of one worker attempt: numbers events (`seq` from 1, no gaps), stamps
    their time and appends.

    Reopening an existing log (the same worker and attempt run again) continues its numbering.
    Not fsynced: the actor tolerates a torn last line, and the ledger holds the truth of units.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer = LogWriter(path, fsync=False)
        self._seq = _last_seq(path)
        self._lock = threading.Lock()

    def append(self, event: Event) -> Event:
        """Number the event, append it as one line and return it."""
        return self.append_all([event])[0]

    def append_all(self, events: list[Event]) -> list[Event]:
        """Number the events and stamp the time now, append them as lines in one write and
        return them."""
        with self._lock:
            numbered = stamped(events, self._seq, now())
            self._writer.append(*numbered)
            self._seq += len(numbered)
        return numbered

    def close(self) -> None:
        """Close the log."""
        self._writer.close()


def _last_seq(path: Path) -> int:
    last = 0
    for _, event in iter_log(path):
        if event is not None:
            last = event.seq
    return last


def say(worker: str, text: str) -> None:
    """Write a line of what the harness does into the log of its process (stderr), which
    `simrun logs` shows: `simrun harness: <worker>: <text>`."""
    print(f"simrun harness: {worker}: {text}", file=sys.stderr, flush=True)


def cpu_seconds(children: bool) -> float:
    """The user and system seconds of this process, and of its reaped children if asked."""
    times = os.times()
    own = times.user + times.system
    return own + (times.children_user + times.children_system if children else 0.0)


@dataclasses.dataclass
class Tally:
    """What a harness process did so far, the facts of its report.

    `started` is when the process started (seconds since the epoch, `signals.process_started`);
    its seconds and its preparation (until `work_begins`) count from then. `unit_cpu_seconds`
    are measured in the pool processes, so a worker's CPU is its own plus these; `simrun-exec`
    counts its reaped child instead (`children_cpu`).
    """

    memory: MemorySampler
    oom: OomKillCounter
    throttle: CpuThrottle = dataclasses.field(default_factory=CpuThrottle)
    started: float = dataclasses.field(default_factory=time.time)
    processes: int = 1
    units_done: int = 0
    unit_seconds: float = 0.0
    unit_cpu_seconds: float = 0.0
    memory_limit_bytes: int | None = None
    per_worker_gb: float = 0.0
    children_cpu: bool = False
    work_started: float | None = None

    def __post_init__(self) -> None:
        self._origin = time.monotonic() - max(0.0, time.time() - self.started)

    def work_begins(self) -> None:
        """Mark the start of the work (the first claim, the merge, the command); once."""
        if self.work_started is None:
            self.work_started = time.monotonic()

    def seconds(self) -> float:
        """The seconds since the process started."""
        return time.monotonic() - self._origin

    def prepare_seconds(self) -> float:
        """The seconds from the start of the process to the start of its work; all of them
        so far when the work never began (a configuration error, a stop while preparing)."""
        end = self.work_started if self.work_started is not None else time.monotonic()
        return max(0.0, end - self._origin)

    def unit_done(self, seconds: float, cpu: float) -> None:
        """Count a unit this process completed, with its seconds and CPU seconds."""
        self.units_done += 1
        self.unit_seconds += seconds
        self.unit_cpu_seconds += cpu


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a harness run ended: exit code, whether it failed, a message and a traceback."""

    exit_code: int
    failed: bool
    message: str | None
    traceback: str | None = None


def outcome_of(error: BaseException | None) -> Outcome:
    """The outcome of a run that raised `error` (None: success)."""
    if error is None:
        return Outcome(exits.DONE, False, None)
    if isinstance(error, BrokenProcessPool):
        error = Killed(f"a process of the pool died: {error}")
    if isinstance(error, HarnessError):
        cause = error.cause if isinstance(error, UnitError) else error.__cause__
        trace = "".join(traceback.format_exception(cause)) if cause is not None else None
        return Outcome(error.exit_code, error.failed, str(error), trace)
    trace = "".join(traceback.format_exception(error))
    if disk_full(error):
        return Outcome(exits.DISK_FULL, True, f"the disk of the store is full: {error}", trace)
    message = f"harness error: {type(error).__name__}: {error}"
    return Outcome(exits.HARNESS_BUG, True, message, trace)


def disk_full(error: BaseException) -> bool:
    """Whether an error is a full disk (or a full quota): ENOSPC, EDQUOT."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def final_report(identity: Identity, tally: Tally, outcome: Outcome) -> WorkerReport:
    """The `WorkerReport` of a harness run from its tally and outcome."""
    tally.memory.sample()
    return WorkerReport(
        task=identity.task,
        worker=identity.worker,
        attempt=identity.attempt,
        node=identity.node,
        processes=tally.processes,
        units_done=tally.units_done,
        seconds=round(tally.seconds(), 6),
        unit_seconds=round(tally.unit_seconds, 6),
        cpu_seconds=round(cpu_seconds(tally.children_cpu) + tally.unit_cpu_seconds, 6),
        peak_memory_bytes=tally.memory.peak,
        memory_limit_bytes=tally.memory_limit_bytes,
        per_worker_gb=tally.per_worker_gb,
        oom_kills=tally.oom.kills(),
        failed=outcome.failed,
        exit_code=outcome.exit_code,
        message=outcome.message,
        started=round(tally.started, 6),
        prepare_seconds=round(tally.prepare_seconds(), 6),
        throttled_seconds=tally.throttle.seconds(),
        gpus=visible_devices(os.environ),
    )


def run_reported(
    identity: Identity, log: EventLog, tally: Tally, work: Callable[[], None]
) -> Outcome:
    """Run `work`, then append the one `WorkerReport` whatever happened; its outcome.

    The message (and the traceback of a failed unit, merge or harness) goes to stderr. When the
    report cannot be appended (an OSError: a full disk, an I/O error) the outcome is a failure
    whose message names the error: exit code `DISK_FULL` for a full disk (the service has no
    report to read, the exit code tells it), else 1 unless the work failed already.
    """
    error: BaseException | None = None
    try:
        work()
    except (Exception, KeyboardInterrupt) as caught:
        error = caught
    outcome = outcome_of(error)
    try:
        log.append(final_report(identity, tally, outcome))
    except OSError as lost:
        before = f"; {outcome.message}" if outcome.message else ""
        code = outcome.exit_code or exits.HARNESS_BUG
        if disk_full(lost) and code == exits.HARNESS_BUG:
            code = exits.DISK_FULL
        outcome = dataclasses.replace(
            outcome,
            exit_code=code,
            failed=True,
            message=f"the event log cannot be written, its report is lost: {lost}{before}",
        )
    if outcome.traceback:
        print(outcome.traceback, file=sys.stderr, end="")
    if outcome.message:
        say(identity.worker, outcome.message)
    return outcome
