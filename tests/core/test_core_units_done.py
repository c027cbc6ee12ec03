"""Units done in batches (`units-done`) beside single ones (`unit-done`): the event, the bitmap
of units done, the fold of mixed logs over every prefix, and the copies the decider takes."""

from __future__ import annotations

import msgspec
import pytest
from core_samples import at

from simrun_core import events as ev
from simrun_core import messages as msg
from simrun_core.decider import decide
from simrun_core.fold import ProgressLine, RunFold, TaskProgress, fold
from simrun_core.unit_flags import UnitFlags


def batch(
    seq: int, indices: tuple[int, ...], worker: str = "w0", seconds: float = 0.5
) -> ev.UnitsDone:
    return ev.UnitsDone(
        seq=seq,
        time=at(seq),
        task="squares",
        worker=worker,
        indices=indices,
        seconds=tuple(seconds + index / 100 for index in indices),
    )


def single(seq: int, index: int, worker: str = "w0", seconds: float = 0.5) -> ev.UnitDone:
    return ev.UnitDone(
        seq=seq, time=at(seq), task="squares", index=index, worker=worker, seconds=seconds
    )


def test_a_batch_round_trips_and_names_its_units_in_order() -> None:
    event = batch(7, (4, 2, 9))
    decoded = ev.decode_event(ev.encode_event(event))
    assert decoded == event
    assert list(ev.done_units(decoded)) == [(4, 0.54), (2, 0.52), (9, 0.59)]
    assert list(ev.done_units(single(3, 5, seconds=1.5))) == [(5, 1.5)]
    assert "units-done" in ev.KNOWN_TYPES and "unit-done" in ev.KNOWN_TYPES


def test_a_batch_whose_seconds_do_not_match_its_indices_is_no_event() -> None:
    line = (
        b'{"type":"units-done","seq":3,"time":"2026-01-01T00:00:00Z","task":"t",'
        b'"worker":"w","indices":[1,2],"seconds":[0.1]}\n'
    )
    with pytest.raises(ev.EventDecodeError, match="2 indices but 1 seconds"):
        ev.decode_event(line)


def test_units_done_event_keeps_the_order_of_completion() -> None:
    event = ev.units_done_event("t", "w1", [(3, 0.25), (1, 0.5)])
    assert (event.task, event.worker, event.indices, event.seconds) == (
        "t",
        "w1",
        (3, 1),
        (0.25, 0.5),
    )


def test_the_bitmap_knows_each_unit_once_inside_and_outside_its_count() -> None:
    done = UnitFlags(10)
    assert [done.add(index) for index in (0, 9, 9, 10, 10**12, -1, 0)] == [
        True,
        True,
        False,
        True,
        True,
        True,
        False,
    ]
    assert [index in done for index in (0, 1, 8, 9, 10, 11, 10**12, -1, -2)] == [
        True,
        False,
        False,
        True,
        True,
        False,
        True,
        True,
        False,
    ]
    unknown = UnitFlags(None)
    assert unknown.add(5) is True and unknown.add(5) is False and 5 in unknown


def mixed_log(submitted: ev.Submitted) -> list[ev.Event]:
    """squares (3 units): one single, a batch with a repeat of it, a batch of repeats only,
    a single repeat, the end; a unit of a task without units (plot)."""
    return [
        submitted,
        single(2, 0, seconds=0.3),
        batch(3, (2, 0), worker="w1"),
        batch(4, (0, 2)),
        single(5, 2, worker="w2"),
        batch(6, (1,)),
        ev.UnitsDone(
            seq=7, time=at(7), task="plot", worker="p0", indices=(0, 0), seconds=(1.0, 2.0)
        ),
        ev.Succeeded(seq=8, time=at(8), message="done"),
    ]


def test_the_fold_of_a_mixed_log_counts_each_unit_once_with_its_first_and_last(
    submitted: ev.Submitted,
) -> None:
    record = fold(mixed_log(submitted))
    assert record.progress["squares"] == TaskProgress(
        units=3,
        done=3,
        first_done=at(2),
        last_done=at(6),
        first=ProgressLine(index=0, worker="w0", seconds=0.3, time=at(2)),
        last=ProgressLine(index=1, worker="w0", seconds=0.51, time=at(6)),
    )
    assert record.progress["plot"].done == 1
    assert record.progress["plot"].last == ProgressLine(
        index=0, worker="p0", seconds=1.0, time=at(7)
    )


