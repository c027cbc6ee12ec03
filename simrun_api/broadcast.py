"""A live run's appends sent to every stream that follows it, encoded and framed once.

With every stream following its run by itself, an append woke each of them, and each sent the
append's messages through litestar, uvicorn and h11: with 2,000 subscribers of one run, ten
appends a second were 20,000 wakes and sends of the same bytes, and the answers to everyone
else waited behind those bursts. A stream that caught up with the log of a live run joins
its run's `Broadcast` instead and waits there without a wake: the broadcast takes each append
of the actor (`AppendedLines.add`), frames its messages once as a chunk of an HTTP/1.1 body and
writes that chunk to every follower's connection itself, letting the loop run between groups of
`WRITES_AT_ONCE` followers. A follower leaves with `Left`: the run ended, it is too far behind
(its client has more than its bound not taken: it is cut, as a stream is), its deadline passed,
its client went away, or the broadcast cannot serve it (`read`: a line the actor did not write
came to the log, or it was removed): then the stream reads the log again from where the
follower is, and may join again once it caught up.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from simrun_core.events import TERMINAL_EVENTS

if TYPE_CHECKING:
    from simrun_api.appended import Append

TERMINAL_KINDS = frozenset(str(kind.__struct_config__.tag) for kind in TERMINAL_EVENTS)
"""The types of the events that end a run: a stream ends after the first of them."""
WRITES_AT_ONCE = 64
"""Followers written to before the broadcast lets the loop run the others' callbacks (about a
millisecond of writes)."""

Reason = Literal["ended", "behind", "deadline", "gone", "read"]


class RawConnection(Protocol):
    """The connection of a follower (`simrun_api.server.ConnectionControl`)."""

    def write(self, data: bytes) -> bool:
        """Write bytes of the response's body as they go on the wire; False when closing."""

    def unsent(self) -> int:
        """The bytes written that wait in the transport for the client."""

    def closing(self) -> bool:
        """Whether the connection is closed or closing."""

    def cut(self) -> None:
        """Cut the connection at once."""


@dataclasses.dataclass(frozen=True, slots=True)
class Left:
    """How a follower left, and where it is: the offset in the log after the last line sent,
    that line's seq, and the lines of the log sent (of the whole log)."""

    reason: Reason
    offset: int
    seq: int
    lines: int


@dataclasses.dataclass(slots=True)
class Chunk:
    """One append as it goes out: its messages framed, where it ends in the log, its last seq,
    the broadcast's count of lines after it, whether it ends the run, and the followers it is
    for (those that had joined when it came)."""

    framed: bytes
    end: int
    seq: int
    count: int
    ends_run: bool
    followers: list[Follower]


@dataclasses.dataclass(eq=False, slots=True)
class Follower:
    """A stream in a broadcast: its connection, the bytes its client may leave untaken before
    it is cut (`limit`, as `StreamBound`), its deadline (`time.monotonic()`), where it joined
    (offset, seq, lines of the log sent, the broadcast's count then), the last chunk written to
    it, and `left`, resolved when it leaves."""

    connection: RawConnection
    limit: int
    deadline: float
    joined: Left
    count: int
    left: asyncio.Future[Left]
    last: Chunk | None = None

    def position(self, reason: Reason) -> Left:
        """Where it is now, leaving for `reason`."""
        last, joined = self.last, self.joined
        if last is None:
            return dataclasses.replace(joined, reason=reason)
        return Left(reason, last.end, last.seq, joined.lines + last.count - self.count)


