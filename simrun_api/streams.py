"""The server-sent event streams: the events of one run, and the runs and servers of the service.

What a stream's client has not taken yet waits in its connection's buffers, bound to
`stream_queue_bytes` (`StreamBound`): the kernel's send buffer and the transport's. A run's
stream first catches up from the log, a chunk of `CHUNK_BYTES` at a time and only as fast as
the client takes them (a write waits while the buffers are full; the log holds the rest, so a
stream of a long log holds no more than a chunk and its buffers); once it reached the end of
the log it follows the run: every append is written at once, and a client with more than the
bound not taken is too far behind and is cut. Its reconnect with `Last-Event-ID` catches up
from the log, so nothing is lost. A stream is one generator driven by the response. On the
service's own server a stream of a live run that reached the end of the log joins the run's
broadcast (`simrun_api.broadcast`) and waits there: each append is encoded and framed once and
written to every follower by the broadcast, and costs a follower no wake at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable, Generator
from typing import Protocol

import msgspec
from litestar.response import ServerSentEventMessage

from simrun_api.appended import Piece, event_kind, sse_message
from simrun_api.broadcast import TERMINAL_KINDS, Left
from simrun_api.service import Service
from simrun_api.workers import claims_by_worker, worker_views
from simrun_core import events as ev
from simrun_core.events import Event
from simrun_core.fold import FoldError, RunFold
from simrun_core.states import RunState
from simrun_core.store import LogCorrupt, RunPaths, iter_lines
from simrun_core.views import progress_view, run_view
from simrun_core.wire import WorkerView

CHUNK_BYTES = 64 * 1024
"""About the most bytes of the log a stream reads at a time (whole lines; a longer line is
read whole)."""
BATCH_BYTES = 64 * 1024
"""About the most bytes of event messages sent as one write: the events of one read of the log
go out together, so a subscriber costs a write per read, not one per event. After each write
of a backlog the stream lets the loop run the transport's callbacks: a client reset in the
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
    per `events_poll_s`. The stream ends after `events_max_s`; a client more than
    `stream_queue_bytes` behind is cut. `release` is called when the stream ends."""
    settings = service.settings
    bound = StreamBound(connection, settings.stream_queue_bytes, settings.events_max_s, release)
    return bound.guard(_service_events(service, group, owner, agent, state, bound))


async def _service_events(
    service: Service,
    group: str | None,
    owner: str | None,
    agent: str | None,
    state: RunState | None,
    bound: StreamBound,
) -> AsyncIterator[ServerSentEventMessage]:
    settings = service.settings
    signal = service.supervisor.changed
    sent_runs = sent_servers = b""
    while True:
        checked = time.monotonic()
        version = signal.version
        if bound.behind():
            return  # it has not taken what came before
        runs = msgspec.json.encode(await service.runs(group, owner, agent, state))
        if runs != sent_runs:
            sent_runs = runs
            yield ServerSentEventMessage(data=runs.decode(), event="runs")
        servers = msgspec.json.encode(await service.backend.servers())
        if servers != sent_servers:
            sent_servers = servers
            yield ServerSentEventMessage(data=servers.decode(), event="servers")
        if time.monotonic() >= bound.deadline:
            return
        await signal.wait(bound.deadline - time.monotonic(), since=version)
        pause = min(checked + settings.events_poll_s, bound.deadline) - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)


class Connection(Protocol):
    """What a stream may do to its client's connection (`simrun_api.server.ConnectionControl`)."""

    def bound_buffers(self, limit: int) -> None:
        """Hold at most about `limit` bytes the client has not taken below the stream."""

    def unsent(self) -> int:
        """The bytes written that wait in the transport for the client."""

    def cut(self) -> None:
        """Cut the connection at once."""

    def closing(self) -> bool:
        """Whether the connection is closed or closing."""

    def chunked(self) -> bool:
        """Whether the response's body goes out as HTTP/1.1 chunks."""

    def write(self, data: bytes) -> bool:
        """Write bytes of the response's body as they go on the wire; False when closing."""


CLOSE_GRACE_S = 10.0
"""How long after its deadline a stream whose client takes nothing is left before it is cut."""


