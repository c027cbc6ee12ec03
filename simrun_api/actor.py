"""The actor of a live run: the only writer of its event log, one message at a time.

It submits the run to the backend, turns the backend's pod changes and the harness's event logs
into run events, decides the states of the tasks and the end of the run, and publishes every
change to its subscribers. Everything is an event first: a service that restarts folds the log
and the actor continues where the one before stopped.

The harness logs (`tasks/<task>/events/<worker>.<attempt>.jsonl`) are tailed by offset: all of
them every `TAIL_INTERVAL_S` while the run is live and before it ends, and at the end of a pod
only that pod's own log, whose events then precede its end in the same append. What the run log
has already (a unit done, a report, a merge) is not copied again, so a restarted actor reads the
logs from their start.

A store that cannot be written (an append raised an OSError: a full disk, an I/O error, a
read-only store) stops the run: the log is left as it was (`LogWriter`), the service learns it
(`on_store`, it then refuses submissions with 507), the run's processes are stopped, a cancel
asked meanwhile is refused (`StoreUnwritable`), and the append is tried again with backoff until
the disk has room; then the run ends `failed` with a message naming the error (or as the retried
events end it, when they held its end).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import anyio
import msgspec

from simrun_api import logs
from simrun_api.backends.base import Backend, PodChange, RunSubmission
from simrun_api.changes import ChangeSignal
from simrun_core import events as ev
from simrun_core.fold import RunFold, RunRecord
from simrun_core.plugins import TaskType
from simrun_core.states import TaskState
from simrun_core.store import (
    MERGED_MARKER,
    LogCorrupt,
    LogWriter,
    RunPaths,
    iter_log,
    write_record_cache,
)

log = logging.getLogger(__name__)

TAIL_INTERVAL_S = 0.2
HARNESS_FAILED = 3
HARNESS_CONFIGURATION = 4
STORE_RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


@dataclasses.dataclass(frozen=True)
class PodChanged:
    """A message from the backend: a pod changed."""

    change: PodChange


@dataclasses.dataclass(frozen=True)
class Cancel:
    """A message from the API: cancel the run; `acknowledged` is set once that is durable."""

    by: str
    acknowledged: asyncio.Future[RunRecord]


class RunEnded(Exception):
    """The run ended already; it cannot be cancelled."""


class StoreUnwritable(Exception):
    """The store cannot be written: `error` is the OSError of the write; `batch` the numbered
    events that were not appended (the actor appends them again once it can)."""

    def __init__(self, error: OSError, batch: list[ev.Event] | None = None) -> None:
        super().__init__(f"the store cannot be written: {error}")
        self.error = error
        self.batch = batch or []


Message = PodChanged | Cancel


class RunActor:
    """The one task that owns a live run: its log, its fold and its calls to the backend.

    `on_change(record, summary_changed)` is awaited after every append; `summary_changed` says
    whether the state of the run or of a task changed (what the index holds). `on_store(error)`
    is called after every append: None when it succeeded, else its OSError.
    """

    def __init__(
        self,
        paths: RunPaths,
        backend: Backend,
        types: dict[str, TaskType],
        on_change: Callable[[RunRecord, bool], Awaitable[None]],
        on_task_final: Callable[[RunRecord, str, list[ev.WorkerReport]], Awaitable[None]],
        on_store: Callable[[OSError | None], None] = lambda error: None,
    ) -> None:
        self.paths = paths
        self.on_store = on_store
        self.backend = backend
        self.types = types
        self.on_change = on_change
        self.on_task_final = on_task_final
        self._task_reports: dict[str, list[ev.WorkerReport]] = {}
        self.changed = ChangeSignal()
        self.fold = RunFold()
        self._reports: set[tuple[str, str, int]] = set()
        self._report_messages: dict[tuple[str, str, int], str] = {}
        self._offsets: dict[Path, int] = {}
        self._tailed_at = float("-inf")  # time.monotonic() of the last `_tail` of every log
        self._copied: set[tuple[str, str, int]] = set()  # copied, not yet in the fold
        self._send, self._receive = anyio.create_memory_object_stream[Message](10_000)
        self._writer: LogWriter | None = None
        self._cancelling = False

    @property
    def record(self) -> RunRecord:
        """The state of the run so far."""
        assert self.fold.record is not None
        return self.fold.record

    def open(self) -> None:
        """Fold the log so far and open it for appending (truncating a torn last line)."""
        self._writer = LogWriter(self.paths.events)
        for _, event in iter_log(self.paths.events):
            self.fold.apply(event)
            if isinstance(event, ev.WorkerReport):
                self._reports.add((event.task, event.worker, event.attempt))
                self._task_reports.setdefault(event.task, []).append(event)

    def send(self, message: Message) -> None:
        """Put a message into the mailbox (from the event loop's thread)."""
        self._send.send_nowait(message)

    async def cancel(self, by: str) -> RunRecord:
        """Ask the actor to cancel the run; returns once `cancel-requested` is durable."""
        future: asyncio.Future[RunRecord] = asyncio.get_running_loop().create_future()
        self.send(Cancel(by=by, acknowledged=future))
        return await future

    async def run(self) -> None:
        """Carry the run to its end, then close the log."""
        try:
            try:
                if not self.record.ended:
                    await self._start()
                while not self.record.ended:
                    message: Message | None = None
                    with anyio.move_on_after(TAIL_INTERVAL_S):
                        message = await self._receive.receive()
                    if not _ends_pod(message) or self._tail_due():
                        await self._append(self._tail())
                    if message is not None:
                        await self._handle(message)
            except StoreUnwritable as failure:
                await self._stop_for_store(failure)
        finally:
            self._refuse_cancels()
            try:
                write_record_cache(self.paths, self.record)
            except OSError as error:
                log.warning("run %s: run.json not written (the log has it all): %s", self.id, error)
            if self._writer is not None:
                self._writer.close()

    @property
    def id(self) -> str:
        """The id of the run."""
        return self.paths.run_id

    async def _stop_for_store(self, failure: StoreUnwritable) -> None:
        """Stop the run after an append failed: stop its processes, append what failed again
        (with backoff, until the disk has room), then what they did meanwhile and `failed`."""
        log.error("run %s: stopping it: %s", self.id, failure)
        self._cancelling = True
        changes: list[PodChange] = []
        await self.backend.cancel(self.id)
        if failure.batch:
            await self._commit_retrying(failure.batch, changes)
        if self.record.ended:
            return
        self._collect(changes)
        events = [event for change in changes for event in self._on_pod(change)]
        await self._commit_retrying(self._numbered(events + self._tail()), changes)
        message = f"the run was stopped: {failure}"
        await self._commit_retrying(self._numbered([ev.Failed(message=message)]), changes)

    async def _commit_retrying(self, numbered: list[ev.Event], changes: list[PodChange]) -> None:
        """Commit events, trying again with backoff while the store cannot be written;
        meanwhile pod changes are kept in `changes` and cancels refused."""
        failures = 0
        while True:
            try:
                await self._commit(numbered)
                return
            except StoreUnwritable:
                self._collect(changes)
                await anyio.sleep(STORE_RETRY_S[min(failures, len(STORE_RETRY_S) - 1)])
                failures += 1
                self._collect(changes)

    def _collect(self, changes: list[PodChange]) -> None:
        """Take the mailbox: keep the pod changes, refuse the cancels (the store is failing)."""
        while True:
            try:
                pending = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.EndOfStream):
                return
            if isinstance(pending, PodChanged):
                changes.append(pending.change)
            elif not pending.acknowledged.done():
                pending.acknowledged.set_exception(
                    StoreUnwritable(OSError("the run is being stopped: its log cannot be written"))
                )

    async def _start(self) -> None:
        record = self.record
        events: list[ev.Event] = []
        if record.backend_name is None:
            events += [ev.EnvironmentResolved(image=None), ev.Built(image=None)]
        for task, pods in record.pods.items():
            for pod in pods.values():
                if pod.state in ("pending", "running"):
                    events.append(
                        ev.PodFailed(
                            task=task,
                            worker=pod.worker,
                            attempt=pod.attempt,
                            retry=True,
                            message="the service stopped while the pod ran",
                        )
                    )
        await self._append(events)
        done = frozenset(task for task, state in record.tasks.items() if state is TaskState.DONE)
        attempts = {
            pod.worker: pod.attempt + 1 for pods in record.pods.values() for pod in pods.values()
        }
        submission = RunSubmission(
            record,
            self.types,
            done=done,
            next_attempts=attempts,
            retry_memory=frozenset(record.oom_kills),
        )
        name = await self.backend.submit(submission, self._from_backend)
        if record.backend_name is None:
            await self._append([ev.WorkflowSubmitted(name=name)])
        if all(state is TaskState.DONE for state in record.tasks.values()):
            await self._append([*self._tail(), ev.Succeeded()])

    def _from_backend(self, change: PodChange) -> None:
        self.send(PodChanged(change))

    async def _handle(self, message: Message) -> None:
        if isinstance(message, Cancel):
            await self._cancel(message)
        elif not self.record.ended:
            await self._append(self._on_pod(message.change))
            await self._decide()

    async def _cancel(self, message: Cancel) -> None:
        if self.record.ended or self._cancelling:
            if not message.acknowledged.done():
                message.acknowledged.set_exception(RunEnded(self.record.state))
            return
        self._cancelling = True
        try:
            await self._append([ev.CancelRequested(by=message.by)])
        except StoreUnwritable as failure:
            # Refused (507): the cancel is not appended later; the run is stopped anyway.
            if not message.acknowledged.done():
                message.acknowledged.set_exception(failure)
            raise StoreUnwritable(failure.error) from failure
        if not message.acknowledged.done():
            message.acknowledged.set_result(self.record)
        await self.backend.cancel(self.record.id)
        changes: list[ev.Event] = []
        while True:
            try:
                pending = self._receive.receive_nowait()
            except anyio.WouldBlock:
                break
            if isinstance(pending, PodChanged):
                changes += self._on_pod(pending.change)
            else:
                pending.acknowledged.set_exception(RunEnded("cancelled"))
        await self._append(changes + self._tail())
        await self._append([ev.Cancelled(message=f"cancelled by {message.by}")])

    def _refuse_cancels(self) -> None:
        while True:
            try:
                pending = self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.EndOfStream):
                return
            if isinstance(pending, Cancel) and not pending.acknowledged.done():
                pending.acknowledged.set_exception(RunEnded(self.record.state))

    def _on_pod(self, change: PodChange) -> list[ev.Event]:
        """The events of a pod change, and the task state it implies."""
        task, worker, attempt = change.task, change.worker, change.attempt
        state = self.record.tasks.get(task)
        if change.phase == "pending":
            if state in (TaskState.WAITING, TaskState.RETRYING, TaskState.PREEMPTED):
                return [ev.TaskStateChanged(task=task, state=TaskState.QUEUED)]
            return []
        if change.phase == "running":
            events: list[ev.Event] = [
                ev.PodStarted(
                    task=task, worker=worker, attempt=attempt, node=change.node, pid=change.pid
                )
            ]
            if state is not TaskState.RUNNING:
                events.append(ev.TaskStateChanged(task=task, state=TaskState.RUNNING))
            return events
        own = self._tail_pod(task, worker, attempt)  # its report and last units precede its end
        if change.phase == "succeeded":
            events = [*own, ev.PodSucceeded(task=task, worker=worker, attempt=attempt)]
            return events + self._task_succeeded(task, events)
        reported = self._report_messages.get((task, worker, attempt))
        harness_error = change.exit_code in (HARNESS_FAILED, HARNESS_CONFIGURATION)
        message = reported if reported and harness_error else change.message
        events = [
            *own,
            ev.PodFailed(
                task=task,
                worker=worker,
                attempt=attempt,
                exit_code=change.exit_code,
                oom=change.oom,
                retry=change.retry,
                message=message,
            ),
        ]
        if change.oom:
            shape = self.record.plans[task].shape
            events.append(
                ev.OomKilled(
                    task=task,
                    worker=worker,
                    attempt=attempt,
                    memory_gb=shape.memory_gb,
                    retry_memory_gb=shape.retry_memory_gb,
                )
            )
        if self._cancelling:
            return events
        if change.retry:
            events.append(ev.TaskStateChanged(task=task, state=TaskState.RETRYING))
        else:
            why = f"{worker} attempt {attempt}: {message or f'exit code {change.exit_code}'}"
            events.append(ev.TaskStateChanged(task=task, state=TaskState.FAILED, message=why))
            events.append(ev.LogsKept(task=task))
        return events

    def _task_succeeded(self, task: str, pending: list[ev.Event]) -> list[ev.Event]:
        plan = self.record.plans[task]
        merged = (
            task in self.record.merged
            or any(isinstance(e, ev.Merged) and e.task == task for e in pending)
            or (self.paths.out(task) / MERGED_MARKER).exists()
        )
        if plan.units is not None and not merged:
            return [
                ev.TaskStateChanged(
                    task=task,
                    state=TaskState.FAILED,
                    message="the coordinator succeeded without merging the units",
                ),
                ev.LogsKept(task=task),
            ]
        return [ev.TaskStateChanged(task=task, state=TaskState.DONE), ev.LogsKept(task=task)]

    async def _decide(self) -> None:
        """End the run once every task is done or one failed."""
        if self._cancelling or self.record.ended:
            return
        tasks = self.record.tasks
        failed = [task for task, state in tasks.items() if state is TaskState.FAILED]
        if failed:
            task = failed[0]
            reason = self.record.task_messages.get(task, "it failed")
            await self.backend.cancel(self.record.id)
            await self._append(self._tail())
            await self._append([ev.Failed(message=f"task {task!r} failed: {reason}")])
        elif all(state is TaskState.DONE for state in tasks.values()):
            await self._append([*self._tail(), ev.Succeeded()])  # what is left of every log

    def _tail_due(self) -> bool:
        """Whether every log was last read `TAIL_INTERVAL_S` ago or longer."""
        return time.monotonic() - self._tailed_at >= TAIL_INTERVAL_S

    def _tail(self) -> list[ev.Event]:
        """New events of all the harness logs of the run that the run log does not have yet."""
        self._tailed_at = time.monotonic()
        return self._read(sorted((self.paths.dir / "tasks").glob("*/events/*.jsonl")))

    def _tail_pod(self, task: str, worker: str, attempt: int) -> list[ev.Event]:
        """New events of the harness log of one pod (none when it wrote none)."""
        return self._read([self.paths.worker_events(task) / f"{worker}.{attempt}.jsonl"])

    def _read(self, paths: Iterable[Path]) -> list[ev.Event]:
        """The events to copy from harness logs, each read from where it was read up to."""
        found: list[ev.Event] = []
        for path in paths:
            offset = self._offsets.get(path, 0)
            try:
                for end, event in iter_log(path, offset):
                    offset = end
                    found.extend(self._copy(event))
            except LogCorrupt as error:
                log.warning("run %s: skipping the rest of %s", self.record.id, error)
                offset = path.stat().st_size
            except FileNotFoundError:
                continue
            self._offsets[path] = offset
        return found

    def _copy(self, event: ev.Event) -> list[ev.Event]:
        """The harness event to append to the run log, none if the log has it already (or the
        events copied to be appended with it)."""
        if isinstance(event, ev.UnitDone):
            key = ("unit-done", event.task, event.index)
            if key in self._copied or self.fold.unit_is_done(event.task, event.index):
                return []
            self._copied.add(key)
            return [event]
        if isinstance(event, ev.WorkerReport):
            key = (event.task, event.worker, event.attempt)
            if event.message:
                self._report_messages[key] = event.message
            if key in self._reports:
                return []
            self._reports.add(key)
            return [event]
        if isinstance(event, ev.Merged):
            key = ("merged", event.task, 0)
            if key in self._copied or event.task in self.record.merged:
                return []
            self._copied.add(key)
            return [event]
        return []

    async def _append(self, events: list[ev.Event]) -> None:
        """Number, append (durably), fold and publish events; StoreUnwritable if the store
        cannot be written (the log is as it was)."""
        if events:
            await self._commit(self._numbered(events))

    def _numbered(self, events: list[ev.Event]) -> list[ev.Event]:
        """The events numbered after the last one of the log."""
        seq = self.record.seq
        return [msgspec.structs.replace(event, seq=seq + n) for n, event in enumerate(events, 1)]

    async def _commit(self, numbered: list[ev.Event]) -> None:
        """Append numbered events (durably), then fold and publish them."""
        if not numbered:
            return
        assert self._writer is not None
        before = (self.record.state, dict(self.record.tasks))
        try:
            for event in numbered:
                if isinstance(event, ev.LogsKept):
                    logs.keep(self.paths.logs(event.task))
            await anyio.to_thread.run_sync(self._writer.append, *numbered)
        except OSError as error:
            self.on_store(error)
            raise StoreUnwritable(error, numbered) from error
        self.on_store(None)
        final = []
        for event in numbered:
            self.fold.apply(event)
            if isinstance(event, ev.UnitDone):
                self._copied.discard(("unit-done", event.task, event.index))
            elif isinstance(event, ev.Merged):
                self._copied.discard(("merged", event.task, 0))
            if isinstance(event, ev.WorkerReport):
                self._task_reports.setdefault(event.task, []).append(event)
            elif isinstance(event, ev.TaskStateChanged) and event.state.final:
                final.append(event.task)
        self.changed.notify()
        for task in final:
            await self.on_task_final(self.record, task, self._task_reports.get(task, []))
        summary_changed = (self.record.state, self.record.tasks) != before or self.record.ended
        await self.on_change(self.record, summary_changed)


def _ends_pod(message: Message | None) -> bool:
    """Whether a message is the end of a pod (whose handling reads the pod's own log)."""
    return isinstance(message, PodChanged) and message.change.phase in ("succeeded", "failed")
