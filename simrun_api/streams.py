"""The server-sent event streams: the events of one run, and the runs and servers of the service."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import msgspec
from litestar.response import ServerSentEventMessage

from simrun_api.service import Service
from simrun_api.workers import claims_by_worker, worker_views
from simrun_core import events as ev
from simrun_core.events import TERMINAL_EVENTS, Event, UnknownEvent
from simrun_core.fold import FoldError, RunFold
from simrun_core.states import RunState
from simrun_core.store import LogCorrupt, RunPaths, iter_lines
from simrun_core.views import progress_view, run_view
from simrun_core.wire import WorkerView

YIELD_EVERY = 1
"""Writes of a backlog sent between two turns of the event loop: fewer than the writes to a
lost connection after which asyncio warns (`LOG_THRESHOLD_FOR_CONNLOST_WRITES`, 5); one, since
a write is a batch of up to `BATCH_BYTES` and a client reset mid-backlog must be seen after the
first that fails (with 4 the warning came once in a while)."""
BATCH_BYTES = 64 * 1024
"""About the most bytes of event messages sent as one write: the events of one read of the log
go out together, so a subscriber costs a write per read, not one per event."""


@dataclasses.dataclass
class EncodedMessages(ServerSentEventMessage):
    """Messages encoded already (`_message`), sent as one chunk of the body: litestar sends a
    `ServerSentEventMessage` as its `encode()` has it."""

    encoded: bytes = b""

    def encode(self) -> bytes:
        """The messages as they go out."""
        return self.encoded


def _message(seq: int, kind: str, line: bytes) -> bytes:
    """The message of one event as litestar encodes it (`id`, `event`, `data`, a blank line):
    the data is the log's line, JSON of one line."""
    return b"id: %d\r\nevent: %s\r\ndata: %s\r\n\r\n" % (seq, kind.encode(), line.rstrip(b"\n"))


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

    def apply(self, event: Event) -> None:
        """Fold one event; FoldError for one that does not follow the ones before."""
        self.fold.apply(event)
        if isinstance(event, WORKER_EVENTS):
            self.of_task.setdefault(event.task, []).append(event)
            self.touched.add(event.task)

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

    With `views`, after the events read at a time also `RunViews`' messages `run`, `progress`
    and `workers`, each on connect and when it changed, so a client sees the run as
    `GET /runs/{run}` has it without folding events (a log that does not fold ends the
    stream with a message `error`).
    """
    offset = 0
    read = 0  # the lines read
    sent = 0
    lines = first
    watch = RunViews(paths) if views else None
    deadline = time.monotonic() + service.settings.events_max_s
    while True:
        signal = service.supervisor.signal(paths.run_id)
        version = signal.version if signal is not None else 0
        ended = False
        read += len(lines)
        batch = bytearray()
        for end, line, event in lines:
            offset = end
            ended = isinstance(event, TERMINAL_EVENTS)
            if watch is not None:
                try:
                    watch.apply(event)
                except FoldError as error:
                    if batch:
                        yield EncodedMessages(encoded=bytes(batch))
                    yield _error(f"run {paths.run_id!r}: {error}")
                    return
            if event.seq <= after:
                continue
            after = event.seq
            kind = event.kind if isinstance(event, UnknownEvent) else event.__struct_config__.tag
            batch += _message(event.seq, str(kind), line)
            if len(batch) >= BATCH_BYTES:
                yield EncodedMessages(encoded=bytes(batch))
                batch.clear()
                sent += 1
                if sent % YIELD_EVERY == 0:
                    # Let the loop run the transport's callbacks: a client gone in the middle
                    # of a backlog is then seen after one failed write, not warned about for
                    # each.
                    await asyncio.sleep(0)
        if batch:
            yield EncodedMessages(encoded=bytes(batch))
            sent += 1
        if watch is not None:
            for message in await watch.messages():
                yield message
        if ended or time.monotonic() > deadline:
            return
        if signal is not None:
            await signal.wait(service.settings.events_poll_s, since=version)
        else:
            await asyncio.sleep(service.settings.events_poll_s)
        try:
            lines = read_events(paths, offset, read + 1)
        except FileNotFoundError:
            return
        except LogCorrupt as error:
            yield _error(f"run {paths.run_id!r}: corrupt log: {error}")
            return
