"""simrun_core.views: the view of a run, its progress, its list item and the progress of its
tasks."""

from __future__ import annotations

import msgspec
import pytest
from core_samples import RUN_ID, at

from simrun_core import events as ev
from simrun_core.fold import ProgressLine, RunRecord, TaskProgress, fold
from simrun_core.provenance import SourceProvenance
from simrun_core.states import RunState, TaskState
from simrun_core.views import (
    progress_view,
    run_item,
    run_progress,
    run_view,
    task_view,
    view_item,
)
from simrun_core.wire import (
    LedgerCounts,
    PlanView,
    PodView,
    ProgressView,
    RunItem,
    RunView,
    TaskProgressView,
    TaskView,
)
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
                state=RUNNING,
                units=3,
                done=2,
                first_done=at(6),
                last_done=at(7),
                counts=LedgerCounts(pending=1, claimed=0, done=2, total=3),
                first=ProgressLine(index=0, worker="squares-0", seconds=0.5, time=at(6)),
                last=ProgressLine(index=2, worker="squares-0", seconds=0.5, time=at(7)),
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
        state=DONE,
        units=3,
        done=3,
        first_done=at(6),
        last_done=at(8),
        counts=LedgerCounts(pending=0, claimed=0, done=3, total=3),
        first=ProgressLine(index=0, worker="squares-0", seconds=0.5, time=at(6)),
        last=ProgressLine(index=1, worker="squares-0", seconds=0.5, time=at(8)),
    )
    assert view.tasks["plot"] == TaskProgressView(state=DONE, units=None, done=0)


def test_the_ledger_counts_of_a_live_task_take_its_claims(run_log: list[ev.Event]) -> None:
    record = fold(run_log[:8])
    counts = progress_view(record, {"squares": 1}).tasks["squares"].counts
    assert counts == LedgerCounts(pending=0, claimed=1, done=2, total=3)
    # more claims than units left (a unit done in the ledger before its event is copied)
    counts = progress_view(record, {"squares": 5}).tasks["squares"].counts
    assert counts == LedgerCounts(pending=0, claimed=1, done=2, total=3)
    # an ended run holds no claims
    ended = progress_view(fold(run_log), {"squares": 2}).tasks["squares"].counts
    assert ended == LedgerCounts(pending=0, claimed=0, done=3, total=3)


GIB = 1024**3
FAILED, SKIPPED = TaskState.FAILED, TaskState.SKIPPED


def split_log(submitted: ev.Submitted) -> list[ev.Event]:
    """`squares` split over two workers on two servers; w0 is killed for memory, retried with
    the retry memory, and killed again: the run fails."""
    square = "squares"
    return [
        submitted,
        ev.WorkflowSubmitted(seq=2, time=at(1), name=f"simrun-{RUN_ID}"),
        ev.TaskStateChanged(seq=3, time=at(2), task=square, state=RUNNING),
        ev.PodStarted(seq=4, time=at(3), task=square, worker="w0", node="node-1"),
        ev.PodStarted(seq=5, time=at(3), task=square, worker="w1", node="node-2"),
        ev.UnitDone(seq=6, time=at(4), task=square, index=0, worker="w1"),
        ev.WorkerReport(
            seq=7,
            time=at(5),
            task=square,
            worker="w1",
            processes=2,
            units_done=1,
            peak_memory_bytes=GIB // 2,
        ),
        ev.PodSucceeded(seq=8, time=at(5), task=square, worker="w1"),
        ev.PodFailed(seq=9, time=at(6), task=square, worker="w0", exit_code=137, oom=True),
        ev.OomKilled(seq=10, time=at(6), task=square, worker="w0", memory_gb=1.0),
        ev.TaskStateChanged(seq=11, time=at(6), task=square, state=TaskState.RETRYING),
        ev.PodStarted(seq=12, time=at(7), task=square, worker="w0", attempt=1, node="node-2"),
        ev.TaskStateChanged(seq=13, time=at(7), task=square, state=RUNNING),
        ev.PodFailed(
            seq=14, time=at(8), task=square, worker="w0", attempt=1, exit_code=137, oom=True
        ),
        ev.OomKilled(seq=15, time=at(8), task=square, worker="w0", attempt=1, memory_gb=1.0),
        ev.TaskStateChanged(
            seq=16,
            time=at(8),
            task=square,
            state=FAILED,
            message="w0 killed for memory again with the retry memory of 1 GiB",
        ),
        ev.Failed(seq=17, time=at(9), message="task 'squares' failed"),
    ]


