"""simrun_core.fold: the first terminal event of a log is final. Events after it (a log two
services wrote, a log edited) change no outcome; the record warns that its log is damaged. The
release of the run's node, which an ended run's actor appends, is folded as before."""

from __future__ import annotations

import msgspec
import pytest
from core_samples import at

from simrun_core import events as ev
from simrun_core.fold import DAMAGED_LOG, RunFold, fold
from simrun_core.states import RunState, TaskState


def renumber(events: list[ev.Event], first: int = 1) -> list[ev.Event]:
    """The events with seq counting from `first` without gaps."""
    return [msgspec.structs.replace(e, seq=first + i) for i, e in enumerate(events)]


def failed_then_more(run_log: list[ev.Event]) -> list[ev.Event]:
    """The run fails after its first task started; then a task done and a success follow, as a
    second writer of the log would append them."""
    return renumber(
        [
            *run_log[:6],
            ev.Failed(time=at(30), message="task 'squares' failed: exit code 1", seq=0),
            ev.UnitDone(time=at(31), task="squares", index=0, worker="squares-0", seconds=1, seq=0),
            ev.TaskStateChanged(time=at(32), task="squares", state=TaskState.DONE, seq=0),
            ev.TaskStateChanged(time=at(33), task="plot", state=TaskState.DONE, seq=0),
            ev.Succeeded(time=at(34), message="2 tasks done", seq=0),
        ]
    )


def test_events_after_the_end_change_no_outcome_and_the_record_warns(
    run_log: list[ev.Event],
) -> None:
    events = failed_then_more(run_log)
    record = fold(events)
    assert record.state is RunState.FAILED
    assert record.message == "task 'squares' failed: exit code 1"
    assert record.finished == at(30)
    assert record.tasks == {"squares": TaskState.SKIPPED, "plot": TaskState.SKIPPED}
    assert record.progress["squares"].done == 0
    assert record.seq == events[-1].seq  # folded up to the last event, which changed nothing
    assert record.warnings == [
        f"{DAMAGED_LOG}: the run ended at event 7 ('failed') and 4 events follow, the first "
        "at event 8 ('unit-done'); they are ignored"
    ]


def test_a_log_that_ends_once_has_no_warning(run_log: list[ev.Event]) -> None:
    assert fold(run_log).warnings == []
    assert fold(failed_then_more(run_log)[:7]).warnings == []


@pytest.mark.parametrize("cut", range(1, 12))
def test_the_same_record_one_event_at_a_time_and_in_blocks(
    run_log: list[ev.Event], cut: int
) -> None:
    """The fold's blocks are any cut of the log (a service reads it in blocks, a live run's
    actor one append at a time): the same record either way."""
    events = failed_then_more(run_log)
    whole = fold(events)
    split = RunFold()
    split.apply_all(events[:cut])
    split.apply_all(events[cut:])
    single = RunFold()
    for event in events:
        single.apply(event)
    assert split.record == whole
    assert single.record == whole


def test_a_second_end_is_damage_too(run_log: list[ev.Event]) -> None:
    events = renumber([*run_log, ev.Cancelled(time=at(40), message="cancelled by bob", seq=0)])
    record = fold(events)
    assert (record.state, record.message) == (RunState.SUCCEEDED, "2 tasks done")
    assert record.warnings == [
        f"{DAMAGED_LOG}: the run ended at event 21 ('succeeded') and 1 event follows, the first "
        "at event 22 ('cancelled'); they are ignored"
    ]


def test_the_release_of_the_node_after_the_end_is_folded_without_warning(
    run_log: list[ev.Event],
) -> None:
    events = renumber(
        [
            *run_log[:-1],
            ev.NodeReserved(time=at(19), node="node-1", seq=0),
            run_log[-1],
            ev.NodeReleased(time=at(41), node="node-1", seq=0),
            ev.UnknownEvent(time=at(42), kind="from-a-newer-version", seq=0),
        ]
    )
    record = fold(events)
    assert record.state is RunState.SUCCEEDED
    assert record.reserved is None
    assert record.warnings == []
    assert record.seq == events[-1].seq
