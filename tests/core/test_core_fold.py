"""simrun_core.fold: the state of a run from its events, over the whole log and every prefix."""

from __future__ import annotations

import msgspec
import pytest
from core_samples import RUN_ID, at

from simrun_core import events as ev
from simrun_core.fold import FoldError, PodRecord, ProgressLine, RunFold, TaskProgress, fold
from simrun_core.states import RunState, TaskState
from simrun_core.workflow import Priority

WAITING, RUNNING, DONE = TaskState.WAITING, TaskState.RUNNING, TaskState.DONE


def renumber(events: list[ev.Event], first: int = 1) -> list[ev.Event]:
    """The events with seq counting from `first` without gaps."""
    return [msgspec.structs.replace(e, seq=first + i) for i, e in enumerate(events)]


def test_fold_of_a_whole_run(run_log: list[ev.Event], submitted: ev.Submitted) -> None:
    record = fold(run_log)
    assert record.id == RUN_ID
    assert record.seq == 21
    assert record.state is RunState.SUCCEEDED
    assert record.ended is True
    assert record.message == "2 tasks done"
    assert record.workflow == submitted.workflow
    assert record.plans == submitted.plans
    assert (record.submitted_by, record.owner, record.agent) == ("alice", "alice", None)
    assert record.priority is Priority.OWNER
    assert record.group == "demo"
    assert record.tasks == {"squares": DONE, "plot": DONE}
    assert record.task_messages == {}
    first = ProgressLine(index=0, worker="squares-0", seconds=0.5, time=at(6))
    last = ProgressLine(index=1, worker="squares-0", seconds=0.5, time=at(8))  # not the repeat
    assert record.progress == {
        "squares": TaskProgress(
            units=3, done=3, first_done=at(6), last_done=at(8), first=first, last=last
        )
    }
    assert record.pods == {
        "squares": {
            "squares-0": PodRecord(
                worker="squares-0",
                state="succeeded",
                exit_code=0,
                node="node-1",
                peak_memory_bytes=1_000_000,
                processes=2,
                units_done=3,
            )
        },
        "plot": {
            "plot-0": PodRecord(worker="plot-0", state="succeeded", exit_code=0, node="node-1")
        },
    }
    assert record.merged == ["squares"]
    assert record.logs_kept == ["squares", "plot"]
    assert record.backend == "local"
    assert record.backend_name == f"simrun-{RUN_ID}"
    assert record.image == "registry:5000/simrun:1"
    assert record.built == at(2)
    assert record.created == at(0)
    assert record.started == at(4)
    assert record.finished == at(20)
    assert record.cancel_requested is None
    assert record.oom_kills == {}


def test_plans_of_the_sample(run_log: list[ev.Event]) -> None:
    plans = fold(run_log[:1]).plans
    assert plans["squares"].units == 3
    assert plans["plot"].units is None


def test_a_duplicate_unit_done_counts_once(run_log: list[ev.Event]) -> None:
    folder = RunFold()
    for event in run_log[:9]:
        folder.apply(event)
    assert folder.record is not None
    assert folder.record.progress["squares"].done == 3
    assert folder.unit_is_done("squares", 1) is True
    assert folder.unit_is_done("squares", 3) is False
    assert folder.unit_is_done("plot", 0) is False
    folder.apply(run_log[9])
    progress = folder.record.progress["squares"]
    assert (progress.units, progress.done, progress.first_done, progress.last_done) == (
        3,
        3,
        at(6),
        at(8),
    )
    assert progress.last == ProgressLine(index=1, worker="squares-0", seconds=0.5, time=at(8))


STATES_BY_PREFIX = (
    [RunState.SUBMITTING] * 3 + [RunState.QUEUED] + [RunState.RUNNING] * 16 + [RunState.SUCCEEDED]
)


def test_fold_of_every_prefix(run_log: list[ev.Event]) -> None:
    assert len(STATES_BY_PREFIX) == len(run_log)
    for length in range(1, len(run_log) + 1):
        record = fold(run_log[:length])
        assert record.seq == length
        assert record.state is STATES_BY_PREFIX[length - 1], length


def test_prefix_of_one_is_submitting(run_log: list[ev.Event]) -> None:
    record = fold(run_log[:1])
    assert record.state is RunState.SUBMITTING
    assert record.tasks == {"squares": WAITING, "plot": WAITING}
    assert record.progress == {"squares": TaskProgress(units=3)}
    assert record.started is None
    assert record.finished is None
    assert record.ended is False


def test_task_states_along_the_prefixes(run_log: list[ev.Event]) -> None:
    assert fold(run_log[:5]).tasks == {"squares": RUNNING, "plot": WAITING}
    assert fold(run_log[:14]).tasks == {"squares": DONE, "plot": WAITING}
    assert fold(run_log[:15]).tasks == {"squares": DONE, "plot": RUNNING}
    assert fold(run_log[:7]).progress["squares"].done == 1


def test_fold_does_not_change_the_events(run_log: list[ev.Event]) -> None:
    before = [ev.encode_event(event) for event in run_log]
    fold(run_log)
    fold(run_log[:5])
    assert [ev.encode_event(event) for event in run_log] == before


def test_a_gap_in_seq_raises(run_log: list[ev.Event]) -> None:
    with pytest.raises(FoldError, match=r"^event 4 follows event 2: a gap in the log$"):
        fold([run_log[0], run_log[1], run_log[3]])


def test_a_repeated_seq_raises(run_log: list[ev.Event]) -> None:
    with pytest.raises(FoldError, match=r"^event 2 follows event 2: a gap in the log$"):
        fold([run_log[0], run_log[1], run_log[1]])