def cancelled_log(run_log: list[ev.Event]) -> list[ev.Event]:
    """The sample run cancelled by bob after two units of `squares`."""
    return [
        *run_log[:8],
        ev.CancelRequested(seq=9, time=at(8), by="bob"),
        ev.PodFailed(seq=10, time=at(9), task="squares", worker="squares-0", exit_code=143),
        ev.Cancelled(seq=11, time=at(10), message="cancelled by bob"),
    ]


def test_run_view_of_a_split_task_with_pods(submitted: ev.Submitted) -> None:
    view = run_view(fold(split_log(submitted)[:8]))
    assert (view.id, view.seq, view.state) == (RUN_ID, 8, RunState.RUNNING)
    assert (view.submitted_by, view.owner, view.agent) == ("alice", "alice", None)
    assert (view.priority, view.group, view.backend) == (Priority.OWNER, "demo", "local")
    assert view.backend_name == f"simrun-{RUN_ID}"
    assert view.workflow == submitted.workflow and view.sources == []
    assert (view.created, view.started, view.finished) == (at(0), at(2), None)
    assert view.progress == pytest.approx((1 / 3) / 2)
    assert not view.ended and view.cancel_requested is None and view.message is None
    assert list(view.tasks) == ["squares", "plot"]
    squares = view.tasks["squares"]
    assert (squares.type, squares.state, squares.message) == ("demo.squares", RUNNING, None)
    assert (squares.units, squares.done, squares.first_done, squares.last_done) == (
        3,
        1,
        at(4),
        at(4),
    )
    shape = submitted.plans["squares"].shape
    assert squares.plan == PlanView(
        pods=submitted.plans["squares"].pods,
        cores=shape.cores,
        memory_gb=shape.memory_gb,
        processes=shape.processes,
        per_worker_gb=shape.per_worker_gb,
        retry_memory_gb=shape.retry_memory_gb,
        retry_per_worker_gb=shape.retry_per_worker_gb,
        scratch_gb=shape.scratch_gb,
        gpus=shape.gpus,
        source=None,
        seconds_per_unit=None,
        samples=0,
    )
    w0 = PodView(
        worker="w0",
        attempt=0,
        state="running",
        node="node-1",
        exit_code=None,
        oom=False,
        oom_kills=[],
        peak_memory_gb=None,
        processes=None,
        units_done=0,
    )
    w1 = msgspec.structs.replace(
        w0,
        worker="w1",
        state="succeeded",
        node="node-2",
        exit_code=0,
        peak_memory_gb=0.5,
        processes=2,
        units_done=1,
    )
    assert squares.pods == [w0, w1]
    plot = view.tasks["plot"]
    assert (plot.type, plot.state, plot.units, plot.done, plot.pods) == (
        "command",
        WAITING,
        None,
        0,
        [],
    )
    assert plot.plan is not None and plot.plan.memory_gb == 2.0


def test_run_view_of_a_failed_run(submitted: ev.Submitted) -> None:
    view = run_view(fold(split_log(submitted)))
    assert view.ended and view.state is RunState.FAILED
    assert (view.seq, view.finished, view.progress) == (17, at(9), None)
    assert view.message == "task 'squares' failed"
    squares = view.tasks["squares"]
    assert squares.state is FAILED
    assert squares.message == "w0 killed for memory again with the retry memory of 1 GiB"
    [w0, w1] = squares.pods
    assert (w0.worker, w0.attempt, w0.state, w0.node) == ("w0", 1, "failed", "node-2")
    assert (w0.exit_code, w0.oom, w0.oom_kills) == (137, True, [0, 1])
    assert (w1.state, w1.oom_kills) == ("succeeded", [])
    assert view.tasks["plot"].state is SKIPPED


