"""The server-sent event streams: the events of one run, and the runs and servers of the service."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import msgspec
from litestar.response import ServerSentEventMessage

from simrun_api.service import Service
from simrun_core.events import TERMINAL_EVENTS, Event, UnknownEvent
from simrun_core.states import RunState
from simrun_core.store import LogCorrupt, RunPaths, iter_lines

YIELD_EVERY = 4
"""Messages of a backlog sent between two turns of the event loop: fewer than the writes to a
lost connection after which asyncio warns (`LOG_THRESHOLD_FOR_CONNLOST_WRITES`, 5)."""


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


async def run_events(
    service: Service, paths: RunPaths, after: int, first: list[tuple[int, bytes, Event]]
) -> AsyncIterator[ServerSentEventMessage]:
    """Every event of a run after `after`, `id` its `seq`, `first` the lines read before the
    stream began (`read_events`); ends after the run's last event, when the run was removed,
    or after `events_max_s`. A line that cannot be read later ends it with a message `error`,
    its data `{"status_code": 500, "detail": ...}` naming the file and the line."""
    offset = 0
    read = 0  # the lines read
    sent = 0
    lines = first
    deadline = time.monotonic() + service.settings.events_max_s
    while True:
        signal = service.supervisor.signal(paths.run_id)
        version = signal.version if signal is not None else 0
        ended = False
        read += len(lines)
        for end, line, event in lines:
            offset = end
            ended = isinstance(event, TERMINAL_EVENTS)
            if event.seq <= after:
                continue
            after = event.seq
            kind = event.kind if isinstance(event, UnknownEvent) else event.__struct_config__.tag
            yield ServerSentEventMessage(
                data=line.rstrip(b"\n").decode(), event=str(kind), id=event.seq
            )
            sent += 1
            if sent % YIELD_EVERY == 0:
                # Let the loop run the transport's callbacks: a client gone in the middle of a
                # backlog is then seen after one failed write, not warned about for each.
                await asyncio.sleep(0)
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
            detail = f"run {paths.run_id!r}: corrupt log: {error}"
            data = msgspec.json.encode({"status_code": 500, "detail": detail}).decode()
            yield ServerSentEventMessage(data=data, event="error")
            return
