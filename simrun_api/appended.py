"""The lines a live run's actor appended last, kept for the run's event streams.

Every stream of a run followed its log by itself: woken by an append, it opened the log, read
it from its own offset, decoded each new line and encoded its message, so with 200 subscribers
an event was read, decoded and encoded 200 times on the loop's one thread, and the last
subscriber got it tens of ms after the first. The actor keeps its last appends here (their
lines and the events it decoded nothing to get) and a stream that has read the log up to one
of them takes the rest from here: the messages of an append are encoded once for all its
subscribers. A stream further behind than what is kept reads the log, as before.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import deque

from simrun_core.events import Event, UnknownEvent

KEEP_BYTES = 8 * 1024
"""About the most bytes of lines kept per run (at least the last append): a subscriber that
keeps up is a few ms behind, and a thousand live runs keep 8 MiB in all."""


def sse_message(seq: int, kind: str, line: bytes) -> bytes:
    """The server-sent message of one event as litestar encodes it (`id`, `event`, `data`, a
    blank line): the data is the log's line, JSON of one line."""
    return b"id: %d\r\nevent: %s\r\ndata: %s\r\n\r\n" % (seq, kind.encode(), line.rstrip(b"\n"))


def event_kind(event: Event) -> str:
    """The type of an event as its line has it (also of a type this version does not know)."""
    return event.kind if isinstance(event, UnknownEvent) else str(event.__struct_config__.tag)


@dataclasses.dataclass(slots=True)
class Append:
    """One append of the actor: where its lines start in the log, the lines and their events;
    `ends` the offset after each line."""

    start: int
    lines: list[bytes]
    events: list[Event]
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

    def messages(self) -> bytes:
        """The messages of all its events, encoded at the first call only."""
        if self._messages is None:
            self._messages = b"".join(
                sse_message(event.seq, event_kind(event), line)
                for event, line in zip(self.events, self.lines, strict=True)
            )
        return self._messages


@dataclasses.dataclass(frozen=True, slots=True)
class Piece:
    """Lines of the log to send, in order: the offset after each, the lines, their events, and
    their messages when they are a whole append (shared by every stream that sends them)."""

    ends: list[int]
    lines: list[bytes]
    events: list[Event]
    messages: bytes | None = None


class AppendedLines:
    """The last appends of a run's actor, about `keep_bytes` of lines."""

    def __init__(self, keep_bytes: int = KEEP_BYTES) -> None:
        self.keep_bytes = keep_bytes
        self._appends: deque[Append] = deque()
        self._bytes = 0

    def add(self, start: int, lines: list[bytes], events: list[Event]) -> None:
        """Keep an append (its lines start at `start`), forgetting the oldest beyond the bound;
        an append that does not follow the last one kept starts the kept lines again."""
        if not lines:
            return
        if self._appends and self._appends[-1].end != start:
            self._appends.clear()
            self._bytes = 0
        append = Append(start, lines, events)
        self._appends.append(append)
        self._bytes += append.end - start
        while len(self._appends) > 1 and self._bytes > self.keep_bytes:
            oldest = self._appends.popleft()
            self._bytes -= oldest.end - oldest.start

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
            first = Piece(append.ends, append.lines, append.events, append.messages())
        else:
            at = bisect.bisect_left(append.ends, offset)
            if at >= len(append.ends) or append.ends[at] != offset:
                return None
            at += 1
            first = Piece(append.ends[at:], append.lines[at:], append.events[at:])
        rest = [
            Piece(later.ends, later.lines, later.events, later.messages())
            for later in list(appends)[number + 1 :]
        ]
        return [first, *rest]
