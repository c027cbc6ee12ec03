"""The state of a run, folded from its events: a pure function over any prefix of its log."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import msgspec

from simrun_core import events as ev
from simrun_core import exits
from simrun_core.planner import TaskPlan
from simrun_core.provenance import SourceProvenance
from simrun_core.resources import ResolvedResources
from simrun_core.snapshot_types import ProbedType
from simrun_core.states import RunState, TaskState
from simrun_core.unit_flags import UnitFlags
from simrun_core.workflow import Priority, Workflow


class ProgressLine(msgspec.Struct, kw_only=True):
    """A unit done, as its `unit-done` event has it: the unit, the worker that computed it,
    its seconds and when it was recorded (the line of a progress file, spec 25)."""

    index: int
    worker: str
    seconds: float
    time: datetime


class TaskProgress(msgspec.Struct):
    """The units of a split task: how many, how many done, and when the first and last were;
    `first` and `last` the first and the last unit done (None in a cache written before)."""

    units: int | None = None
    done: int = 0
    first_done: datetime | None = None
    last_done: datetime | None = None
    first: ProgressLine | None = None
    last: ProgressLine | None = None


class PodRecord(msgspec.Struct, omit_defaults=True):
    """The last attempt of a pod (a worker) of a task."""

    worker: str
    attempt: int = 0
    state: str = "running"
    exit_code: int | None = None
    node: str | None = None
    oom: bool = False
    peak_memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    processes: int | None = None
    units_done: int = 0
    gpus: list[str] | None = None


class RunRecord(msgspec.Struct, kw_only=True):
    """The record of a run, as folded from its events up to `seq`.

    `pods` and `oom_kills` are keyed by task, then worker: two tasks have workers of the same
    id (every split task's coordinator is `w0`)."""

    id: str
    seq: int = 0
    state: RunState = RunState.SUBMITTING
    workflow: Workflow
    submitted_by: str
    owner: str
    agent: str | None = None
    priority: Priority = Priority.STANDARD
    group: str | None = None
    sources: list[SourceProvenance] = msgspec.field(default_factory=list)
    plans: dict[str, TaskPlan] = msgspec.field(default_factory=dict)
    resources: dict[str, ResolvedResources] = msgspec.field(default_factory=dict)
    tasks: dict[str, TaskState] = msgspec.field(default_factory=dict)
    task_messages: dict[str, str] = msgspec.field(default_factory=dict)
    progress: dict[str, TaskProgress] = msgspec.field(default_factory=dict)
    pods: dict[str, dict[str, PodRecord]] = msgspec.field(default_factory=dict)
    oom_kills: dict[str, dict[str, list[int]]] = msgspec.field(default_factory=dict)
    merged: list[str] = msgspec.field(default_factory=list)
    logs_kept: list[str] = msgspec.field(default_factory=list)
    backend: str = "local"
    backend_name: str | None = None
    writer: ev.Writer = ev.Writer.SERVICE
    """Who writes the run's log (`ev.Submitted.writer`): a service follows only the runs it
    writes."""
    image: str | None = None
    built: datetime | None = None
    reserve: str | None = None
    reserved: str | None = None
    """The node the run holds now: reserved (`node-reserved`) and not yet released."""
    local_commands: str | None = None
    snapshot_types: dict[str, ProbedType] = msgspec.field(default_factory=dict)
    """The task types of the run's snapshots (`ev.Submitted.snapshot_types`)."""
    cancel_requested: str | None = None
    created: datetime
    started: datetime | None = None
    finished: datetime | None = None
    message: str | None = None
    warnings: list[str] = msgspec.field(default_factory=list)
    """What is wrong with the log that the fold passed over: events after the run's end."""

    @property
    def ended(self) -> bool:
        """Whether the run is over."""
        return self.state.ended


DAMAGED_LOG = "the log is damaged"
"""How the warning of events after a run's end begins."""


class FoldError(ValueError):
    """A log that does not fold: no `submitted` first, or a gap in `seq`."""


class RunFold:
    """Folds events one at a time into a `RunRecord`; `record` is the state so far."""

    def __init__(self) -> None:
        self.record: RunRecord | None = None
        self._done: dict[str, UnitFlags] = {}
        """The units of each task with a `unit-done` or `units-done` event, a flag per unit."""
        self.reports: dict[str, list[ev.WorkerReport]] = {}
        """The reports of each task's pods, in the order of the log (what resources learn)."""
        self.reported: dict[tuple[str, str, int], ev.WorkerReport] = {}
        """The report of each pod attempt, by (task, worker, attempt)."""
        self.stops: dict[tuple[str, str], int] = {}
        """The stops from outside of each worker of a task (a signal's exit code without
        evidence of a kill for memory), over all its attempts: what limits its retries."""
        self._end: ev.Event | None = None
        """The terminal event of the run, the first of the log: it is final."""
        self._past_end: ev.Event | None = None
        """The first event after the end that no ended run appends, if any."""
        self._past_end_count = 0

    def apply(self, event: ev.Event) -> None:
        """Apply one event; FoldError if it does not follow the ones before."""
        self.apply_all((event,))

    def apply_all(self, events: Iterable[ev.Event]) -> None:
        """Apply events in order; FoldError at the first that does not follow the ones before
        (those before it are applied).

        This is the fold's hot path: the numbering of the events is checked for all of them at
        once, a unit event is folded in the loop itself (most events of a big run's log are),
        and the `last` progress line of a task is made once, at the end.
        """
        batch = events if isinstance(events, list) else list(events)
        first = 0
        if self.record is None:
            if not batch:
                return
            if not isinstance(batch[0], ev.Submitted):
                raise FoldError(f"event {batch[0].seq} comes before 'submitted'")
            self.record = _submitted(batch[0])
            first = 1
        seq = self.record.seq
        numbers = [event.seq for event in batch[first:]]
        expected = range(seq + 1, seq + 1 + len(numbers))
        if numbers != list(expected):
            good = next(n for n, (a, b) in enumerate(zip(numbers, expected, strict=True)) if a != b)
            self._fold(batch[first : first + good])
            raise FoldError(f"event {numbers[good]} follows event {seq + good}: a gap in the log")
        self._fold(batch[first:] if first else batch)

    def _fold(self, events: list[ev.Event]) -> None:
        """Apply events numbered in order after the record's (see `apply_all`).

        A run of `unit-done` events of one task is counted in local variables and written to
        the task's progress when the task changes or the events end (`_TaskUnits.flush`).
        """
        record = self.record
        if record is None or not events:
            return
        if self._end is not None:
            self._after_end(events)
            return
        handlers = _HANDLERS
        unit_done, units_done = ev.UnitDone, ev.UnitsDone
        current = _TaskUnits(self, None)  # the task of the unit events just before
        units, flags, count, last, no_first = 0, current.done.flags, 0, None, False
        try:
            for event in events:
                if type(event) is unit_done:
                    if event.task != current.task:
                        current.flush(count, last)
                        current = _TaskUnits(self, event.task)
                        units, flags, count, last = current.done.units, current.done.flags, 0, None
                        no_first = current.progress.first is None
                    index = event.index
                    if 0 <= index < units:  # the fold's hottest lines
                        if flags[index]:
                            continue
                        flags[index] = 1
                    elif not current.done.add(index):
                        continue
                    count += 1
                    last = event
                    if no_first:
                        current.first(event)
                        no_first = False
                    continue
                if type(event) is units_done:
                    if event.task != current.task:
                        current.flush(count, last)
                        current = _TaskUnits(self, event.task)
                        units, flags, count, last = current.done.units, current.done.flags, 0, None
                    current.flush(count, last)
                    count, last = 0, None
                    _fold_units(current.done, current.progress, event)
                    no_first = current.progress.first is None
                    continue
                record.seq = event.seq
                handler = handlers.get(type(event))
                if handler is not None:
                    handler(self, record, event)
                    if type(event) in _TERMINAL:
                        self._end = event
                        break
        finally:
            current.flush(count, last)
            record.seq = events[-1].seq
        if self._end is not None and events[-1] is not self._end:
            self._after_end(events[next(n for n, e in enumerate(events) if e is self._end) + 1 :])

    def _after_end(self, events: list[ev.Event]) -> None:
        """Events after the run's end: the release (or a late reservation) of its node is
        applied; any other event was never written by the run's actor, which appends nothing
        else once the run ended. Such events change nothing; the record warns that its log is
        damaged. Events of types this version does not know are skipped, as everywhere."""
        record = self.record
        assert record is not None and self._end is not None
        for event in events:
            if type(event) in _AFTER_END:
                _HANDLERS[type(event)](self, record, event)
            elif not isinstance(event, ev.UnknownEvent):
                if self._past_end is None:
                    self._past_end = event
                self._past_end_count += 1
        record.seq = events[-1].seq
        first, count = self._past_end, self._past_end_count
        if first is not None:
            warning = (
                f"{DAMAGED_LOG}: the run ended at event {self._end.seq} ({_tag(self._end)!r}) "
                f"and {count} event{'' if count == 1 else 's'} follow{'s' if count == 1 else ''}, "
                f"the first at event {first.seq} ({_tag(first)!r}); they are ignored"
            )
            kept = [text for text in record.warnings if not text.startswith(DAMAGED_LOG)]
            record.warnings = [*kept, warning]

    def unit_is_done(self, task: str, index: int) -> bool:
        """Whether a unit of a task has a `unit-done` (or `units-done`) event already."""
        done = self._done.get(task)
        return done is not None and index in done

    def _flags(self, task: str) -> UnitFlags:
        """The units done of a task, sized by its unit count when the plan has one."""
        done = self._done.get(task)
        if done is None:
            progress = self.record.progress.get(task) if self.record is not None else None
            done = self._done[task] = UnitFlags(progress.units if progress is not None else None)
        return done


class _TaskUnits:
    """The units done and the progress of one task, while the fold counts a run of its unit
    events in local variables; `flush` writes what it counted."""

    __slots__ = ("done", "progress", "task")

    def __init__(self, folder: RunFold, task: str | None) -> None:
        self.task = task
        if task is None or folder.record is None:
            self.done, self.progress = _NO_UNITS, _NO_PROGRESS
        else:
            self.done = folder._flags(task)
            self.progress = folder.record.progress.setdefault(task, TaskProgress())

    def first(self, event: ev.UnitDone) -> None:
        """`event` is the task's first unit done."""
        self.progress.first_done = event.time
        self.progress.first = _line(event)

    def flush(self, count: int, last: ev.UnitDone | None) -> None:
        """Count `count` more units done, `last` the last of them (None for none)."""
        if last is None:
            return
        progress = self.progress
        progress.done += count
        progress.last_done = last.time
        progress.last = _line(last)


_NO_UNITS = UnitFlags(0)
_NO_PROGRESS = TaskProgress()


def fold(events: Iterable[ev.Event | None]) -> RunRecord:
    """The record of a run from its events (None entries, unknown types, are skipped)."""
    folder = RunFold()
    folder.apply_all(event for event in events if event is not None)
    if folder.record is None:
        raise FoldError("the log has no 'submitted' event")
    return folder.record


def _submitted(event: ev.Submitted) -> RunRecord:
    tasks = {task.id: TaskState.WAITING for task in event.workflow.tasks}
    progress = {
        task_id: TaskProgress(units=plan.units)
        for task_id, plan in event.plans.items()
        if plan.units is not None
    }
    return RunRecord(
        id=event.run,
        seq=event.seq,
        workflow=event.workflow,
        submitted_by=event.submitted_by,
        owner=event.owner,
        agent=event.agent,
        priority=event.priority,
        group=event.group,
        sources=event.sources,
        plans=event.plans,
        resources=event.resources,
        tasks=tasks,
        progress=progress,
        backend=event.backend,
        writer=event.writer,
        reserve=event.reserve or event.workflow.reserve,
        local_commands=event.local_commands,
        snapshot_types=event.snapshot_types,
        created=event.time,
    )


def _environment(folder: RunFold, record: RunRecord, event: ev.EnvironmentResolved) -> None:
    record.image = event.image


def _built(folder: RunFold, record: RunRecord, event: ev.Built) -> None:
    record.built = event.time
    record.image = event.image or record.image


def _workflow_submitted(folder: RunFold, record: RunRecord, event: ev.WorkflowSubmitted) -> None:
    record.backend_name = event.name
    if record.state is RunState.SUBMITTING:
        record.state = RunState.QUEUED


def _pod(record: RunRecord, task: str, worker: str, attempt: int) -> PodRecord:
    pods = record.pods.setdefault(task, {})
    pod = pods.get(worker)
    if pod is None or pod.attempt != attempt:
        pod = PodRecord(worker=worker, attempt=attempt, state="pending")
        pods[worker] = pod
    return pod


def _pod_started(folder: RunFold, record: RunRecord, event: ev.PodStarted) -> None:
    pod = _pod(record, event.task, event.worker, event.attempt)
    pod.state = "running"
    pod.node = event.node
    pod.gpus = event.gpus


def _pod_failed(folder: RunFold, record: RunRecord, event: ev.PodFailed) -> None:
    pod = _pod(record, event.task, event.worker, event.attempt)
    pod.state = "failed"
    pod.exit_code = event.exit_code
    pod.oom = event.oom
    code = event.exit_code
    if code is not None and exits.stopped_from_outside(code) and not event.oom:
        key = (event.task, event.worker)
        folder.stops[key] = folder.stops.get(key, 0) + 1


def _pod_preempted(folder: RunFold, record: RunRecord, event: ev.PodPreempted) -> None:
    _pod(record, event.task, event.worker, event.attempt).state = "preempted"


def _pod_succeeded(folder: RunFold, record: RunRecord, event: ev.PodSucceeded) -> None:
    pod = _pod(record, event.task, event.worker, event.attempt)
    pod.state = "succeeded"
    pod.exit_code = 0


def _oom_killed(folder: RunFold, record: RunRecord, event: ev.OomKilled) -> None:
    record.oom_kills.setdefault(event.task, {}).setdefault(event.worker, []).append(event.attempt)


def _fold_units(done: UnitFlags, progress: TaskProgress, event: ev.UnitsDone) -> bool:
    """Fold the units of a batch not done before into the task's progress; whether any was
    (then the batch's last new unit is the task's `last` line)."""
    new = [unit for unit in zip(event.indices, event.seconds, strict=True) if done.add(unit[0])]
    if not new:
        return False
    progress.done += len(new)
    if progress.first is None:
        progress.first_done = event.time
        index, seconds = new[0]
        progress.first = ProgressLine(
            index=index, worker=event.worker, seconds=seconds, time=event.time
        )
    index, seconds = new[-1]
    progress.last_done = event.time
    progress.last = ProgressLine(index=index, worker=event.worker, seconds=seconds, time=event.time)
    return True


def _line(event: ev.UnitDone) -> ProgressLine:
    """The progress line of a unit done."""
    return ProgressLine(
        index=event.index, worker=event.worker, seconds=event.seconds, time=event.time
    )


def _worker_report(folder: RunFold, record: RunRecord, event: ev.WorkerReport) -> None:
    folder.reports.setdefault(event.task, []).append(event)
    folder.reported[(event.task, event.worker, event.attempt)] = event
    pod = _pod(record, event.task, event.worker, event.attempt)
    pod.peak_memory_bytes = event.peak_memory_bytes
    pod.memory_limit_bytes = event.memory_limit_bytes
    pod.processes = event.processes
    pod.units_done = event.units_done
    pod.node = pod.node or event.node
    pod.gpus = pod.gpus if event.gpus is None else event.gpus


def _task_state(folder: RunFold, record: RunRecord, event: ev.TaskStateChanged) -> None:
    record.tasks[event.task] = event.state
    if event.message:
        record.task_messages[event.task] = event.message
    if event.state is TaskState.RUNNING and record.state in (
        RunState.SUBMITTING,
        RunState.QUEUED,
    ):
        record.state = RunState.RUNNING
        record.started = record.started or event.time


def _merged(folder: RunFold, record: RunRecord, event: ev.Merged) -> None:
    if event.task not in record.merged:
        record.merged.append(event.task)


def _logs_kept(folder: RunFold, record: RunRecord, event: ev.LogsKept) -> None:
    if event.task not in record.logs_kept:
        record.logs_kept.append(event.task)


def _node_reserved(folder: RunFold, record: RunRecord, event: ev.NodeReserved) -> None:
    record.reserved = event.node


def _node_released(folder: RunFold, record: RunRecord, event: ev.NodeReleased) -> None:
    if record.reserved == event.node:
        record.reserved = None


def _cancel_requested(folder: RunFold, record: RunRecord, event: ev.CancelRequested) -> None:
    record.cancel_requested = event.by


def _ended(state: RunState) -> Callable[[RunFold, RunRecord, ev.Event], None]:
    def handler(folder: RunFold, record: RunRecord, event: ev.Event) -> None:
        record.state = state
        record.finished = event.time
        record.message = getattr(event, "message", None)
        for task, task_state in record.tasks.items():
            if not task_state.final:
                record.tasks[task] = TaskState.SKIPPED

    return handler


# Each handler takes the event type of its key: a dict cannot tie a value's type to its key, so
# the event parameter is Any here; the lookup by `type(event)` in `RunFold.apply` keeps it right.
_HANDLERS: dict[type[ev.Event], Callable[[RunFold, RunRecord, Any], None]] = {
    ev.EnvironmentResolved: _environment,
    ev.Built: _built,
    ev.WorkflowSubmitted: _workflow_submitted,
    ev.PodStarted: _pod_started,
    ev.PodFailed: _pod_failed,
    ev.PodPreempted: _pod_preempted,
    ev.PodSucceeded: _pod_succeeded,
    ev.OomKilled: _oom_killed,
    ev.WorkerReport: _worker_report,
    ev.TaskStateChanged: _task_state,
    ev.Merged: _merged,
    ev.LogsKept: _logs_kept,
    ev.NodeReserved: _node_reserved,
    ev.NodeReleased: _node_released,
    ev.CancelRequested: _cancel_requested,
    ev.Succeeded: _ended(RunState.SUCCEEDED),
    ev.Failed: _ended(RunState.FAILED),
    ev.Cancelled: _ended(RunState.CANCELLED),
}

_TERMINAL: frozenset[type[ev.Event]] = frozenset({ev.Succeeded, ev.Failed, ev.Cancelled})
"""The events that end a run; the first of them is final."""
_AFTER_END: frozenset[type[ev.Event]] = frozenset({ev.NodeReserved, ev.NodeReleased})
"""The events the actor of an ended run appends: its node released, or one reserved late
(then released)."""


def _tag(event: ev.Event) -> str:
    """The type of an event as its line has it (`failed`)."""
    return str(type(event).__struct_config__.tag)
