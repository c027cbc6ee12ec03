"""A run's event stream sends the events of one read of its log together, as litestar would
have encoded each of them."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
import types
from collections.abc import AsyncIterator
from pathlib import Path

from litestar.response.sse import ServerSentEventMessage

from simrun_api import streams
from simrun_api.run_feed import RunFeed
from simrun_core import events as ev
from simrun_core.store import LogWriter, RunPaths
from simrun_core.workflow import Workflow

RUN = "20260101-000000-abcdef"


def _service() -> types.SimpleNamespace:
    """What `run_events` reads of the service: its timings, and no live actor (so it polls)."""
    settings = types.SimpleNamespace(
        events_max_s=5.0, events_poll_s=0.01, stream_queue_bytes=128 * 1024
    )
    return types.SimpleNamespace(
        settings=settings,
        supervisor=types.SimpleNamespace(feed=lambda run_id: None),
    )


def _log(store: Path, units: int) -> tuple[RunPaths, list[bytes]]:
    """A run's log: submitted, `units` unit-done events and its end; its lines."""
    paths = RunPaths(store, RUN)
    workflow = Workflow(name="w", tasks=[])
    events: list[ev.Event] = [
        ev.Submitted(seq=1, run=RUN, workflow=workflow, submitted_by="mk", owner="mk")
    ]
    events += [
        ev.UnitDone(seq=2 + index, task="t", index=index, worker="w0") for index in range(units)
    ]
    events.append(ev.Succeeded(seq=2 + units))
    writer = LogWriter(paths.events)
    writer.append(*events)
    writer.close()
    return paths, paths.events.read_bytes().splitlines(keepends=True)


def _sent(paths: RunPaths, after: int = 0) -> list[bytes]:
    async def collect() -> list[bytes]:
        first = streams.read_chunk(paths)
        return [
            message.encode()
            async for message in streams.run_events(_service(), paths, after, first)
        ]

    return asyncio.run(collect())


def test_a_backlog_goes_out_in_one_write_each_message_as_litestar_encodes_it(
    tmp_path: Path,
) -> None:
    paths, lines = _log(tmp_path, 50)
    kinds = ["submitted"] + ["unit-done"] * 50 + ["succeeded"]
    expected = b"".join(
        ServerSentEventMessage(data=line.rstrip(b"\n").decode(), event=kind, id=seq).encode()
        for seq, (kind, line) in enumerate(zip(kinds, lines, strict=True), 1)
    )
    sent = _sent(paths)
    assert len(sent) == 1
    assert sent[0] == expected


def test_a_large_backlog_is_cut_into_writes_of_about_batch_bytes(tmp_path: Path) -> None:
    paths, lines = _log(tmp_path, 3000)
    sent = _sent(paths, after=1)
    assert len(sent) > 1
    assert all(len(chunk) < streams.BATCH_BYTES + 1000 for chunk in sent)
    joined = b"".join(sent)
    assert joined.count(b"\r\n\r\n") == len(lines) - 1  # every event after the first, once
    assert joined.startswith(b"id: 2\r\nevent: unit-done\r\n")


def test_a_stream_of_a_live_run_sends_the_actors_appends_without_reading_the_log(
    tmp_path: Path,
) -> None:
    """After its first read a stream that keeps up takes the lines the actor appended from
    its feed (`RunFeed`): here the log is gone meanwhile, and the stream still sends them,
    encoded as the log's lines are."""
    paths = RunPaths(tmp_path, RUN)
    workflow = Workflow(name="w", tasks=[])
    writer = LogWriter(paths.events)
    writer.append(ev.Submitted(seq=1, run=RUN, workflow=workflow, submitted_by="mk", owner="mk"))
    feed = RunFeed()
    service = _service()
    service.supervisor = types.SimpleNamespace(feed=lambda run_id: feed)
    later = [
        [ev.UnitDone(seq=2, task="t", index=0, worker="w0")],
        [ev.UnitDone(seq=3, task="t", index=1, worker="w0"), ev.Succeeded(seq=4)],
    ]

    async def main() -> list[bytes]:
        first = streams.read_chunk(paths)
        stream = streams.run_events(service, paths, 0, first)
        sent = [(await anext(stream)).encode()]
        paths.events.rename(tmp_path / "elsewhere.jsonl")
        for events in later:
            start = writer.length
            feed.published(start, writer.append(*events), events)
            sent.append((await anext(stream)).encode())
        assert [message async for message in stream] == []
        return sent

    sent = asyncio.run(main())
    writer.close()
    lines = (tmp_path / "elsewhere.jsonl").read_bytes().splitlines(keepends=True)
    kinds = ["submitted", "unit-done", "unit-done", "succeeded"]
    messages = [
        ServerSentEventMessage(data=line.rstrip(b"\n").decode(), event=kind, id=seq).encode()
        for seq, (kind, line) in enumerate(zip(kinds, lines, strict=True), 1)
    ]
    assert sent == [messages[0], messages[1], messages[2] + messages[3]]