def test_run_view_while_the_killed_pod_waits_for_its_retry(submitted: ev.Submitted) -> None:
    squares = run_view(fold(split_log(submitted)[:11])).tasks["squares"]
    assert squares.state is TaskState.RETRYING
    assert (squares.pods[0].attempt, squares.pods[0].oom_kills) == (0, [0])


def test_run_view_of_a_cancelled_run(run_log: list[ev.Event]) -> None:
    log = cancelled_log(run_log)
    asked = run_view(fold(log[:9]))
    assert (asked.state, asked.cancel_requested, asked.ended) == (RunState.RUNNING, "bob", False)
    view = run_view(fold(log))
    assert (view.state, view.cancel_requested, view.message) == (
        RunState.CANCELLED,
        "bob",
        "cancelled by bob",
    )
    assert view.ended and view.progress is None and view.finished == at(10)
    assert {task: found.state for task, found in view.tasks.items()} == {
        "squares": SKIPPED,
        "plot": SKIPPED,
    }
    squares = view.tasks["squares"]
    assert (squares.units, squares.done) == (3, 2)
    [pod] = squares.pods
    assert (pod.worker, pod.state, pod.exit_code, pod.oom) == ("squares-0", "failed", 143, False)


def test_a_worker_killed_for_memory_without_a_pod_event_is_failed(
    submitted: ev.Submitted,
) -> None:
    log = [
        submitted,
        ev.OomKilled(seq=2, time=at(1), task="squares", worker="w3", attempt=2),
    ]
    [pod] = run_view(fold(log)).tasks["squares"].pods
    assert (pod.worker, pod.attempt, pod.state, pod.oom, pod.oom_kills) == (
        "w3",
        2,
        "failed",
        True,
        [2],
    )


def logs(run_log: list[ev.Event], submitted: ev.Submitted) -> list[list[ev.Event]]:
    return [run_log, split_log(submitted), cancelled_log(run_log)]


def test_the_item_of_a_view_is_the_item_of_its_record(
    run_log: list[ev.Event], submitted: ev.Submitted
) -> None:
    for log in logs(run_log, submitted):
        for length in range(1, len(log) + 1):
            record = fold(log[:length])
            assert view_item(run_view(record)) == run_item(record), length


def test_a_task_view_is_the_task_of_the_run_view(
    run_log: list[ev.Event], submitted: ev.Submitted
) -> None:
    for log in logs(run_log, submitted):
        for length in range(1, len(log) + 1):
            record = fold(log[:length])
            view = run_view(record)
            assert {task: task_view(record, task) for task in record.tasks} == view.tasks
    with pytest.raises(KeyError):
        task_view(fold(run_log), "nope")


FOLD_INTERNALS = {"plans", "resources", "task_messages", "pods", "oom_kills", "merged", "logs_kept"}


def test_the_view_carries_no_fold_internals_and_decodes_as_it_was(
    run_log: list[ev.Event], submitted: ev.Submitted
) -> None:
    for log in logs(run_log, submitted):
        view = run_view(fold(log))
        body = msgspec.json.encode(view)
        data = msgspec.json.decode(body)
        assert set(data) == set(RunView.__struct_fields__)
        assert not FOLD_INTERNALS & set(data)
        for task in data["tasks"].values():
            assert set(task) == set(TaskView.__struct_fields__)
            assert set(task["plan"]) == set(PlanView.__struct_fields__)
            for pod in task["pods"]:
                assert set(pod) == set(PodView.__struct_fields__)
        assert msgspec.json.decode(body, type=RunView) == view


def test_the_view_shares_no_mutable_state_with_the_record(run_log: list[ev.Event]) -> None:
    record = fold(run_log[:8])
    view = run_view(record)
    view.sources.append(SourceProvenance(name="x", path="/x"))
    view.tasks["squares"].pods.clear()
    assert record.sources == []
    assert list(record.pods["squares"]) == ["squares-0"]
