"""The actor of a live run: the shell around `simrun_core.decider.decide`.

It is the only writer of the run's event log, the `submitted` event included. It reads its
mailbox one message at a time, does the I/O a message needs (a pod's own harness log at its
end, the merge marker, the harness logs that the service's one `HarnessWatch` saw grow, or
every harness log on a timer of its own when it has no watcher), asks `decide` what follows,
appends and fsyncs the events, then carries out the commands (backend calls, keeping logs,
learning resources, answering a cancel) and publishes the change. It remembers nothing a
restart could not fold back from the log: `_offsets` (how far each harness log was read) is a
cache, and a restarted actor reads the harness logs from their start while the decider drops
what the log has already.

A store that cannot be written (an append raised an OSError: a full disk, an I/O error, a
read-only store) stops the run: the log is left as it was (`LogWriter`), the service learns it
(`on_store`, it then refuses submissions with 507), the run's pods are stopped, a cancel asked
meanwhile is refused (`StoreUnwritable`), and the append is tried again with backoff until the
disk has room; then the decider ends the run `failed` with a message naming the error (or as the
retried events end it, when they held its end).

With `SIMRUN_RECORD_MESSAGES=1` in its environment the actor also appends every message it
decided on to `messages.jsonl` of the run (after its events), which tests/golden/decider
replays through `decide`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import anyio
import msgspec

from simrun_api import logs
from simrun_api.backends.base import Backend, ReservationRefused, RunSubmission
from simrun_api.environments import EnvironmentRefused, Environments, OwnEnvironment
from simrun_api.harness_logs import HarnessLogs
from simrun_api.harness_watch import HarnessWatch, Watched
from simrun_api.run_feed import RunFeed
from simrun_core import events as ev
from simrun_core import messages as msg
from simrun_core.clock import now
from simrun_core.decider import decide
from simrun_core.errors import WorkflowError
from simrun_core.fold import RunFold, RunRecord
from simrun_core.messages import PodChanged
from simrun_core.plugins import TaskType
from simrun_core.snapshot_types import types_of_run
from simrun_core.store import (
    MERGED_MARKER,
    LogCorrupt,
    LogWriter,
    OpenLog,
    RunPaths,
    iter_blocks,
    worker_log_pod,
    write_atomic,
    write_record_cache,
)

log = logging.getLogger(__name__)

TAIL_INTERVAL_S = 0.2
MARKER_POLL_S = 1.0
STORE_RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
RECORD_MESSAGES = "SIMRUN_RECORD_MESSAGES"
MESSAGES = "messages.jsonl"
COPIED = (ev.UnitDone, ev.UnitsDone, ev.WorkerReport, ev.Merged)


class RunEnded(Exception):
    """The run ended already (or is ending); it cannot be cancelled."""


class StoreUnwritable(Exception):
    """The store cannot be written: `error` is the OSError of the write; `batch` the numbered
    events that were not appended (the actor appends them again once it can)."""

    def __init__(self, error: OSError, batch: list[ev.Event] | None = None) -> None:
        super().__init__(f"the store cannot be written: {error}")
        self.error = error
        self.batch = batch or []


@dataclasses.dataclass(frozen=True)
class _Envelope:
    """An item of the mailbox: a pod change of the backend, a message, or the settling of a run
    whose pods are gone; `reply` is the future of a cancel."""

    change: PodChanged | None = None
    message: msg.Message | None = None
    settle: bool = False
    reply: asyncio.Future[RunRecord] | None = None


_TICK = _Envelope()
"""The item a timer puts into an empty mailbox: the wait for the next item timed out."""
_WAKE = _Envelope()
"""The item the service's `HarnessWatch` puts into the mailbox: harness logs of the run grew."""


