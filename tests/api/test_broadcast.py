"""A live run's appends go to the streams that follow it from one broadcast: encoded and framed
once, the same bytes for every follower, each follower leaving with where it is."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from service_helpers import start_configured_service, stop_configured_service
from sse_sockets import messages, open_stream, read_to_end

from simrun_api.appended import AppendedLines, event_kind, sse_message
from simrun_api.broadcast import Left
from simrun_core import events as ev
from simrun_core.store import encode_event


class Connection:
    """A follower's connection: what was written to it, what its client has not taken."""

    def __init__(self, unsent: int = 0) -> None:
        self.written: list[bytes] = []
        self.untaken = unsent
        self.closed = False

    def write(self, data: bytes) -> bool:
        if self.closed:
            return False
        self.written.append(data)
        return True

    def unsent(self) -> int:
        return self.untaken

    def closing(self) -> bool:
        return self.closed

    def cut(self) -> None:
        self.closed = True


def _append(kept: AppendedLines, start: int, *events: ev.Event) -> int:
    """The actor's append of `events` at `start`; the offset after it."""
    lines = [encode_event(event) for event in events]
    kept.add(start, lines, list(events))
    return start + sum(map(len, lines))


def _unit(seq: int) -> ev.UnitDone:
    return ev.UnitDone(seq=seq, task="t", index=seq, worker="w0")


def _chunk(*events: ev.Event) -> bytes:
    """The messages of `events` as one chunk of an HTTP/1.1 body."""
    data = b"".join(sse_message(e.seq, event_kind(e), encode_event(e)) for e in events)
    return b"%x\r\n" % len(data) + data + b"\r\n"


def _join(kept: AppendedLines, connection: Connection, at: Left, deadline: float = 1e9):
    return kept.broadcast.join(connection, 4096, deadline, at, Path("/nonexistent"), 60.0)


def test_followers_get_each_append_as_one_chunk_the_same_bytes_for_all() -> None:
    async def main() -> None:
        kept = AppendedLines()
        head = _append(kept, 100, _unit(2))
        first, second, elsewhere = Connection(), Connection(), Connection()
        assert _join(kept, first, Left("read", head, 2, 2)) is not None
        assert _join(kept, second, Left("read", head, 2, 2)) is not None
        # Not where the broadcast is (behind it, or a Last-Event-ID ahead of the log): refused.
        assert _join(kept, elsewhere, Left("read", 100, 1, 1)) is None
        assert _join(kept, elsewhere, Left("read", head, 5, 2)) is None
        end = _append(kept, head, _unit(3), _unit(4))
        _append(kept, end, _unit(5))
        await asyncio.sleep(0.01)
        assert first.written == [_chunk(_unit(3), _unit(4)), _chunk(_unit(5))]
        assert all(a is b for a, b in zip(first.written, second.written, strict=True))
        assert elsewhere.written == []

    asyncio.run(main())


def test_a_follower_leaves_with_where_it_is() -> None:
    async def main() -> None:
        kept = AppendedLines()
        head = _append(kept, 0, _unit(2))
        reading, slow, gone = Connection(), Connection(), Connection()
        followers = [_join(kept, c, Left("read", head, 2, 2)) for c in (reading, slow, gone)]
        assert all(follower is not None for follower in followers)
        end = _append(kept, head, _unit(3), _unit(4))
        await asyncio.sleep(0.01)
        slow.untaken = 4096  # more than half its bound not taken: cut
        gone.closed = True
        after = _append(kept, end, _unit(5))
        await asyncio.sleep(0.01)
        assert followers[1].left.result() == Left("behind", after, 5, 5) and slow.closed
        assert followers[2].left.result() == Left("gone", end, 4, 4)
        # A line the actor did not write: back to the log from the last one sent.
        kept.clear()
        assert followers[0].left.result() == Left("read", after, 5, 5)
        assert kept.broadcast.followers == {}

        again = Connection()
        head = _append(kept, after + 50, _unit(7))
        follower = _join(kept, again, Left("read", head, 7, 7), deadline=time.monotonic() - 1)
        _append(kept, head, _unit(8), ev.Succeeded(seq=9))
        await asyncio.sleep(0.01)
        assert again.written == [_chunk(_unit(8), ev.Succeeded(seq=9))]
        assert follower.left.result().reason == "ended"  # the run's end before its deadline

    asyncio.run(main())


def test_the_followers_of_a_live_run_get_every_event_once_as_the_log_has_it(tmp_path):
    service = start_configured_service(tmp_path, stream_queue_bytes=256 * 1024)
    try:
        port = int(service.url.rsplit(":", 1)[1])
        task = {"id": "squares", "type": "demo.squares", "settings": {"n": 300, "sleep_s": 0.01}}
        run = service.submit("mk", {"name": "followed", "tasks": [task]})
        path = f"/runs/{run['id']}/events"
        followers = [open_stream(port, path, "t-mk") for _ in range(12)]
        try:
            received = [read_to_end(sock, timeout=120) for sock in followers]
        finally:
            for sock in followers:
                sock.close()
        from_log, _ = read_to_end(open_stream(port, path, "t-mk"))
    finally:
        stop_configured_service(service)
    expected = messages(from_log)
    assert expected[-1][1] == "succeeded"
    assert [seq for seq, _ in expected] == list(range(1, len(expected) + 1))
    for data, ended in received:
        assert ended == "eof" and data.endswith(b"\r\n0\r\n\r\n")
        assert messages(data) == expected
