"""The server-sent event streams: the events of one run, and the runs and servers of the service.

A stream's messages go to its client through a `SubscriberQueue` of at most
`stream_queue_bytes`. A run's stream first catches up from the log, a chunk of `CHUNK_BYTES`
at a time and only as fast as the client takes them (the log holds the rest, so a stream of a
long log holds no more than a chunk and its queue); once it reached the end of the log it
follows the run: every append goes into its queue, and a client whose queue passes the bound
is too far behind and is closed. Its reconnect with `Last-Event-ID` catches up from the log,
so nothing is lost.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import Protocol

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

CHUNK_BYTES = 64 * 1024
"""About the most bytes of the log a stream reads at a time (whole lines; a longer line is
read whole)."""
TERMINAL_KINDS = frozenset(str(kind.__struct_config__.tag) for kind in TERMINAL_EVENTS)
"""The types of the events that end a run: a stream ends after the first of them."""
BATCH_BYTES = 64 * 1024
"""About the most bytes of event messages sent as one write: the events of one read of the log
go out together, so a subscriber costs a write per read, not one per event. After each write
the stream lets the loop run the transport's callbacks: a client reset in the middle of a
backlog is then seen after the first write that fails (asyncio warns after five writes to a
lost connection, `LOG_THRESHOLD_FOR_CONNLOST_WRITES`)."""


@dataclasses.dataclass
class EncodedMessages(ServerSentEventMessage):
    """Messages encoded already (`sse_message`), sent as one chunk of the body: litestar sends a
    `ServerSentEventMessage` as its `encode()` has it."""

    encoded: bytes = b""

    def encode(self) -> bytes:
        """The messages as they go out."""
        return self.encoded


def service_events(
    service: Service,
    group: str | None = None,
    owner: str | None = None,
    agent: str | None = None,
    state: RunState | None = None,
    connection: Connection | None = None,
    release: Callable[[], None] | None = None,
) -> AsyncIterator[ServerSentEventMessage]:
    """`runs` (the runs, filtered as `GET /runs`) and `servers`, each on connect and then when
    it changed: checked after every change of a run (the supervisor's signal), at most once
    per `events_poll_s`. The stream ends after `events_max_s`; a client that has not taken
    `stream_queue_bytes` of them is closed. `release` is called when the stream ends."""
    settings = service.settings

    async def produce(queue: SubscriberQueue, deadline: float) -> None:
        signal = service.supervisor.changed
        sent_runs = sent_servers = b""
        while True:
            checked = time.monotonic()
            version = signal.version
            runs = msgspec.json.encode(await service.runs(group, owner, agent, state))
            if runs != sent_runs:
                sent_runs = runs
                queue.put(ServerSentEventMessage(data=runs.decode(), event="runs").encode())
            servers = msgspec.json.encode(await service.backend.servers())
            if servers != sent_servers:
                sent_servers = servers
                message = ServerSentEventMessage(data=servers.decode(), event="servers")
                queue.put(message.encode())
            if queue.over():
                raise TooFarBehind
            if time.monotonic() >= deadline:
                return
            await signal.wait(deadline - time.monotonic(), since=version)
            pause = min(checked + settings.events_poll_s, deadline) - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)

    return subscription(
        produce, settings.stream_queue_bytes, settings.events_max_s, connection, release
    )


class Connection(Protocol):
    """What a stream may do to its client's connection (`simrun_api.server.ConnectionControl`)."""

    def bound_buffers(self, limit: int) -> None:
        """Hold at most about `limit` bytes the client has not taken below the stream."""

    def cut(self) -> None:
        """Cut the connection at once."""


class TooFarBehind(Exception):
    """A stream's client has not taken `stream_queue_bytes` of its messages."""


class SubscriberQueue:
    """The messages of a stream its client has not taken yet (at most about `limit` bytes
    when the stream keeps to the bound: `over` says when it does not)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self._chunks: collections.deque[bytes] = collections.deque()
        self._readable = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._ended = False

    def put(self, chunk: bytes) -> None:
        """Queue a chunk of messages (never waits)."""
        self._chunks.append(chunk)
        self.size += len(chunk)
        self._readable.set()
        if self.size >= self.limit:
            self._room.clear()

    def over(self) -> bool:
        """Whether it holds more than its bound."""
        return self.size > self.limit

    async def room(self, timeout: float) -> bool:
        """Wait until it holds less than its bound; False after `timeout` seconds."""
        if timeout <= 0:
            return self.size < self.limit
        try:
            await asyncio.wait_for(self._room.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def end(self) -> None:
        """No more will come: the client gets what is queued, then the stream ends."""
        self._ended = True
        self._readable.set()

    def drop(self) -> None:
        """Forget what is queued and end (a client too far behind)."""
        self._chunks.clear()
        self.size = 0
        self.end()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The chunks as they are queued, until it ended and is empty."""
        while True:
            while not self._chunks:
                if self._ended:
                    return
                self._readable.clear()
                await self._readable.wait()
            chunk = self._chunks.popleft()
            self.size -= len(chunk)
            if self.size < self.limit:
                self._room.set()
            yield chunk


Producer = Callable[[SubscriberQueue, float], Awaitable[None]]
"""What fills a stream's queue until the stream's deadline (its second argument, a
`time.monotonic()`): returns at the end of the stream; raises TooFarBehind."""


def subscription(
    produce: Producer,
    limit: int,
    max_s: float,
    connection: Connection | None = None,
    release: Callable[[], None] | None = None,
) -> AsyncIterator[ServerSentEventMessage]:
    """The messages `produce` queues, as a stream's body: `produce` runs in a task of its own,
    so a client that does not take them holds at most the queue's bound (and `connection`'s
    buffers, bound to it), never the whole of what the stream would send.

    A client too far behind (TooFarBehind) is closed at once, what was queued for it
    forgotten; a client that has not taken the rest `max_s` after the stream began (at least
    `CLOSE_GRACE_S` after its end) is closed then. `release` is called once the stream ended,
    or when it is dropped without having begun."""
    if connection is not None:
        connection.bound_buffers(limit)
    stream = _subscription(produce, limit, max_s, connection, release)
    if release is not None:
        weakref.finalize(stream, release)
    return stream


CLOSE_GRACE_S = 10.0
"""How long a client gets for the last messages of a stream that ended after its deadline."""


async def _subscription(
    produce: Producer,
    limit: int,
    max_s: float,
    connection: Connection | None,
    release: Callable[[], None] | None,
) -> AsyncIterator[ServerSentEventMessage]:
    queue = SubscriberQueue(limit)
    deadline = time.monotonic() + max_s

    def close() -> None:
        queue.drop()
        if connection is not None:
            connection.cut()

    failures: list[Exception] = []

    async def run() -> None:
        try:
            await produce(queue, deadline)
        except TooFarBehind:
            close()
            return
        except Exception as error:  # the stream's: raised where it is sent
            failures.append(error)
            return
        finally:
            queue.end()
        # The client takes the rest in time, or it is closed (this task is cancelled when the
        # stream ends).
        await asyncio.sleep(max(deadline - time.monotonic(), CLOSE_GRACE_S))
        close()

    producer = asyncio.create_task(run())
    try:
        async for chunk in queue.chunks():
            yield EncodedMessages(encoded=chunk)
            await asyncio.sleep(0)  # see BATCH_BYTES
        if failures:
            raise failures[0]
    finally:
        producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producer
        if release is not None:
            release()


def read_chunk(
    paths: RunPaths, offset: int = 0, line_at: int = 1, limit: int = CHUNK_BYTES
) -> list[tuple[int, bytes, Event]]:
    """The whole lines of a run's log from byte `offset`, line `line_at`, about `limit` bytes
    of them (a line longer than that whole): (end offset, line, event). FileNotFoundError for
    a removed run; LogCorrupt naming the file and the line."""
    lines = []
    reading = iter_lines(paths.events, offset, line_at)
    try:
        for line in reading:
            lines.append(line)
            if line[0] - offset >= limit:
                break
    finally:
        if isinstance(reading, Generator):
            reading.close()  # its file, now
    return lines


def read_whole(lines: list[tuple[int, bytes, Event]], offset: int, limit: int) -> bool:
    """Whether a read of `read_chunk` from `offset` stopped at its limit (more may follow)."""
    return bool(lines) and lines[-1][0] - offset >= limit


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


def run_events(
    service: Service,
    paths: RunPaths,
    after: int,
    first: list[tuple[int, bytes, Event]],
    views: bool = False,
    connection: Connection | None = None,
    release: Callable[[], None] | None = None,
) -> AsyncIterator[ServerSentEventMessage]:
    """Every event of a run after `after`, `id` its `seq`, `first` the lines of the log's
    first chunk, read before the stream began (`read_chunk`); ends after the run's last event,
    when the run was removed, or after `events_max_s`. A line that cannot be read later ends
    it with a message `error`, its data `{"status_code": 500, "detail": ...}` naming the file
    and the line.

    The log is read a chunk at a time as the client takes the messages; once the stream
    reached its end, the lines after come from the actor's last appends while the stream
    keeps up (`simrun_api.appended`: their messages encoded once for every stream), else from
    the log, and a client more than `stream_queue_bytes` behind is closed (module docstring).

    With `views`, after the events read at a time also `RunViews`' messages `run`, `progress`
    and `workers`, each on connect and when it changed, so a client sees the run as
    `GET /runs/{run}` has it without folding events (a log that does not fold ends the
    stream with a message `error`).
    """
    settings = service.settings

    async def produce(queue: SubscriberQueue, deadline: float) -> None:
        await _produce_run_events(service, paths, after, first, views, queue, deadline)

    return subscription(
        produce, settings.stream_queue_bytes, settings.events_max_s, connection, release
    )


async def _produce_run_events(
    service: Service,
    paths: RunPaths,
    after: int,
    first: list[tuple[int, bytes, Event]],
    views: bool,
    queue: SubscriberQueue,
    deadline: float,
) -> None:
    """Queue the messages of `run_events` until the stream ends."""
    offset = 0
    read = 0  # the lines read
    pieces = [_piece(first)] if first else []
    more = read_whole(first, 0, CHUNK_BYTES)  # the log may go on after what was read
    following = False  # it reached the end of the log once: appends go to the queue at once
    watch = RunViews(paths) if views else None
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
                    writes.add(piece.part(failure[0]), after, queue)
                    writes.flush(queue)
                    queue.put(_error(f"run {paths.run_id!r}: {failure[1]}").encode())
                    return
            writes.add(piece, after, queue)
            after = max(after, piece.seqs[-1])
        writes.flush(queue)
        if watch is not None:
            for message in await watch.messages():
                queue.put(message.encode())
        if ended or time.monotonic() > deadline:
            return
        following = following or not more
        if following and queue.over():
            raise TooFarBehind
        if more:
            # Catching up: the next chunk once the client took enough of the last one.
            if not following and not await queue.room(deadline - time.monotonic()):
                return
            changed = True
        else:
            changed = False
            if signal is not None:
                changed = await signal.wait(service.settings.events_poll_s, since=version)
            else:
                await asyncio.sleep(service.settings.events_poll_s)
            # After an append, its lines as the actor kept them; after a quiet poll interval,
            # the log itself (what else came to be there, a line written over, is read then).
            appended = service.supervisor.appended(paths.run_id) if changed else None
            kept = appended.since(offset) if appended is not None else None
            if kept is not None:
                pieces = kept
                continue
        try:
            if not changed and os.stat(paths.events).st_size <= offset:
                pieces = []  # quiet, and nothing was written after what was sent: no read
                continue
            lines = read_chunk(paths, offset, read + 1)
        except FileNotFoundError:
            return
        except LogCorrupt as error:
            queue.put(_error(f"run {paths.run_id!r}: corrupt log: {error}").encode())
            return
        more = read_whole(lines, offset, CHUNK_BYTES)
        pieces = [_piece(lines)] if lines else []


def _piece(lines: list[tuple[int, bytes, Event]]) -> Piece:
    """Lines read from the log as a piece to send."""
    ends, data, events = (list(column) for column in zip(*lines, strict=True))
    return Piece.of(ends, data, events)


class _Writes:
    """The messages of a stream gathered into writes of about `BATCH_BYTES`."""

    def __init__(self) -> None:
        self.batch = bytearray()

    def add(self, piece: Piece, after: int, queue: SubscriberQueue) -> None:
        """Add the messages of a piece's events after seq `after`; queue the writes that are
        full."""
        if not piece.seqs or piece.seqs[-1] <= after:
            return
        if piece.messages is not None and piece.seqs[0] > after:
            self.batch += piece.messages
        else:
            for seq, kind, line in zip(piece.seqs, piece.kinds, piece.lines, strict=True):
                if seq > after:
                    self.batch += sse_message(seq, kind, line)
                    if len(self.batch) >= BATCH_BYTES:
                        self.flush(queue)
        if len(self.batch) >= BATCH_BYTES:
            self.flush(queue)

    def flush(self, queue: SubscriberQueue) -> None:
        """Queue the write of what is gathered (none when nothing is)."""
        if self.batch:
            queue.put(bytes(self.batch))
            self.batch.clear()