class RunActor:
    """The one task that owns a live run: its log, its fold and its calls to the backend.

    `on_change(record, summary_changed)` is awaited after every append; `summary_changed` says
    whether the state of the run or of a task changed (what the index holds). `on_store(error)`
    is called after every append: None when it succeeded, else its OSError.
    `on_task_final(record, task, reports)` is awaited for a task that became final.
    `appends`: the limiter the appends of the log take a thread under, shared by every actor of
    a service (see `Supervisor`); one of its own by default. `feed` is what the readers of the
    run get of it (`RunFeed`): every append is published there.
    """

    def __init__(
        self,
        paths: RunPaths,
        backend: Backend,
        types: dict[str, TaskType],
        on_change: Callable[[RunRecord, bool], Awaitable[None]],
        on_task_final: Callable[[RunRecord, str, list[ev.WorkerReport]], Awaitable[None]],
        on_store: Callable[[OSError | None], None] = lambda error: None,
        environments: Environments | None = None,
        watch: HarnessWatch | None = None,
        appends: anyio.CapacityLimiter | None = None,
    ) -> None:
        self.paths = paths
        self.environments = environments or OwnEnvironment()
        self.backend = backend
        self.types = types
        self.on_change = on_change
        self.on_task_final = on_task_final
        self.on_store = on_store
        self.feed = RunFeed()
        self.fold = RunFold()
        self._offsets: dict[Path, int] = {}  # a cache: how far each harness log was read
        self._open_logs: dict[Path, OpenLog] = {}  # the harness logs read, kept open
        self._harness_logs = HarnessLogs(paths.tasks)
        self._tailed_at = float("-inf")  # time.monotonic() of the last read of every log
        self._watch = watch  # None: the actor looks at its logs on a timer of its own
        self._watched: Watched | None = None
        self._woken: set[Path] = set()  # logs the watcher saw grow, not read yet
        self._wake_pending = False  # a _WAKE is in the mailbox
        self._send, self._receive = anyio.create_memory_object_stream[_Envelope](10_000)
        self._writer: LogWriter | None = None
        self._record_messages = os.environ.get(RECORD_MESSAGES) == "1"
        self._lookouts: set[asyncio.Task[None]] = set()  # merge markers, environments
        self._appends = appends if appends is not None else anyio.CapacityLimiter(1)

    @property
    def record(self) -> RunRecord:
        """The state of the run so far."""
        assert self.fold.record is not None
        return self.fold.record

    @property
    def id(self) -> str:
        """The id of the run."""
        return self.paths.run_id

    def create(self, submitted: ev.Submitted) -> None:
        """Write the log of a new run, its `submitted` event durably (stamped `seq` 1 and the
        time now, unless it has one); OSError when it cannot."""
        (submitted,) = ev.stamped([submitted], 0, now())
        writer = LogWriter(self.paths.events)
        try:
            writer.append(submitted)
        except BaseException:
            writer.close()
            raise
        self._writer = writer
        self.fold.apply(submitted)

    def open(self) -> None:
        """Fold the log so far and open it for appending (truncating a torn last line)."""
        self._writer = LogWriter(self.paths.events)
        for _, events in iter_blocks(self.paths.events):
            self.fold.apply_all(events)

    def send(self, message: msg.Message) -> None:
        """Put a message into the mailbox (from the event loop's thread)."""
        self._send.send_nowait(_Envelope(message=message))

    async def cancel(self, by: str) -> RunRecord:
        """Ask the actor to cancel the run; returns once `cancel-requested` is durable.
        RunEnded when the run ended or is ending; StoreUnwritable when it cannot be recorded."""
        future: asyncio.Future[RunRecord] = asyncio.get_running_loop().create_future()
        self._send.send_nowait(_Envelope(message=msg.CancelAsked(by=by), reply=future))
        return await future

    async def run(self) -> None:
        """Carry the run to its end, then close the log."""
        try:
            try:
                capabilities = self.backend.capabilities
                resume = msg.Resume(
                    # an actor restarted in the same service: the backend still runs its pods
                    pods_survive=capabilities.pods_outlive_service or self.backend.has(self.id),
                    builds_images=capabilities.images,
                )
                if self._watch is not None:
                    self._watched = self._watch.register(self.paths.tasks, self._wake)
                await self._decide(resume)
                while not self.record.ended:
                    if self._watched is None:
                        envelope = await self._next(TAIL_INTERVAL_S)
                    else:
                        envelope = await self._receive.receive()
                        if envelope is _WAKE:
                            await self._read_woken()
                            continue
                    # The envelope first: a pod's report of its start precedes its log's lines.
                    if envelope is not None:
                        await self._handle(envelope)
                    if not self.record.ended and (not _ends_pod(envelope) or self._tail_due()):
                        await self._harness_read()
            except StoreUnwritable as failure:
                await self._stop_for_store(failure)
        finally:
            if self._watch is not None and self._watched is not None:
                self._watch.unregister(self._watched)
                self._watched = None
            for lookout in self._lookouts:
                lookout.cancel()
            for path in list(self._open_logs):
                self._close_log(path)
            self._refuse_cancels(lambda: RunEnded(self.record.state))
            try:
                write_record_cache(self.paths, self.record)
            except OSError as error:
                log.warning("run %s: run.json not written (the log has it all): %s", self.id, error)
            if self._writer is not None:
                self._writer.close()

    async def _next(self, timeout: float) -> _Envelope | None:
        """The next item of the mailbox, None after `timeout` seconds without one. A timer puts
        a tick into the mailbox instead of cancelling the wait: with a thousand live runs
        waking five times a second, a cancel scope and its CancelledError cost more than the
        rest of a look at the run's logs."""
        timer = asyncio.get_running_loop().call_later(timeout, self._tick)
        try:
            envelope = await self._receive.receive()
        finally:
            timer.cancel()
        return None if envelope is _TICK else envelope

    def _tick(self) -> None:
        with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
            self._send.send_nowait(_TICK)

    async def _handle(self, envelope: _Envelope) -> None:
        if envelope.change is not None:
            await self._decide(self._pod_message(envelope.change))
        elif envelope.settle:
            await self._decide(msg.PodsGone(harness=self._tail(started_only=False)))
        elif envelope.message is not None:
            await self._decide(envelope.message, envelope.reply)

    def _wake(self, grown: list[Path]) -> None:
        """Called by the watcher (on the loop): these logs grew; one _WAKE in the mailbox."""
        self._woken.update(grown)
        if self._wake_pending:
            return
        with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError):
            self._send.send_nowait(_WAKE)
            self._wake_pending = True

    async def _read_woken(self) -> None:
        """Read the logs the watcher saw grow (each from where it was read up to); one of a pod
        whose start is not recorded yet is left for later and hinted to the backend."""
        self._wake_pending = False
        grown, self._woken = sorted(self._woken), set()
        hints = self.backend.capabilities.pod_hints
        if hints is not None and not all(self._seen_to_start(path) for path in grown):
            hints.started(self.id)
        events = self._read(grown, started_only=True)
        if events:
            await self._decide(msg.HarnessRead(events=events))

    async def _harness_read(self) -> None:
        events = self._tail()
        if events:
            await self._decide(msg.HarnessRead(events=events))

    async def _decide(
        self, message: msg.Message, reply: asyncio.Future[RunRecord] | None = None
    ) -> None:
        """Decide on a message, append its events durably, then carry out its commands."""
        decision = decide(self.fold, message)
        try:
            await self._commit(self._numbered(decision.events))
        except StoreUnwritable as failure:
            if reply is None:
                raise
            # A cancel that cannot be recorded is refused (507) and not appended later.
            if not reply.done():
                reply.set_exception(failure)
            raise StoreUnwritable(failure.error) from failure
        if self._record_messages:
            with open(self.paths.dir / MESSAGES, "ab") as recording:
                recording.write(msg.encode_message(message))
        hints = self.backend.capabilities.pod_hints
        if hints is not None:
            for event in decision.events:
                if isinstance(event, ev.Merged):
                    hints.merged(self.id, event.task)
        for command in decision.commands:
            await self._carry_out(command, reply)

    async def _carry_out(
        self, command: msg.AnyCommand, reply: asyncio.Future[RunRecord] | None
    ) -> None:
        match command:
            case msg.ReserveNode():
                try:
                    await self.backend.reserve(command.node, self.id)
                except ReservationRefused as refusal:
                    refused = msg.NodeReservation(
                        node=command.node, taken=False, reason=str(refusal)
                    )
                    await self._decide(refused)
                    return
                await self._decide(msg.NodeReservation(node=command.node, taken=True))
            case msg.ReleaseNode():
                # A failure raises: the supervisor restarts the actor, whose resume asks again.
                await self.backend.release(command.node, self.id)
                await self._decide(msg.NodeRelease(node=command.node))
            case msg.SubmitRun():
                submission = RunSubmission(
                    self.record,
                    types_of_run(self.types, self.record),
                    done=command.done,
                    ready=command.ready,
                    next_attempts=command.next_attempts,
                    retry_memory=command.retry_memory,
                    environment_failed=lambda why: self.send(msg.EnvironmentFailed(reason=why)),
                )
                try:
                    name = await self.backend.submit(submission, self.report)
                except WorkflowError as refusal:
                    await self._decide(msg.SubmissionRefused(reason=str(refusal)))
                    return
                await self._decide(msg.WorkflowAccepted(name=name))
            case msg.RetryPod():
                await self.backend.retry(
                    self.id, command.task, command.worker, command.attempt, command.retry_memory
                )
            case msg.StartTask():
                await self.backend.start_task(self.id, command.task)
            case msg.StopPods():
                await self.backend.cancel(self.id)
                self._send.send_nowait(_Envelope(settle=True))
            case msg.Settle():
                self._send.send_nowait(_Envelope(settle=True))
            case msg.ResolveEnvironment():
                self._in_background(self._resolve_environment())
            case msg.BuildImage():
                self._in_background(self._build_image(command.image))
            case msg.AwaitMergeMarker():
                self._in_background(self._look_for_marker(command.task))
            case msg.KeepLogs():
                await self._keep_logs(command.task)
            case msg.Learn():
                reports = self.fold.reports.get(command.task, [])
                await self.on_task_final(self.record, command.task, reports)
            case msg.AnswerCancel():
                if reply is not None and not reply.done():
                    if command.accepted:
                        reply.set_result(self.record)
                    else:
                        reply.set_exception(RunEnded(command.state))

    def _in_background(self, work: Awaitable[None]) -> None:
        """Run what would hold the mailbox too long as a task of its own (cancelled with the
        actor); it sends its result as a message."""
        lookout = asyncio.ensure_future(work)
        self._lookouts.add(lookout)
        lookout.add_done_callback(self._lookouts.discard)

    async def _resolve_environment(self) -> None:
        try:
            resolved = await self.environments.resolve(self.record)
        except Exception as error:  # a refusal, or the resolver's own failure: the run fails
            log.warning("run %s: its environment is not resolved: %s", self.id, error)
            self.send(msg.EnvironmentFailed(reason=_reason(error)))
            return
        self.send(msg.EnvironmentReady(image=resolved.image, lock_sha256=resolved.lock_sha256))

    async def _build_image(self, image: str) -> None:
        try:
            made = await self.environments.build(image)
        except Exception as error:
            log.warning("run %s: its image %s is not built: %s", self.id, image, error)
            self.send(msg.EnvironmentFailed(reason=_reason(error)))
            return
        self.send(msg.ImageReady(image=image, seconds=made.seconds, cached=made.cached))

    async def _keep_logs(self, task: str) -> None:
        """Keep the logs of a final task's pods in the store: fetched from the backend first
        where the pods do not write them there (a cluster's); a failure is logged, the run goes
        on (its pods' logs are then the live ones, or gone with them)."""
        directory = self.paths.logs(task)
        try:
            if not self.backend.capabilities.pod_logs_in_store:
                fetched = await self.backend.logs(self.id, task)
                directory.mkdir(parents=True, exist_ok=True)
                for pod, text in fetched.items():
                    if "/" not in pod and not pod.startswith("."):
                        write_atomic(directory / f"{pod}.log", text.encode())
            await anyio.to_thread.run_sync(logs.keep, directory)  # an fsync: not in the loop
        except Exception as error:  # a backend's or the store's: the logs are not kept
            log.warning("run %s: the logs of %s not kept: %s", self.id, task, error)

    async def _look_for_marker(self, task: str) -> None:
        """List the output directory of a task until it has the merge marker or the backend's
        grace passed (a listing revalidates an NFS directory; a lookup may answer from a cached
        miss); then tell the decider."""
        deadline = time.monotonic() + self.backend.capabilities.merge_marker_grace_s
        out = self.paths.out(task)
        while True:
            try:
                found = MERGED_MARKER in await anyio.to_thread.run_sync(os.listdir, out)
            except OSError:
                found = False
            if found or time.monotonic() >= deadline:
                break
            await anyio.sleep(min(MARKER_POLL_S, max(0.0, deadline - time.monotonic())))
        self.send(msg.MergeMarker(task=task, found=found))

    def report(self, change: msg.BackendReport) -> None:
        """Put what the backend reports into the mailbox (the callback given to `submit`): a
        pod change, or the run's workflow gone."""
        if not isinstance(change, PodChanged):
            self._send.send_nowait(_Envelope(message=change))
            return
        self._harness_logs.changed()  # a pod that starts writes a log of its own
        if self._watched is not None:
            self._watched.changed()
        self._send.send_nowait(_Envelope(change=change))

    def _pod_message(self, change: PodChanged) -> PodChanged:
        """A pod change with the I/O its decision needs done: at a pod's end the new events of
        its own harness log (its report and last units precede its end) and, for a success,
        whether the task's output has the merge marker."""
        if change.phase not in msg.ENDED_PHASES:
            return change
        path = self.paths.worker_log(change.task, change.worker, change.attempt)
        marker = change.phase == "succeeded" and change.task not in self.record.merged
        harness = self._read([path])
        self._close_log(path)  # its pod wrote its last line
        return msgspec.structs.replace(
            change,
            harness=harness,
            merged_marker=marker and (self.paths.out(change.task) / MERGED_MARKER).exists(),
        )

    def _close_log(self, path: Path) -> None:
        opened = self._open_logs.pop(path, None)
        if opened is not None:
            opened.close()

    # -- a store that cannot be written --------------------------------------------------------

    async def _stop_for_store(self, failure: StoreUnwritable) -> None:
        """Stop the run after an append failed: stop its pods, append what failed again (with
        backoff, until the disk has room), then what the pods did meanwhile and `failed`."""
        log.error("run %s: stopping it: %s", self.id, failure)
        changes: list[PodChanged] = []
        await self.backend.cancel(self.id)
        if failure.batch:
            await self._commit_retrying(failure.batch, changes)
        if self.record.ended:
            return
        self._collect(changes)
        message = msg.StoreWritable(
            error=str(failure.error),
            changes=[self._pod_message(change) for change in changes],
            harness=self._tail(started_only=False),
        )
        decision = decide(self.fold, message)
        await self._commit_retrying(self._numbered(decision.events), changes)

    async def _commit_retrying(self, numbered: list[ev.Event], changes: list[PodChanged]) -> None:
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

    def _collect(self, changes: list[PodChanged]) -> None:
        """Take the mailbox: keep the pod changes, refuse the cancels (the store is failing)."""
        refusal = OSError("the run is being stopped: its log cannot be written")
        for envelope in self._drain():
            if envelope.change is not None:
                changes.append(envelope.change)
            elif envelope.reply is not None and not envelope.reply.done():
                envelope.reply.set_exception(StoreUnwritable(refusal))

    def _refuse_cancels(self, error: Callable[[], Exception]) -> None:
        for envelope in self._drain():
            if envelope.reply is not None and not envelope.reply.done():
                envelope.reply.set_exception(error())

    def _drain(self) -> Iterable[_Envelope]:
        while True:
            try:
                yield self._receive.receive_nowait()
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.EndOfStream):
                return

    # -- the harness logs ----------------------------------------------------------------------

    def _tail_due(self) -> bool:
        """Whether every log was last read `TAIL_INTERVAL_S` ago or longer."""
        return time.monotonic() - self._tailed_at >= TAIL_INTERVAL_S

    def _tail(self, *, started_only: bool = True) -> list[msg.HarnessEvent]:
        """New events of all the harness logs of the run (of the pods seen to start)."""
        self._tailed_at = time.monotonic()
        return self._read(self._harness_logs.grown(self._offsets), started_only=started_only)

    def _read(self, paths: Iterable[Path], *, started_only: bool = False) -> list[msg.HarnessEvent]:
        """The events of harness logs that the run log copies, each log read from where it was
        read up to. `started_only` leaves alone the log of a pod attempt whose start the run
        has not recorded yet: its report waits in the mailbox (a warm process writes before the
        backend's report of it is handled), and its units follow its `pod-started`."""
        found: list[msg.HarnessEvent] = []
        for path in paths:
            if started_only and not self._seen_to_start(path):
                continue
            offset = self._offsets.get(path, 0)
            try:
                opened = self._open_logs.get(path)
                if opened is None:
                    opened = self._open_logs[path] = OpenLog(path)
                for end, event in opened.events(offset):
                    offset = end
                    if isinstance(event, COPIED):
                        found.append(event)
            except LogCorrupt as error:
                log.warning("run %s: skipping the rest of %s", self.id, error)
                offset = path.stat().st_size
            except FileNotFoundError:
                continue
            self._offsets[path] = offset
        return found

    def _seen_to_start(self, path: Path) -> bool:
        """Whether the record has the pod attempt of a harness log (or a later attempt of it)."""
        pod = worker_log_pod(path)
        if pod is None:
            return True
        task, worker, attempt = pod
        known = self.record.pods.get(task, {}).get(worker)
        return known is not None and known.attempt >= attempt

    # -- the log ---------------------------------------------------------------------------------

    def _numbered(self, events: list[ev.Event]) -> list[ev.Event]:
        """The events of a decision as they are appended: numbered after the last one of the
        log, stamped with the time now (the decider reads no clock)."""
        return ev.stamped(events, self.record.seq, now())

    def _append(self, numbered: list[ev.Event]) -> tuple[list[bytes], bool]:
        """Append durably (in a thread): the lines, and whether the log is what the actor wrote
        and nothing else (no line of another writer came before them)."""
        assert self._writer is not None
        lines = self._writer.append(*numbered)
        return lines, self._writer.size() == self._writer.length

    async def _commit(self, numbered: list[ev.Event]) -> None:
        """Append numbered events (durably), then fold and publish them; StoreUnwritable if the
        store cannot be written (the log is as it was)."""
        if not numbered:
            return
        assert self._writer is not None
        before = (self.record.state, dict(self.record.tasks))
        start = self._writer.length
        try:
            lines, alone = await anyio.to_thread.run_sync(
                self._append, numbered, limiter=self._appends
            )
        except OSError as error:
            self.on_store(error)
            raise StoreUnwritable(error, numbered) from error
        self.on_store(None)
        for event in numbered:
            self.fold.apply(event)
        if alone:
            self.feed.published(start, lines, numbered)
        else:
            self.feed.reread()  # the streams read the log, and what else is in it
        summary_changed = (self.record.state, self.record.tasks) != before or self.record.ended
        await self.on_change(self.record, summary_changed)


def _reason(error: Exception) -> str:
    """What a failed environment says in the run's message."""
    if isinstance(error, EnvironmentRefused):
        return str(error)
    return f"{type(error).__name__}: {error}"


def _ends_pod(envelope: _Envelope | None) -> bool:
    """Whether a mailbox item is the end of a pod (whose handling reads the pod's own log)."""
    change = envelope.change if envelope is not None else None
    return change is not None and change.phase in msg.ENDED_PHASES