class StreamBound:
    """The bounds of one stream: `limit` bytes its client has not taken (in `connection`'s
    buffers; without a connection, as another server runs the app, none), `max_s` seconds
    (`deadline`, a `time.monotonic()`), and its place among the identity's streams
    (`release`, called once when the stream ends or is dropped unstarted)."""

    def __init__(
        self,
        connection: Connection | None,
        limit: int,
        max_s: float,
        release: Callable[[], None] | None = None,
    ) -> None:
        self.connection = connection
        self.limit = limit
        self.deadline = time.monotonic() + max_s
        self.release = release
        self._timer: asyncio.TimerHandle | None = None
        if connection is not None:
            connection.bound_buffers(limit)

    def behind(self) -> bool:
        """Whether the client has not taken the bound's worth: the kernel's buffer and the
        transport's half (`bound_buffers`) hold that much. Then it is cut (True)."""
        connection = self.connection
        if connection is None or connection.unsent() <= self.limit // 2:
            return False
        connection.cut()
        return True

    def gone(self) -> bool:
        """Whether the client went away (or was cut): the stream ends (without a connection,
        the server's disconnect ends it)."""
        return self.connection is not None and self.connection.closing()

    def guard(
        self, messages: AsyncIterator[ServerSentEventMessage]
    ) -> AsyncIterator[ServerSentEventMessage]:
        """The stream of `messages` within these bounds."""
        stream = self._guarded(messages)
        if self.release is not None:
            weakref.finalize(stream, self.release)  # a response dropped before it began
        return stream

    async def _guarded(
        self, messages: AsyncIterator[ServerSentEventMessage]
    ) -> AsyncIterator[ServerSentEventMessage]:
        if self.connection is not None:
            # A client that takes nothing keeps a write waiting past the deadline: cut it.
            loop = asyncio.get_running_loop()
            wait = self.deadline - time.monotonic() + CLOSE_GRACE_S
            self._timer = loop.call_later(wait, self.connection.cut)
        try:
            async for message in messages:
                yield message
                del message  # not held while the next one is awaited
        finally:
            if self._timer is not None:
                self._timer.cancel()
            if self.release is not None:
                self.release()
            aclose = getattr(messages, "aclose", None)
            if aclose is not None:
                await aclose()


def read_chunk(
    paths: RunPaths,
    offset: int = 0,
    line_at: int = 1,
    limit: int = CHUNK_BYTES,
    events: bool = False,
) -> Piece | None:
    """The whole lines of a run's log from byte `offset`, line `line_at`, about `limit` bytes
    of them (a line longer than that whole), None when there is none: with their events when
    `events` (else only their seqs and types: a decoded `units-done` takes many times the
    memory of its line). FileNotFoundError for a removed run; LogCorrupt naming the file and
    the line."""
    ends: list[int] = []
    lines: list[bytes] = []
    seqs: list[int] = []
    kinds: list[str] = []
    kept: list[Event] = []
    reading = iter_lines(paths.events, offset, line_at)
    try:
        for end, line, event in reading:
            ends.append(end)
            lines.append(line)
            seqs.append(event.seq)
            kinds.append(event_kind(event))
            if events:
                kept.append(event)
            if end - offset >= limit:
                break
    finally:
        if isinstance(reading, Generator):
            reading.close()  # its file, now
    if not lines:
        return None
    return Piece(ends, lines, seqs, kinds, kept if events else None)


def read_whole(piece: Piece | None, offset: int, limit: int = CHUNK_BYTES) -> bool:
    """Whether a read of `read_chunk` from `offset` stopped at its limit (more may follow)."""
    return piece is not None and piece.ends[-1] - offset >= limit


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
    first: Piece | None,
    views: bool = False,
    connection: Connection | None = None,
    release: Callable[[], None] | None = None,
) -> AsyncIterator[ServerSentEventMessage]:
    """Every event of a run after `after`, `id` its `seq`, `first` the log's first chunk,
    read before the stream began (`read_chunk`, with its events for `views`); ends after the
    run's last event, when the run was removed, or after `events_max_s`. A line that cannot be
    read later ends it with a message `error`, its data `{"status_code": 500, "detail": ...}`
    naming the file and the line.

    The log is read a chunk at a time as the client takes the messages; once the stream
    reached its end, the lines after come from the actor's last appends while the stream
    keeps up (`simrun_api.appended`: their messages encoded once for every stream), else from
    the log, and a client more than `stream_queue_bytes` behind is cut (module docstring).

    With `views`, after the events read at a time also `RunViews`' messages `run`, `progress`
    and `workers`, each on connect and when it changed, so a client sees the run as
    `GET /runs/{run}` has it without folding events (a log that does not fold ends the
    stream with a message `error`).
    """
    settings = service.settings
    bound = StreamBound(connection, settings.stream_queue_bytes, settings.events_max_s, release)
    pieces = [first] if first is not None else []
    more = read_whole(first, 0)
    return bound.guard(_run_events(service, paths, after, pieces, more, views, bound))