class Broadcast:
    """The followers of one live run and the appends still to write to them; `head` the offset
    after the last append the actor handed in (None before the first), `seq` its last seq."""

    def __init__(self) -> None:
        self.head: int | None = None
        self.seq = 0
        self.count = 0  # lines handed in
        self.followers: dict[Follower, None] = {}
        self._chunks: collections.deque[Chunk] = collections.deque()
        self._writer: asyncio.Task[None] | None = None
        self._tick: asyncio.TimerHandle | None = None
        self._log: Path | None = None
        self._poll_s = 0.5
        self._head_at_tick: int | None = None

    def join(
        self,
        connection: RawConnection,
        limit: int,
        deadline: float,
        at: Left,
        log: Path,
        poll_s: float,
    ) -> Follower | None:
        """A stream that sent the log up to `at` (its offset, its seq: every event up to it)
        follows from there, None when it cannot (the broadcast is not there: read on). `log`
        is the run's log, looked at every `poll_s` for lines the actor did not write."""
        if self.head is None or at.offset != self.head or at.seq != self.seq:
            return None
        loop = asyncio.get_running_loop()
        follower = Follower(connection, limit, deadline, at, self.count, loop.create_future())
        self.followers[follower] = None
        self._log, self._poll_s = log, poll_s
        if self._tick is None:
            self._head_at_tick = self.head
            self._tick = loop.call_later(poll_s, self._look)
        return follower

    def leave(self, follower: Follower, reason: Reason = "gone") -> None:
        """Take a follower out (at once; a chunk under way skips it); its `left` resolved."""
        self.followers.pop(follower, None)
        if not follower.left.done():
            follower.left.set_result(follower.position(reason))
        if not self.followers and self._tick is not None:
            self._tick.cancel()
            self._tick = None

    def send(self, append: Append) -> None:
        """Write an append of the actor (its lines start at `append.start`) to every follower;
        one that does not follow the last sends every follower back to the log."""
        count = len(append.lines)
        follows = append.start == self.head
        self.head, self.seq = append.end, append.seqs[-1]
        self.count += count
        if not self.followers:
            return
        if not follows:
            self.release()
            return
        framed = chunk_of(append.whole().messages or b"")
        ends_run = any(kind in TERMINAL_KINDS for kind in append.kinds)
        chunk = Chunk(framed, append.end, append.seqs[-1], self.count, ends_run, [*self.followers])
        self._chunks.append(chunk)
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._write_all())

    def release(self) -> None:
        """Send every follower back to the log (the log has lines the actor did not write)."""
        for follower in list(self.followers):
            self.leave(follower, "read")

    async def _write_all(self) -> None:
        try:
            while self._chunks:
                chunk = self._chunks.popleft()
                now = time.monotonic()
                for number, follower in enumerate(chunk.followers, 1):
                    if not follower.left.done():
                        self._write(follower, chunk, now)
                    if number % WRITES_AT_ONCE == 0:
                        await asyncio.sleep(0)
                chunk.followers.clear()
        finally:
            self._writer = None

    def _write(self, follower: Follower, chunk: Chunk, now: float) -> None:
        connection = follower.connection
        if not connection.write(chunk.framed):
            self.leave(follower, "gone")
            return
        follower.last = chunk
        if chunk.ends_run:
            self.leave(follower, "ended")
        elif connection.unsent() > follower.limit // 2:
            connection.cut()
            self.leave(follower, "behind")
        elif now > follower.deadline:
            self.leave(follower, "deadline")

    def _look(self) -> None:
        """Every `poll_s` while there are followers: end those whose client went away or whose
        deadline passed; when no
        append came since the last look and the log is not where the last append ended (a line
        the actor did not write, the run removed), send them all back to the log."""
        self._tick = None
        now = time.monotonic()
        for follower in list(self.followers):
            if follower.connection.closing():
                self.leave(follower, "gone")
            elif now > follower.deadline:
                self.leave(follower, "deadline")
        if self.head == self._head_at_tick and self._log is not None:
            try:
                size = os.stat(self._log).st_size
            except OSError:
                size = -1
            if size != self.head:
                self.release()
        if self.followers:
            self._head_at_tick = self.head
            self._tick = asyncio.get_running_loop().call_later(self._poll_s, self._look)


def chunk_of(data: bytes) -> bytes:
    """`data` as one chunk of an HTTP/1.1 body of chunks (as h11 frames what it sends)."""
    return b"%x\r\n%s\r\n" % (len(data), data)