class _Connection:
    """A stream's connection on the service's server: chunked, everything taken at once."""

    def __init__(self) -> None:
        self.written = 0

    def bound_buffers(self, limit: int) -> None:
        pass

    def unsent(self) -> int:
        return 0

    def cut(self) -> None:
        pass

    def closing(self) -> bool:
        return False

    def chunked(self) -> bool:
        return True

    def write(self, data: bytes) -> bool:
        self.written += len(data)
        return True


async def _sent_all(stream: AsyncIterator[ServerSentEventMessage]) -> None:
    """Send every message of a stream, as the response does (holding none while it waits)."""
    async for message in stream:
        message.encode()
        del message


def test_a_stream_that_follows_its_run_holds_nothing_of_the_log_it_sent(tmp_path: Path) -> None:
    """Streams that sent a log of ~50 KiB and follow the live run in its broadcast hold a few
    KiB each, not the lines of their last read: 2,000 followers of one run held ~40 MiB of them,
    and their objects kept the allocator's memory from going back after they left."""
    paths = RunPaths(tmp_path, RUN)
    workflow = Workflow(name="w", tasks=[])
    writer = LogWriter(paths.events)
    writer.append(ev.Submitted(seq=1, run=RUN, workflow=workflow, submitted_by="mk", owner="mk"))
    units = [ev.UnitDone(seq=2 + n, task="t", index=n, worker="w0") for n in range(700)]
    start = writer.length
    feed = RunFeed()
    feed.published(start, writer.append(*units), units)  # the actor's last append
    writer.close()
    assert 40_000 < paths.events.stat().st_size < streams.CHUNK_BYTES  # one read each
    service = _service()
    service.settings.events_max_s = service.settings.events_poll_s = 60.0
    service.supervisor = types.SimpleNamespace(feed=lambda run_id: feed)
    count = 50

    async def main() -> int:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            connection = _Connection()
            waiting = []
            for _ in range(count):
                first = streams.read_chunk(paths)
                stream = streams.run_events(service, paths, 0, first, connection=connection)
                del first
                waiting.append(asyncio.ensure_future(_sent_all(stream)))
            deadline = time.monotonic() + 10
            while len(feed.broadcast.followers) < count and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            assert len(feed.broadcast.followers) == count
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return held

    held = asyncio.run(main())
    assert held / count < 8 * 1024, f"{held / count:.0f} bytes held per stream"


def test_the_response_of_a_stream_holds_nothing_of_what_it_sent() -> None:
    """While a stream waits for its run (a follower, for as long as the run goes on) its
    response holds none of its last write."""
    from simrun_api.event_response import _Sending

    class Started:
        async def start_response(self, send: object) -> None:
            pass

    waiting = asyncio.Event()
    written: list[int] = []

    async def messages() -> AsyncIterator[ServerSentEventMessage]:
        yield streams.EncodedMessages(encoded=b"x" * 4 * 1024**2)
        waiting.set()
        await asyncio.Event().wait()  # the run goes on
        yield streams.EncodedMessages()

    async def send(message: dict[str, object]) -> None:
        body = message.get("body")
        written.append(len(body) if isinstance(body, bytes) else 0)

    async def main() -> int:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            response = _Sending(Started(), messages())  # type: ignore[arg-type]
            task = asyncio.ensure_future(response({}, None, send))  # type: ignore[arg-type]
            await asyncio.wait_for(waiting.wait(), 10)
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return held

    held = asyncio.run(main())
    assert written[0] == 4 * 1024**2
    assert held < 1024**2, f"{held} bytes held"
