"""The last appends of a run kept for its streams: from which offsets they serve, and how much
is kept."""

from __future__ import annotations

from simrun_api.appended import AppendedLines, sse_message
from simrun_core import events as ev
from simrun_core.store import encode_event


def _append(kept: AppendedLines, start: int, *seqs: int) -> int:
    """Keep an append of unit-done events numbered `seqs` at `start`; the offset after it."""
    events: list[ev.Event] = [
        ev.UnitDone(seq=seq, task="t", index=seq, worker="w0") for seq in seqs
    ]
    lines = [encode_event(event) for event in events]
    kept.add(start, lines, events)
    return start + sum(map(len, lines))


def _seqs(pieces) -> list[int]:
    """The seqs of pieces, checked against their lines' events."""
    seqs = [seq for piece in pieces for seq in piece.seqs]
    assert seqs == [event.seq for piece in pieces for event in piece.decoded()]
    return seqs


def test_the_lines_after_an_offset_are_served_from_where_a_kept_line_ends() -> None:
    kept = AppendedLines()
    assert kept.since(0) is None  # nothing kept: read the log
    middle = _append(kept, 100, 2, 3)
    end = _append(kept, middle, 4, 5, 6)
    assert _seqs(kept.since(100)) == [2, 3, 4, 5, 6]
    assert _seqs(kept.since(middle)) == [4, 5, 6]
    assert kept.since(end) == []
    first_line_end = kept.since(100)[0].ends[0]
    assert _seqs(kept.since(first_line_end)) == [3, 4, 5, 6]
    for elsewhere in (0, 99, 101, end + 1):
        assert kept.since(elsewhere) is None


def test_a_whole_append_has_its_messages_encoded_once_and_a_part_has_none() -> None:
    kept = AppendedLines()
    _append(kept, 0, 2, 3)
    whole = kept.since(0)[0]
    assert whole.messages is not None and whole.messages is kept.since(0)[0].messages
    assert whole.messages == b"".join(
        sse_message(event.seq, "unit-done", line)
        for event, line in zip(whole.decoded(), whole.lines, strict=True)
    )
    assert whole.kinds == ["unit-done", "unit-done"]
    part = kept.since(whole.ends[0])[0]
    assert part.messages is None and part.seqs == [3]
    assert part.ends == whole.ends[1:]


def test_the_oldest_appends_are_forgotten_beyond_the_bound() -> None:
    kept = AppendedLines(keep_bytes=300)
    offset = 0
    starts = []
    for seq in range(2, 12):
        starts.append(offset)
        offset = _append(kept, offset, seq)
    served = [start for start in starts if kept.since(start) is not None]
    assert served == starts[-len(served) :] and 0 < len(served) < len(starts)
    assert _seqs(kept.since(served[0])) == list(range(12 - len(served), 12))
    assert offset - served[0] <= 300 < offset - starts[-len(served) - 1]


def test_an_append_larger_than_the_bound_is_not_kept_nor_what_came_before() -> None:
    kept = AppendedLines(keep_bytes=300)
    end = _append(kept, 0, 2)
    after_big = _append(kept, end, *range(3, 50))
    assert kept.since(0) is None and kept.since(end) is None and kept.since(after_big) is None
    later = _append(kept, after_big, 50)
    assert _seqs(kept.since(after_big)) == [50] and kept.since(later) == []


def test_an_append_that_does_not_follow_the_last_starts_the_kept_lines_again() -> None:
    kept = AppendedLines()
    end = _append(kept, 0, 2)
    later = _append(kept, end + 50, 3)  # the log was written by someone else in between
    assert kept.since(0) is None
    assert _seqs(kept.since(end + 50)) == [3]
    assert kept.since(later) == []