def test_an_event_before_submitted_raises(run_log: list[ev.Event]) -> None:
    with pytest.raises(FoldError, match=r"^event 2 comes before 'submitted'$"):
        fold(run_log[1:])


def test_a_log_without_submitted_raises() -> None:
    with pytest.raises(FoldError, match=r"^the log has no 'submitted' event$"):
        fold([])
    with pytest.raises(FoldError, match=r"^the log has no 'submitted' event$"):
        fold([None, None])


def test_none_entries_are_skipped(run_log: list[ev.Event]) -> None:
    assert fold([None, *run_log, None]) == fold(run_log)
    assert fold([run_log[0], None]).seq == 1


def test_an_unknown_type_in_the_middle_is_skipped(run_log: list[ev.Event]) -> None:
    unknown = ev.UnknownEvent(seq=4, kind="from-the-future")
    events: list[ev.Event | None] = [*run_log[:3], unknown, *renumber(run_log[3:], first=5)]
    record = fold(events)
    assert record.state is RunState.SUCCEEDED
    assert record.seq == 22


def run_until_running(submitted: ev.Submitted) -> list[ev.Event]:
    return [
        submitted,
        ev.WorkflowSubmitted(seq=2, time=at(1), name="wf"),
        ev.TaskStateChanged(seq=3, time=at(2), task="squares", state=RUNNING),
        ev.PodStarted(seq=4, time=at(3), task="squares", worker="squares-0", node="n1"),
        ev.UnitDone(seq=5, time=at(4), task="squares", index=0, worker="squares-0"),
    ]


def test_a_failed_run(submitted: ev.Submitted) -> None:
    events = [
        *run_until_running(submitted),
        ev.PodFailed(
            seq=6, time=at(5), task="squares", worker="squares-0", exit_code=137, oom=True
        ),
        ev.OomKilled(seq=7, time=at(6), task="squares", worker="squares-0", retry_memory_gb=2.0),
        ev.TaskStateChanged(
            seq=8, time=at(7), task="squares", state=TaskState.FAILED, message="unit 1 failed"
        ),
        ev.Failed(seq=9, time=at(8), message="task 'squares' failed: unit 1 failed"),
    ]
    record = fold(events)
    assert record.state is RunState.FAILED
    assert record.message == "task 'squares' failed: unit 1 failed"
    assert record.finished == at(8)
    assert record.tasks == {"squares": TaskState.FAILED, "plot": TaskState.SKIPPED}
    assert record.task_messages == {"squares": "unit 1 failed"}
    assert record.pods["squares"]["squares-0"] == PodRecord(
        worker="squares-0", state="failed", exit_code=137, node="n1", oom=True
    )
    assert record.oom_kills == {"squares": {"squares-0": [0]}}
    assert record.progress["squares"].done == 1


def test_a_cancelled_run(submitted: ev.Submitted) -> None:
    events = [
        *run_until_running(submitted),
        ev.CancelRequested(seq=6, time=at(5), by="bob"),
        ev.Cancelled(seq=7, time=at(6)),
        ev.NodeReleased(seq=8, time=at(7), node="n1"),
    ]
    record = fold(events)
    assert record.state is RunState.CANCELLED
    assert record.message is None
    assert record.cancel_requested == "bob"
    assert record.finished == at(6)
    assert record.tasks == {"squares": TaskState.SKIPPED, "plot": TaskState.SKIPPED}
    assert record.seq == 8


def test_a_cancelled_run_keeps_done_tasks(run_log: list[ev.Event]) -> None:
    events = [*run_log[:15], ev.Cancelled(seq=16, time=at(30), message="cancelled by bob")]
    record = fold(events)
    assert record.state is RunState.CANCELLED
    assert record.message == "cancelled by bob"
    assert record.tasks == {"squares": DONE, "plot": TaskState.SKIPPED}


def test_a_run_failed_before_it_ran(submitted: ev.Submitted) -> None:
    record = fold([submitted, ev.Failed(seq=2, time=at(1), message="the image did not build")])
    assert record.state is RunState.FAILED
    assert record.message == "the image did not build"
    assert record.started is None
    assert record.tasks == {"squares": TaskState.SKIPPED, "plot": TaskState.SKIPPED}


def test_a_retried_pod_starts_a_new_attempt(submitted: ev.Submitted) -> None:
    events = [
        *run_until_running(submitted),
        ev.PodPreempted(seq=6, time=at(5), task="squares", worker="squares-0"),
        ev.PodStarted(seq=7, time=at(6), task="squares", worker="squares-0", attempt=1),
    ]
    assert fold(events[:6]).pods["squares"]["squares-0"].state == "preempted"
    assert fold(events).pods["squares"]["squares-0"] == PodRecord(
        worker="squares-0", attempt=1, state="running"
    )


def test_a_late_running_task_does_not_reopen_an_ended_run(submitted: ev.Submitted) -> None:
    events = [
        submitted,
        ev.Cancelled(seq=2, time=at(1)),
        ev.TaskStateChanged(seq=3, time=at(2), task="squares", state=RUNNING),
    ]
    assert fold(events).state is RunState.CANCELLED


def test_workflow_submitted_does_not_move_a_running_run_back(run_log: list[ev.Event]) -> None:
    events = [*run_log[:5], ev.WorkflowSubmitted(seq=6, time=at(5), name="again")]
    record = fold(events)
    assert record.state is RunState.RUNNING
    assert record.backend_name == "again"
