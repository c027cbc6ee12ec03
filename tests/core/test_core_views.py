"""simrun_core.views: the progress of a run, its list item and the progress of its tasks."""

from __future__ import annotations

import msgspec
import pytest
from core_samples import RUN_ID, at

from simrun_core import events as ev
from simrun_core.fold import RunRecord, TaskProgress, fold
from simrun_core.states import RunState, TaskState
from simrun_core.views import progress_view, run_item, run_progress
from simrun_core.wire import ProgressView, RunItem, TaskProgressView
from simrun_core.workflow import Priority, TaskSpec, Workflow

WAITING, RUNNING, DONE = TaskState.WAITING, TaskState.RUNNING, TaskState.DONE


def with_tasks(
    record: RunRecord, tasks: dict[str, TaskState], done: int | None = None
) -> RunRecord:
    """The record with other task states and, if given, units done of `squares`."""
    progress = dict(record.progress)
    if done is not None:
        progress["squares"] = TaskProgress(units=3, done=done)
    return msgspec.structs.replace(record, tasks=tasks, progress=progress)


@pytest.mark.parametrize(
    ("tasks", "done", "expected"),
    [
        ({"squares": WAITING, "plot": WAITING}, None, 0.0),
        ({"squares": RUNNING, "plot": WAITING}, 0, 0.0),
        ({"squares": RUNNING, "plot": WAITING}, 1, (1 / 3) / 2),
        ({"squares": RUNNING, "plot": WAITING}, 2, (2 / 3) / 2),
        ({"squares": RUNNING, "plot": WAITING}, 3, 0.99 / 2),
        ({"squares": DONE, "plot": WAITING}, 3, 0.5),
        ({"squares": DONE, "plot": RUNNING}, 3, 0.5),
        ({"squares": DONE, "plot": DONE}, 3, 1.0),
        ({"squares": DONE, "plot": TaskState.SKIPPED}, 3, 1.0),
        ({"squares": TaskState.SKIPPED, "plot": TaskState.SKIPPED}, 1, 1.0),
        ({"squares": TaskState.FAILED, "plot": WAITING}, 2, (2 / 3) / 2),
    ],
)
def test_run_progress(
    run_log: list[ev.Event], tasks: dict[str, TaskState], done: int | None, expected: float
) -> None:
    record = with_tasks(fold(run_log[:1]), tasks, done)
    assert run_progress(record) == pytest.approx(expected, abs=1e-12)


def test_run_progress_is_below_one_until_every_task_is_over(run_log: list[ev.Event]) -> None:
    values = [run_progress(fold(run_log[:length])) for length in range(1, len(run_log) + 1)]
    assert values[0] == 0.0
    assert values == sorted(values)
    assert values[-1] == 1.0
    assert all(value < 1.0 for value in values[:17])
    assert values[17] == 1.0


def test_run_progress_of_the_log(run_log: list[ev.Event]) -> None:
    assert run_progress(fold(run_log[:7])) == pytest.approx((1 / 3) / 2)
    assert run_progress(fold(run_log[:10])) == pytest.approx(0.99 / 2)
    assert run_progress(fold(run_log[:14])) == 0.5


def test_run_progress_of_no_tasks(run_log: list[ev.Event]) -> None:
    record = msgspec.structs.replace(fold(run_log[:1]), tasks={})
    assert run_progress(record) == 0.0


def test_run_progress_of_a_split_task_without_units(run_log: list[ev.Event]) -> None:
    record = fold(run_log[:1])
    record = msgspec.structs.replace(
        record,
        tasks={"squares": RUNNING, "plot": WAITING},
        progress={"squares": TaskProgress(units=0, done=0)},
    )
    assert run_progress(record) == 0.0


def test_run_item_of_a_running_run(run_log: list[ev.Event]) -> None:
    assert run_item(fold(run_log[:8])) == RunItem(
        id=RUN_ID,
        state=RunState.RUNNING,
        workflow="squares-and-plot",
        group="demo",
        submitted_by="alice",
        owner="alice",
        agent=None,
        priority=Priority.OWNER,
        tasks={"squares": RUNNING, "plot": WAITING},
        created=at(0),
        finished=None,
        message=None,
        seq=8,
        progress=pytest.approx((2 / 3) / 2),
    )


def test_run_item_of_an_ended_run_has_no_progress(run_log: list[ev.Event]) -> None:
    item = run_item(fold(run_log))
    assert item.state is RunState.SUCCEEDED
    assert item.progress is None
    assert item.finished == at(20)
    assert item.message == "2 tasks done"
    assert item.seq == 21
    assert item.tasks == {"squares": DONE, "plot": DONE}


def test_run_item_tasks_are_a_copy(run_log: list[ev.Event]) -> None:
    record = fold(run_log[:5])
    item = run_item(record)
    item.tasks["squares"] = DONE
    assert record.tasks["squares"] is RUNNING


def test_run_item_of_an_agent_run() -> None:
    submitted = ev.Submitted(
        seq=1,
        time=at(0),
        run=RUN_ID,
        workflow=Workflow(name="w", tasks=[TaskSpec(id="a", type="command")]),
        submitted_by="agent-7",
        owner="alice",
        agent="agent-7",
        priority=Priority.AGENT,
    )
    item = run_item(fold([submitted]))
    assert (item.submitted_by, item.owner, item.agent) == ("agent-7", "alice", "agent-7")
    assert item.priority is Priority.AGENT
    assert item.group is None
    assert item.progress == 0.0
    assert item.state is RunState.SUBMITTING


def test_progress_view(run_log: list[ev.Event]) -> None:
    record = fold(run_log[:8])
    record.task_messages["plot"] = "waiting for squares"
    assert progress_view(record) == ProgressView(
        run=RUN_ID,
        state=RunState.RUNNING,
        seq=8,
        tasks={
            "squares": TaskProgressView(
                state=RUNNING, units=3, done=2, first_done=at(6), last_done=at(7)
            ),
            "plot": TaskProgressView(
                state=WAITING, units=None, done=0, message="waiting for squares"
            ),
        },
    )


def test_progress_view_of_a_finished_run(run_log: list[ev.Event]) -> None:
    view = progress_view(fold(run_log))
    assert view.state is RunState.SUCCEEDED
    assert view.seq == 21
    assert view.tasks["squares"] == TaskProgressView(
        state=DONE, units=3, done=3, first_done=at(6), last_done=at(8)
    )
    assert view.tasks["plot"] == TaskProgressView(state=DONE, units=None, done=0)
