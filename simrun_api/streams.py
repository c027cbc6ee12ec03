"""The server-sent event streams: the events of one run, and the runs and servers of the service."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import AsyncIterator

import msgspec
from litestar.response import ServerSentEventMessage

from simrun_api.appended import Piece, sse_message
from simrun_api.service import Service
from simrun_api.workers import claims_by_worker, worker_views
from simrun_core import events as ev
from simrun_core.events import TERMINAL_EVENTS, Event
from simrun_core.fold import FoldError, RunFold
from simrun_core.states import RunState
from simrun_core.store import LogCorrupt, RunPaths, iter_lines
from simrun_core.views import progress_view, run_view
from simrun_core.wire import WorkerView

TERMINAL_KINDS = frozenset(str(kind.__struct_config__.tag) for kind in TERMINAL_EVENTS)
"""The types of the events that end a run: a stream ends after the first of them."""
BATCH_BYTES = 64 * 1024
"""About the most bytes of event messages sent as one write: the events of one read of the log
go out together, so a subscriber costs a write per read, not one per event. After each full
write of a backlog the stream lets the loop run the transport's callbacks: a client reset in the
middle of a backlog is then seen after the first write that fails (asyncio warns after five
writes to a lost connection, `LOG_THRESHOLD_FOR_CONNLOST_WRITES`)."""


@dataclasses.dataclass
class EncodedMessages(ServerSentEventMessage):
    """Messages encoded already (`sse_message`), sent as one chunk of the body: litestar sends a
    `ServerSentEventMessage` as its `encode()` has it."""

    encoded: bytes = b""

    def encode(self) -> bytes:
        """The messages as they go out."""
        return self.encoded


async def service_events(
    service: Service,
    group: str | None = None,
    owner: str | None = None,
    agent: str | None = None,
    state: RunState | None = None,
) -> AsyncIterator[ServerSentEventMessage]:
    """`runs` (the runs, filtered as `GET /runs`) and `servers`, each on connect and then when
    it changed: checked after every change of a run (the supervisor's signal), at most once
    per `events_poll_s`. The stream ends after `events_max_s`."""
    settings = service.settings
    signal = service.supervisor.changed
    deadline = time.monotonic() + settings.events_max_s
    sent_runs = sent_servers = b""
    while True:
        checked = time.monotonic()
        version = signal.version
        runs = msgspec.json.encode(await service.runs(group, owner, agent, state))
        if runs != sent_runs:
            sent_runs = runs
            yield ServerSentEventMessage(data=runs.decode(), event="runs")
        servers = msgspec.json.encode(await service.backend.servers())
        if servers != sent_servers:
            sent_servers = servers
            yield ServerSentEventMessage(data=servers.decode(), event="servers")
        if time.monotonic() >= deadline:
            return
        await signal.wait(deadline - time.monotonic(), since=version)
        pause = min(checked + settings.events_poll_s, deadline) - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)


def read_events(
    paths: RunPaths, offset: int = 0, line_at: int = 1
) -> list[tuple[int, bytes, Event]]:
    """The whole lines of a run's log from byte `offset`, line `line_at`: (end offset, line,
    event). FileNotFoundError for a removed run; LogCorrupt naming the file and the line."""
    return list(iter_lines(paths.events, offset, line_at))


WORKER_EVENTS = (
    ev.UnitDone,
    ev.UnitsDone,
    ev.PodStarted,
    ev.PodFailed,
    ev.PodSucceeded,
    ev.PodPreempted,
    ev.WorkerReport,
)
"""The events `worker_views` reads."""


class RunViews:
    """The messages `run` (`RunView`), `progress` (`ProgressView`) and `workers` (the
    `WorkerView`s of every task by task id) of a run's stream: its events folded as they are
    read, each message when it differs from the one sent before, `id` the `seq` folded."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths
        self.fold = RunFold()
        self.sent: dict[str, bytes] = {}
        self.of_task: dict[str, list[Event]] = {}
        self.workers: dict[str, list[WorkerView]] = {}
        self.touched: set[str] = set()

    def apply_all(self, events: list[Event]) -> tuple[int, FoldError] | None:
        """Fold events in order; for one that does not follow the ones before, its place in
        `events` and the FoldError (the events before it are folded)."""
        for number, event in enumerate(events):
            try:
                self.fold.apply(event)
            except FoldError as error:
                return number, error
            if isinstance(event, WORKER_EVENTS):
                self.of_task.setdefault(event.task, []).append(event)
                self.touched.add(event.task)
        return None

    def _workers(self) -> dict[str, list[WorkerView]]:
        """The workers of every task, read again for the tasks with new events: the claims of
        a running task from its ledger, as `GET /runs/{run}/tasks/{task}/workers` has them."""
        record = self.fold.record
        assert record is not None
        for task in self.touched & record.tasks.keys():
            live = not record.ended and not record.tasks[task].final
            claims = claims_by_worker(self.paths.ledger(task)) if live else {}
            self.workers[task] = worker_views(self.of_task.get(task, ()), task, claims)
        self.touched.clear()
        return {task: self.workers.get(task, []) for task in record.tasks}

    async def messages(self) -> list[ServerSentEventMessage]:
        """The messages that changed since the last call (all of them at the first)."""
        record = self.fold.record
        if record is None:
            return []
        workers = await asyncio.to_thread(self._workers)
        claimed = {
            task: sum(worker.units_claimed for worker in views) for task, views in workers.items()
        }
        progress = progress_view(record, claimed)
        shapes = {"run": run_view(record), "progress": progress, "workers": workers}
        messages = []
        for name, shape in shapes.items():
            data = msgspec.json.encode(shape)
            if self.sent.get(name) != data:
                self.sent[name] = data
                messages.append(
                    ServerSentEventMessage(data=data.decode(), event=name, id=record.seq)
                )
        return messages