def test_every_prefix_of_a_mixed_log_folds_as_its_units_say(submitted: ev.Submitted) -> None:
    log = mixed_log(submitted)
    for end in range(1, len(log) + 1):
        seen: list[tuple[int, float, int]] = []  # (index, seconds, seq) of units new in order
        for event in log[1:end]:
            if isinstance(event, ev.UNITS_EVENTS) and event.task == "squares":
                for index, seconds in ev.done_units(event):
                    if index not in [unit[0] for unit in seen]:
                        seen.append((index, seconds, event.seq))
        progress = fold(log[:end]).progress["squares"]
        assert progress.done == len(seen)
        if seen:
            assert progress.first is not None and progress.last is not None
            assert (progress.first.index, progress.first.seconds) == seen[0][:2]
            assert (progress.last.index, progress.last.seconds) == seen[-1][:2]
            assert progress.last_done == at(seen[-1][2])
        # one event at a time folds the same as the whole prefix at once
        folder = RunFold()
        for event in log[:end]:
            folder.apply(event)
        assert folder.record == fold(log[:end])


def test_a_single_after_a_batch_and_a_batch_after_a_single_are_each_the_last(
    submitted: ev.Submitted,
) -> None:
    after_batch = fold([submitted, batch(2, (0,)), single(3, 1)]).progress["squares"]
    assert after_batch.last == ProgressLine(index=1, worker="w0", seconds=0.5, time=at(3))
    after_single = fold([submitted, single(2, 1), batch(3, (2, 0))]).progress["squares"]
    assert after_single.last == ProgressLine(index=0, worker="w0", seconds=0.5, time=at(3))


def test_unit_is_done_answers_for_both_kinds(submitted: ev.Submitted) -> None:
    folder = RunFold()
    for event in [submitted, single(2, 0), batch(3, (2,))]:
        folder.apply(event)
    assert [folder.unit_is_done("squares", i) for i in range(3)] == [True, False, True]
    assert folder.unit_is_done("plot", 0) is False


def started(submitted: ev.Submitted) -> RunFold:
    folder = RunFold()
    folder.apply(submitted)
    return folder


def copied(folder: RunFold, events: list[msg.HarnessEvent]) -> list[ev.Event]:
    """What a harness read makes the decider append (then folded, numbered after the log)."""
    decision = decide(folder, msg.HarnessRead(events=events))
    assert folder.record is not None
    seq = folder.record.seq
    numbered = [msgspec.structs.replace(e, seq=seq + n) for n, e in enumerate(decision.events, 1)]
    for event in numbered:
        folder.apply(event)
    return decision.events


def test_the_decider_copies_only_the_units_of_a_batch_the_log_lacks(
    submitted: ev.Submitted,
) -> None:
    folder = started(submitted)
    first = batch(0, (0, 1))
    assert copied(folder, [first]) == [first]  # all new: the batch as it is
    assert copied(folder, [first]) == []
    again = copied(folder, [ev.UnitDone(task="squares", index=1, worker="w1"), batch(0, (1, 2, 2))])
    assert len(again) == 1 and isinstance(again[0], ev.UnitsDone)
    assert (again[0].indices, again[0].seconds) == ((2,), (0.52,))
    assert folder.record is not None and folder.record.progress["squares"].done == 3


def test_the_decider_takes_a_unit_once_across_kinds_in_one_read(submitted: ev.Submitted) -> None:
    folder = started(submitted)
    taken = copied(
        folder,
        [ev.UnitDone(task="squares", index=0, worker="w0"), batch(0, (0,)), batch(0, (0, 1))],
    )
    assert [type(e).__name__ for e in taken] == ["UnitDone", "UnitsDone"]
    assert isinstance(taken[1], ev.UnitsDone) and taken[1].indices == (1,)