async def _run_events(
    service: Service,
    paths: RunPaths,
    after: int,
    pieces: list[Piece],
    more: bool,
    views: bool,
    bound: StreamBound,
) -> AsyncIterator[ServerSentEventMessage]:
    """The messages of `run_events` from `pieces` on; `more`: the log may go on at once."""
    offset = 0
    read = 0  # the lines read
    following = False  # it reached the end of the log once: appends are written at once
    watch = RunViews(paths) if views else None
    writes = _Writes()
    piece: Piece | None = None
    message: ServerSentEventMessage | None = None
    kept: list[Piece] | None = None
    while True:
        if bound.gone() or (following and pieces and bound.behind()):
            return  # gone, or it has not taken what came before these
        feed = service.supervisor.feed(paths.run_id)
        version = feed.version if feed is not None else 0
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
                if not following:
                    await asyncio.sleep(0)  # see BATCH_BYTES
            after = max(after, piece.seqs[-1])
        for message in writes.flush():
            yield message
        if watch is not None:
            for message in await watch.messages():
                yield message
        # Sent: none of it is held while the stream waits (2,000 followers of a live run held
        # ~40 MiB of the lines of their last read, whose objects then kept the allocator's
        # arenas from being given back after they left).
        pieces, piece, message, kept = [], None, None, None
        if ended or time.monotonic() > bound.deadline:
            return
        following = following or not more
        if not more and watch is None:
            left = await _follow(service, paths, bound, Left("read", offset, after, read))
            if left is not None:
                if left.reason != "read":
                    return
                offset, after, read, more = left.offset, left.seq, left.lines, True
        if more:
            changed = True  # catching up: the next chunk (a write waits for the client)
        else:
            changed = False
            if feed is not None:
                changed = await feed.wait(service.settings.events_poll_s, since=version)
            else:
                await asyncio.sleep(service.settings.events_poll_s)
            # After an append, its lines as the actor kept them; after a quiet poll interval,
            # the log itself (what else came to be there, a line written over, is read then).
            feed = service.supervisor.feed(paths.run_id) if changed else None
            kept = feed.since(offset) if feed is not None else None
            if kept is not None:
                pieces = kept
                continue
        try:
            if not changed and os.stat(paths.events).st_size <= offset:
                continue  # quiet, and nothing was written after what was sent: no read
            chunk = read_chunk(paths, offset, read + 1, events=views)
        except FileNotFoundError:
            return
        except LogCorrupt as error:
            yield _error(f"run {paths.run_id!r}: corrupt log: {error}")
            return
        more = read_whole(chunk, offset)
        pieces = [chunk] if chunk is not None else []
        del chunk


async def _follow(service: Service, paths: RunPaths, bound: StreamBound, at: Left) -> Left | None:
    """Follow the live run in its broadcast (`simrun_api.broadcast`) from `at`, where the
    stream is at the end of the log: how it left; None when it cannot join (no actor, no
    chunked body, a position the broadcast is not at: the stream follows by itself)."""
    connection = bound.connection
    feed = service.supervisor.feed(paths.run_id)
    if connection is None or feed is None or not connection.chunked():
        return None
    broadcast = feed.broadcast
    poll_s = service.settings.events_poll_s
    follower = broadcast.join(connection, bound.limit, bound.deadline, at, paths.events, poll_s)
    if follower is None:
        return None
    try:
        return await follower.left
    finally:
        broadcast.leave(follower)


class _Writes:
    """The messages of a stream gathered into writes of about `BATCH_BYTES`."""

    def __init__(self) -> None:
        self.batch = bytearray()

    def add(self, piece: Piece, after: int) -> list[EncodedMessages]:
        """Add the messages of a piece's events after seq `after`: the writes that are full."""
        full: list[EncodedMessages] = []
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
