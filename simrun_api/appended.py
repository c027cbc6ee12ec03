"""The lines a live run's actor appended last, kept for the run's event streams.

Every stream of a run followed its log by itself: woken by an append, it opened the log, read
it from its own offset, decoded each new line and encoded its message, so with 200 subscribers
an event was read, decoded and encoded 200 times on the loop's one thread, and the last
subscriber got it tens of ms after the first. The actor keeps its last appends here (their
lines, seqs and types) and a stream that has read the log up to one of them takes the rest
from here: the messages of an append are encoded once for all its subscribers. A stream
further behind than what is kept reads the log, as before.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import deque

from simrun_api.broadcast import Broadcast
from simrun_core.events import Event, UnknownEvent, decode_event

KEEP_BYTES = 2 * 1024
"""The most bytes of lines kept per run: a subscriber that keeps up is a few ms behind, and a
thousand live runs keep a few MiB in all (an append larger than this is not kept: its
subscribers read the log). Lines are kept with their seqs and types, not their events: a
decoded `units-done` of many units takes several times the memory of its line."""


def sse_message(seq: int, kind: str, line: bytes) -> bytes:
    """The server-sent message of one event as litestar encodes it (`id`, `event`, `data`, a
    blank line): the data is the log's line, JSON of one line."""
    return b"id: %d\r\nevent: %s\r\ndata: %s\r\n\r\n" % (seq, kind.encode(), line.rstrip(b"\n"))


def event_kind(event: Event) -> str:
    """The type of an event as its line has it (also of a type this version does not know)."""
    return event.kind if isinstance(event, UnknownEvent) else str(event.__struct_config__.tag)


@dataclasses.dataclass(frozen=True, slots=True)
class Piece:
    """Lines of the log to send, in order: the offset after each, the lines, their seqs and
    types, their events when at hand (else `decode`), and their messages when they are a whole
    append (shared by every stream that sends them)."""

    ends: list[int]
    lines: list[bytes]
    seqs: list[int]
    kinds: list[str]
    events: list[Event] | None = None
    messages: bytes | None = None

    @classmethod
    def of(cls, ends: list[int], lines: list[bytes], events: list[Event]) -> Piece:
        """Lines with their events."""
        seqs = [event.seq for event in events]
        return cls(ends, lines, seqs, [event_kind(event) for event in events], events)

    def decoded(self) -> list[Event]:
        """Their events (decoded from the lines when not at hand)."""
        if self.events is not None:
            return self.events
        return [decode_event(line) for line in self.lines]

    def part(self, count: int) -> Piece:
        """Its first `count` lines."""
        events = self.events[:count] if self.events is not None else None
        return Piece(
            self.ends[:count], self.lines[:count], self.seqs[:count], self.kinds[:count], events
        )


@dataclasses.dataclass(slots=True)
class Append:
    """One append of the actor: where its lines start in the log, the lines, their seqs and
    types; `ends` the offset after each line."""

    start: int
    lines: list[bytes]
    seqs: list[int]
    kinds: list[str]
    ends: list[int] = dataclasses.field(init=False)
    _messages: bytes | None = None

    def __post_init__(self) -> None:
        end = self.start
        self.ends = []
        for line in self.lines:
            end += len(line)
            self.ends.append(end)

    @property
    def end(self) -> int:
        """The offset after its last line."""
        return self.ends[-1]

    def whole(self) -> Piece:
        """All its lines, with their messages (encoded at the first call only)."""
        if self._messages is None:
            self._messages = b"".join(
                sse_message(seq, kind, line)
                for seq, kind, line in zip(self.seqs, self.kinds, self.lines, strict=True)
            )
        return Piece(self.ends, self.lines, self.seqs, self.kinds, messages=self._messages)

    def after(self, at: int) -> Piece:
        """Its lines after the first `at`."""
        return Piece(self.ends[at:], self.lines[at:], self.seqs[at:], self.kinds[at:])


class AppendedLines:
    """The last appends of a run's actor, at most `keep_bytes` of lines."""

    def __init__(self, keep_bytes: int = KEEP_BYTES) -> None:
        self.keep_bytes = keep_bytes
        self.broadcast = Broadcast()
        self._appends: deque[Append] = deque()
        self._bytes = 0

    def add(self, start: int, lines: list[bytes], events: list[Event]) -> None:
        """Keep an append (its lines start at `start`), forgetting the oldest beyond the bound,
        and write it to the streams that follow the run (`broadcast`); an append that does not
        follow the last one kept, or larger than the bound, starts the kept lines again (it is
        not kept)."""
        if not lines:
            return
        kinds = [event_kind(event) for event in events]
        append = Append(start, lines, [event.seq for event in events], kinds)
        self.broadcast.send(append)
        size = append.end - start
        if size > self.keep_bytes or (self._appends and self._appends[-1].end != start):
            self._forget()
            if size > self.keep_bytes:
                return
        self._appends.append(append)
        self._bytes += size
        while self._bytes > self.keep_bytes:
            oldest = self._appends.popleft()
            self._bytes -= oldest.end - oldest.start

    def clear(self) -> None:
        """Forget every append kept, and send the streams that follow the run back to the log
        (it has lines the actor did not write)."""
        self._forget()
        self.broadcast.release()

    def _forget(self) -> None:
        self._appends.clear()
        self._bytes = 0

    def since(self, offset: int) -> list[Piece] | None:
        """The lines after byte `offset` of the log, when it is the end of a line kept (or the
        end of the last): [] when nothing follows it yet; None when they are not all here (the
        offset is before what is kept, or not where a kept line ends: read the log)."""
        appends = self._appends
        if not appends:
            return None
        if offset == appends[-1].end:
            return []
        holding = (n for n, kept in enumerate(appends) if kept.start <= offset < kept.end)
        number = next(holding, None)
        if number is None:
            return None
        append = appends[number]
        if offset == append.start:
            first = append.whole()
        else:
            at = bisect.bisect_left(append.ends, offset)
            if append.ends[at] != offset:
                return None
            first = append.after(at + 1)
        return [first, *(later.whole() for later in list(appends)[number + 1 :])]