def _error(detail: str) -> ServerSentEventMessage:
    """The message `error` that ends a stream: its data as the detail of a 500."""
    data = msgspec.json.encode({"status_code": 500, "detail": detail}).decode()
    return ServerSentEventMessage(data=data, event="error")


async def run_events(
    service: Service,
    paths: RunPaths,
    after: int,
    first: list[tuple[int, bytes, Event]],
    views: bool = False,
) -> AsyncIterator[ServerSentEventMessage]:
    """Every event of a run after `after`, `id` its `seq`, `first` the lines read before the
    stream began (`read_events`); ends after the run's last event, when the run was removed,
    or after `events_max_s`. A line that cannot be read later ends it with a message `error`,
    its data `{"status_code": 500, "detail": ...}` naming the file and the line.

    The lines after the first come from the actor's last appends while the stream keeps up
    (`simrun_api.appended`: their messages encoded once for every stream), else from the log.

    With `views`, after the events read at a time also `RunViews`' messages `run`, `progress`
    and `workers`, each on connect and when it changed, so a client sees the run as
    `GET /runs/{run}` has it without folding events (a log that does not fold ends the
    stream with a message `error`).
    """
    offset = 0
    read = 0  # the lines read
    pieces = [_piece(first)] if first else []
    watch = RunViews(paths) if views else None
    deadline = time.monotonic() + service.settings.events_max_s
    writes = _Writes()
    while True:
        signal = service.supervisor.signal(paths.run_id)
        version = signal.version if signal is not None else 0
        ended = False
        for piece in pieces:
            offset = piece.ends[-1]
            read += len(piece.lines)
            ended = piece.kinds[-1] in TERMINAL_KINDS
            if watch is not None:
                failure = watch.apply_all(piece.decoded())
                if failure is not None:
                    for message in writes.add(piece.part(failure[0]), after):
                        yield message
                    for message in writes.flush():
                        yield message
                    yield _error(f"run {paths.run_id!r}: {failure[1]}")
                    return
            for message in writes.add(piece, after):
                yield message
                await asyncio.sleep(0)  # see BATCH_BYTES
            after = max(after, piece.seqs[-1])
        for message in writes.flush():
            yield message
        if watch is not None:
            for message in await watch.messages():
                yield message
        if ended or time.monotonic() > deadline:
            return
        changed = False
        if signal is not None:
            changed = await signal.wait(service.settings.events_poll_s, since=version)
        else:
            await asyncio.sleep(service.settings.events_poll_s)
        # After an append, its lines as the actor kept them; after a quiet poll interval, the
        # log itself (what else came to be there, a line written over, is read then).
        appended = service.supervisor.appended(paths.run_id) if changed else None
        kept = appended.since(offset) if appended is not None else None
        if kept is not None:
            pieces = kept
            continue
        try:
            if not changed and os.stat(paths.events).st_size <= offset:
                pieces = []  # quiet, and nothing was written after what was sent: no read
                continue
            lines = read_events(paths, offset, read + 1)
        except FileNotFoundError:
            return
        except LogCorrupt as error:
            yield _error(f"run {paths.run_id!r}: corrupt log: {error}")
            return
        pieces = [_piece(lines)] if lines else []


def _piece(lines: list[tuple[int, bytes, Event]]) -> Piece:
    """Lines read from the log as a piece to send."""
    ends, data, events = (list(column) for column in zip(*lines, strict=True))
    return Piece.of(ends, data, events)


class _Writes:
    """The messages of a stream gathered into writes of about `BATCH_BYTES`."""

    def __init__(self) -> None:
        self.batch = bytearray()

    def add(self, piece: Piece, after: int) -> list[EncodedMessages]:
        """Add the messages of a piece's events after seq `after`: the writes that are full."""
        full = []
        if not piece.seqs or piece.seqs[-1] <= after:
            return full
        if piece.messages is not None and piece.seqs[0] > after:
            self.batch += piece.messages
        else:
            for seq, kind, line in zip(piece.seqs, piece.kinds, piece.lines, strict=True):
                if seq > after:
                    self.batch += sse_message(seq, kind, line)
                    if len(self.batch) >= BATCH_BYTES:
                        full += self.flush()
        if len(self.batch) >= BATCH_BYTES:
            full += self.flush()
        return full

    def flush(self) -> list[EncodedMessages]:
        """The write of what is gathered (none when nothing is)."""
        if not self.batch:
            return []
        write = EncodedMessages(encoded=bytes(self.batch))
        self.batch.clear()
        return [write]
