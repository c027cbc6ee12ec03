"""The policy of every backend: retries, task states and the end of a run, decided by `decide`
from folded state and one message, with plain values."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from core_samples import sample_plans, sample_submitted

import simrun_core
from simrun_core import events as ev
from simrun_core import messages as msg
from simrun_core.decider import STOP_RETRIES, decide, decide_retry
from simrun_core.fold import RunFold, RunRecord
from simrun_core.messages import Decision
from simrun_core.provenance import SourceProvenance
from simrun_core.states import RunState, TaskState
from simrun_core.workflow import TaskSpec, Workflow


def test_a_kill_for_memory_is_retried_once_with_the_retry_memory():
    first = decide_retry(137, oom=True, on_retry_memory=False, stops=0, retry_per_worker_gb=0.375)
    assert (first.retry, first.retry_memory) == (True, True)
    assert first.message == "killed for memory; retried with 0.375 GiB per process"
    second = decide_retry(137, oom=True, on_retry_memory=True, stops=0, retry_per_worker_gb=0.375)
    assert (second.retry, second.retry_memory) == (False, True)
    assert "again with the retry memory of 0.375 GiB per process" in second.message


def test_a_process_stopped_from_outside_is_retried_a_few_times():
    for code in (137, 143, 128 + 1):
        decision = decide_retry(code, False, False, stops=0, retry_per_worker_gb=1)
        assert decision.retry and not decision.retry_memory, code
    last = decide_retry(143, False, False, stops=STOP_RETRIES, retry_per_worker_gb=1)
    assert not last.retry
    assert last.message == f"stopped from outside {STOP_RETRIES + 1} times"


def test_a_stop_keeps_the_retry_memory_of_an_earlier_kill():
    decision = decide_retry(143, False, on_retry_memory=True, stops=0, retry_per_worker_gb=1)
    assert decision.retry and decision.retry_memory


def test_any_other_exit_fails_at_once_naming_it():
    for code in (1, 3, 4, 2):
        decision = decide_retry(code, False, False, stops=0, retry_per_worker_gb=1)
        assert not decision.retry
        assert decision.message == f"exit code {code}"


# -- decide: plain folded states and messages ----------------------------------------------------


class Run:
    """A run driven through `decide` alone: each decision's events are numbered and folded, as
    the actor does after appending them; `commands` collects what was asked."""

    def __init__(self, submitted: ev.Submitted) -> None:
        self.state = RunFold()
        self.state.apply(msgspec.structs.replace(submitted, seq=1))
        self.events: list[ev.Event] = []
        self.commands: list[object] = []

    @property
    def record(self) -> RunRecord:
        assert self.state.record is not None
        return self.state.record

    def tell(self, message: msg.Message) -> Decision:
        decision = decide(self.state, message)
        for event in decision.events:
            numbered = msgspec.structs.replace(event, seq=self.record.seq + 1)
            self.state.apply(numbered)
            self.events.append(numbered)
        self.commands += decision.commands
        return decision

    def started(self) -> Run:
        self.tell(msg.Resume())
        self.tell(msg.WorkflowAccepted(name="simrun-x"))
        return self


def pod(
    task: str, phase: str, worker: str | None = None, attempt: int = 0, **facts
) -> msg.PodChanged:
    """A change of a pod of a task: by default of its main worker (the coordinator `w0` of the
    split `squares`, the task itself for the command task `plot`)."""
    worker = worker or ("w0" if task == "squares" else task)
    return msg.PodChanged(task=task, worker=worker, attempt=attempt, phase=phase, **facts)


def kinds(decision: Decision) -> list[str]:
    return [event.__struct_config__.tag for event in decision.events]


def report(task: str, worker: str = "w0", attempt: int = 0, **fields) -> ev.WorkerReport:
    return ev.WorkerReport(task=task, worker=worker, attempt=attempt, **fields)


SQUARES_FIRST = msg.SubmitRun(ready=frozenset({"squares"}))
"""The submission of a new sample run: `plot` reads from `squares`, which starts first."""


def test_a_new_run_resolves_its_environment_and_is_submitted(submitted: ev.Submitted) -> None:
    run = Run(submitted)
    decision = run.tell(msg.Resume())
    assert kinds(decision) == ["environment-resolved", "built"]
    assert decision.commands == [SQUARES_FIRST]
    assert kinds(run.tell(msg.WorkflowAccepted(name="simrun-x"))) == ["workflow-submitted"]
    assert run.record.state is RunState.QUEUED
    assert run.tell(msg.WorkflowAccepted(name="simrun-x")) == Decision()


def test_a_kill_for_memory_is_retried_with_the_retry_memory_then_fails(
    submitted: ev.Submitted,
) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    first = run.tell(pod("squares", "failed", exit_code=137, oom=True))
    assert kinds(first) == ["pod-failed", "oom-killed", "task-state"]
    assert run.record.tasks["squares"] is TaskState.RETRYING
    assert first.commands == [
        msg.RetryPod(task="squares", worker="w0", attempt=1, retry_memory=True)
    ]
    second = run.tell(pod("squares", "failed", attempt=1, exit_code=137, oom=True))
    assert run.record.tasks["squares"] is TaskState.FAILED
    assert "again with the retry memory" in run.record.task_messages["squares"]
    assert msg.StopPods() in second.commands and msg.KeepLogs(task="squares") in second.commands
    gone = run.tell(msg.PodsGone())
    assert kinds(gone) == ["failed"]
    assert run.record.message.startswith("task 'squares' failed: w0 attempt 1: killed")


def two_split_tasks() -> ev.Submitted:
    """A run of two split tasks, `squares` and `cubes`: both coordinators are `w0`."""
    workflow = Workflow(
        name="two",
        tasks=[
            TaskSpec(id="squares", type="demo.squares", settings={"n": 3}),
            TaskSpec(id="cubes", type="demo.squares", settings={"n": 3}),
        ],
    )
    return sample_submitted(workflow, sample_plans(workflow))


def test_the_kills_of_one_task_give_no_retry_memory_to_another() -> None:
    """Both tasks have a worker `w0`: a kill for memory of one is not the other's."""
    run = Run(two_split_tasks()).started()
    run.tell(pod("squares", "failed", exit_code=137, oom=True))
    decision = run.tell(pod("cubes", "failed", worker="w0", exit_code=137, oom=True))
    assert decision.commands == [
        msg.RetryPod(task="cubes", worker="w0", attempt=1, retry_memory=True)
    ]
    assert run.record.oom_kills == {"squares": {"w0": [0]}, "cubes": {"w0": [0]}}


def test_a_resumed_run_keys_attempts_and_retry_memory_by_task_and_worker() -> None:
    run = Run(two_split_tasks()).started()
    run.tell(pod("squares", "running"))
    run.tell(pod("squares", "failed", exit_code=137, oom=True))
    run.tell(pod("squares", "running", attempt=1))
    run.tell(pod("cubes", "running", worker="w0"))
    decision = run.tell(msg.Resume())
    assert [(e.task, e.attempt, e.retry, e.message) for e in decision.events] == [
        ("squares", 1, True, "the service stopped while the pod ran"),
        ("cubes", 0, True, "the service stopped while the pod ran"),
    ]
    [submit] = decision.commands
    assert submit == msg.SubmitRun(
        ready=frozenset({"squares", "cubes"}),
        next_attempts={("squares", "w0"): 2, ("cubes", "w0"): 1},
        retry_memory=frozenset({("squares", "w0")}),
    )


def test_stops_from_outside_are_counted_per_task_and_worker(submitted: ev.Submitted) -> None:
    run = Run(submitted).started()
    for attempt in range(STOP_RETRIES):
        decision = run.tell(pod("squares", "failed", attempt=attempt, exit_code=143))
        assert decision.commands[0] == msg.RetryPod(
            task="squares", worker="w0", attempt=attempt + 1
        )
    assert run.tell(pod("plot", "failed", exit_code=143)).commands[0] == msg.RetryPod(
        task="plot", worker="plot", attempt=1
    )
    last = run.tell(pod("squares", "failed", attempt=STOP_RETRIES, exit_code=143))
    assert run.record.tasks["squares"] is TaskState.FAILED
    assert msg.StopPods() in last.commands


def test_a_harness_error_is_named_by_the_report_of_its_attempt(submitted: ev.Submitted) -> None:
    run = Run(submitted).started()
    failed = report("squares", exit_code=3, failed=True, message="unit 1 failed: ValueError: x")
    run.tell(pod("squares", "failed", exit_code=3, message="log w0-0.log", harness=[failed]))
    assert run.record.task_messages["squares"] == "w0 attempt 0: unit 1 failed: ValueError: x"
    assert run.state.reported[("squares", "w0", 0)] == run.events[-4]


def test_a_split_task_done_without_merging_waits_for_its_marker_then_fails(
    submitted: ev.Submitted,
) -> None:
    run = Run(submitted).started()
    waiting = run.tell(pod("squares", "succeeded", exit_code=0))
    assert kinds(waiting) == ["pod-succeeded"]
    assert waiting.commands == [msg.AwaitMergeMarker(task="squares")]
    assert run.record.tasks["squares"] is not TaskState.DONE
    failed = run.tell(msg.MergeMarker(task="squares", found=False))
    assert run.record.tasks["squares"] is TaskState.FAILED
    assert (
        run.record.task_messages["squares"] == "the coordinator succeeded without merging the units"
    )
    assert msg.StopPods() in failed.commands
    assert run.tell(msg.MergeMarker(task="squares", found=True)) == Decision()


def test_a_marker_seen_after_the_coordinators_end_makes_the_task_done(
    submitted: ev.Submitted,
) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "succeeded", exit_code=0))
    done = run.tell(msg.MergeMarker(task="squares", found=True))
    assert kinds(done) == ["task-state", "logs-kept"]
    assert run.record.tasks["squares"] is TaskState.DONE


def test_a_run_resumed_while_a_task_waited_for_its_marker_waits_again(
    submitted: ev.Submitted,
) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "succeeded", exit_code=0))
    resumed = run.tell(msg.Resume())
    assert resumed.commands[0] == msg.AwaitMergeMarker(task="squares")
    [submit] = [c for c in resumed.commands if isinstance(c, msg.SubmitRun)]
    assert "squares" in submit.done  # not started again
    assert submit.ready == frozenset({"plot"}), "its coordinator merged: what reads it starts"


def test_a_task_merged_by_a_pod_of_its_own_is_not_done_before_that_pod(
    submitted: ev.Submitted,
) -> None:
    plans = dict(submitted.plans)
    plans["squares"] = msgspec.structs.replace(plans["squares"], coordinator_merges=False)
    run = Run(msgspec.structs.replace(submitted, plans=plans)).started()
    run.tell(pod("squares", "succeeded", exit_code=0))
    resumed = run.tell(msg.Resume())
    assert msg.AwaitMergeMarker(task="squares") in resumed.commands
    [submit] = [c for c in resumed.commands if isinstance(c, msg.SubmitRun)]
    assert "squares" not in submit.done  # a Workflow made again still has its merge pod
    assert submit.ready == frozenset({"squares"}), "plot waits for the merge pod"


def test_an_extra_worker_never_fails_its_task(submitted: ev.Submitted) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    run.tell(pod("squares", "running", worker="w1"))
    failed = run.tell(pod("squares", "failed", worker="w1", exit_code=3))
    assert kinds(failed) == ["pod-failed"] and failed.commands == []
    retried = run.tell(pod("squares", "failed", worker="w2", exit_code=143))
    assert retried.commands == [msg.RetryPod(task="squares", worker="w2", attempt=1)]
    succeeded = run.tell(pod("squares", "succeeded", worker="w3", exit_code=0, merged_marker=True))
    assert kinds(succeeded) == ["pod-succeeded"] and succeeded.commands == []
    assert run.record.tasks["squares"] is TaskState.RUNNING


def test_the_merge_marker_counts_as_merged(submitted: ev.Submitted) -> None:
    run = Run(submitted).started()
    decision = run.tell(pod("squares", "succeeded", exit_code=0, merged_marker=True))
    assert run.record.tasks["squares"] is TaskState.DONE
    assert decision.commands == [
        msg.StartTask(task="plot"),
        msg.KeepLogs(task="squares"),
        msg.Learn(task="squares"),
    ]


def test_an_extra_worker_started_after_its_task_is_done_leaves_it_done(
    submitted: ev.Submitted,
) -> None:
    """On a cluster an extra worker may be admitted only once its coordinator merged (the
    quota was taken): its start is logged and the task stays done, so the run can end; the
    end of the last task stops it (the decider, not the actor, decides that the run's workflow
    is stopped), and its end then is not retried."""
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    run.tell(pod("squares", "succeeded", exit_code=0, merged_marker=True))
    late = run.tell(pod("squares", "running", worker="w1"))
    assert kinds(late) == ["pod-started"] and late.commands == []
    assert run.record.tasks["squares"] is TaskState.DONE
    last = run.tell(pod("plot", "succeeded", exit_code=0))
    assert msg.StopPods() in last.commands and msg.Settle() not in last.commands
    stopped = run.tell(pod("squares", "failed", worker="w1", exit_code=143))
    assert kinds(stopped) == ["pod-failed"] and stopped.commands == []
    assert run.record.tasks["squares"] is TaskState.DONE


def test_the_last_task_done_settles_when_no_pod_is_left(submitted: ev.Submitted) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    run.tell(pod("squares", "succeeded", exit_code=0, merged_marker=True))
    run.tell(pod("plot", "running"))
    last = run.tell(pod("plot", "succeeded", exit_code=0))
    assert last.commands[-1] == msg.Settle()


def test_the_run_succeeds_after_its_last_task_and_what_the_logs_had_left(
    submitted: ev.Submitted,
) -> None:
    run = Run(submitted).started()
    units = [ev.UnitDone(task="squares", index=i, worker="w0") for i in range(3)]
    run.tell(msg.HarnessRead(events=units[:2]))
    merged = ev.Merged(task="squares", worker="w0")
    run.tell(pod("squares", "succeeded", exit_code=0, harness=[units[1], merged]))
    last = run.tell(pod("plot", "succeeded", exit_code=0))
    assert msg.Settle() in last.commands and not run.record.ended
    gone = run.tell(msg.PodsGone(harness=[units[0], units[2]]))
    assert kinds(gone) == ["unit-done", "succeeded"]
    assert run.record.state is RunState.SUCCEEDED
    assert run.record.progress["squares"].done == 3
    assert run.tell(pod("plot", "failed", exit_code=1)) == Decision()


def test_each_harness_event_is_copied_once(submitted: ev.Submitted) -> None:
    run = Run(submitted).started()
    unit = ev.UnitDone(task="squares", index=0, worker="w0")
    first = run.tell(msg.HarnessRead(events=[unit, unit, report("squares"), report("squares")]))
    assert kinds(first) == ["unit-done", "worker-report"]
    assert run.tell(msg.HarnessRead(events=[unit, report("squares")])) == Decision()


def test_a_cancel_is_accepted_once_then_the_run_ends_cancelled(submitted: ev.Submitted) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    accepted = run.tell(msg.CancelAsked(by="bob"))
    assert kinds(accepted) == ["cancel-requested"]
    assert accepted.commands == [msg.AnswerCancel(accepted=True), msg.StopPods()]
    again = run.tell(msg.CancelAsked(by="eve"))
    assert again.commands == [msg.AnswerCancel(accepted=False, state="cancelled")]
    stopped = run.tell(pod("squares", "failed", exit_code=143))
    assert kinds(stopped) == ["pod-failed"] and stopped.commands == []
    gone = run.tell(msg.PodsGone())
    assert kinds(gone) == ["task-state", "logs-kept", "cancelled"]
    assert gone.commands == [msg.KeepLogs(task="squares")]
    assert run.record.message == "cancelled by bob"
    assert run.record.tasks == {"squares": TaskState.CANCELLED, "plot": TaskState.SKIPPED}
    assert run.record.task_messages["squares"] == "cancelled by bob"


def test_an_acknowledged_cancel_survives_a_restart(submitted: ev.Submitted) -> None:
    """The service died after `cancel-requested`: the next one does not resume the run."""
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    run.tell(msg.CancelAsked(by="bob"))
    resumed = run.tell(msg.Resume())
    assert [(e.task, e.retry) for e in resumed.events] == [("squares", False)]
    assert resumed.commands == [msg.StopPods()]
    run.tell(msg.PodsGone())
    assert run.record.state is RunState.CANCELLED


def test_a_failed_task_cancels_the_tasks_still_running(submitted: ev.Submitted) -> None:
    run = Run(submitted).started()
    run.tell(pod("plot", "running"))
    run.tell(pod("squares", "failed", exit_code=1))
    run.tell(pod("plot", "failed", exit_code=143))
    assert kinds(run.tell(msg.PodsGone())) == ["task-state", "logs-kept", "failed"]
    assert run.record.tasks == {"squares": TaskState.FAILED, "plot": TaskState.CANCELLED}
    assert run.record.task_messages["plot"] == "stopped: task 'squares' failed"


def test_a_run_that_is_ending_refuses_a_cancel(submitted: ev.Submitted) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "failed", exit_code=1))
    assert run.tell(msg.CancelAsked(by="bob")).commands == [
        msg.AnswerCancel(accepted=False, state="failed")
    ]


def test_a_store_written_again_ends_the_run_failed_naming_the_error(
    submitted: ev.Submitted,
) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    stopped = pod("squares", "failed", exit_code=143)
    decision = run.tell(msg.StoreWritable(error="[Errno 28] No space left", changes=[stopped]))
    assert kinds(decision) == ["pod-failed", "task-state", "logs-kept", "failed"]
    assert decision.commands == [msg.KeepLogs(task="squares")]
    assert run.record.tasks["squares"] is TaskState.CANCELLED
    assert run.record.message == (
        "the run was stopped: the store cannot be written: [Errno 28] No space left"
    )


def test_an_ended_run_or_an_unknown_message_decides_nothing(submitted: ev.Submitted) -> None:
    run = Run(submitted).started()
    assert decide(run.state, msg.Message()) == Decision()
    assert decide(RunFold(), msg.Resume()) == Decision()
    assert run.tell(pod("nosuchtask", "failed", exit_code=1)) == Decision()
    run.tell(msg.CancelAsked(by="bob"))
    run.tell(msg.PodsGone())
    for message in (msg.Resume(), pod("squares", "running"), msg.PodsGone()):
        assert run.tell(message) == Decision()


def test_decide_imports_no_io() -> None:
    """The decider is pure: importing it loads no event loop, process, socket, database or
    store module (in a fresh interpreter)."""
    code = (
        "import sys; before = set(sys.modules)\n"
        "import simrun_core.decider\n"
        "io = {'asyncio', 'anyio', 'subprocess', 'sqlite3', 'aiosqlite', 'simrun_core.store',"
        " 'simrun_core.faults', 'simrun_api', 'simrun_harness'}\n"
        "print(sorted(io & (set(sys.modules) - before)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


DECIDING = ("decider.py", "messages.py", "fold.py", "exits.py", "states.py")


@pytest.mark.parametrize("module", DECIDING)
def test_the_modules_of_a_decision_do_no_io(module: str) -> None:
    """Neither the decider nor what it decides with imports os, pathlib, io, asyncio or anyio,
    nor opens a file."""
    tree = ast.parse((Path(simrun_core.__file__).parent / module).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"os", "pathlib", "io", "asyncio", "anyio", "shutil", "subprocess"}
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "open" not in calls


def test_admission_and_preemption_by_the_queue(submitted: ev.Submitted) -> None:
    """A cluster's queue admits a pod, later deletes it for a higher priority: the attempt is
    retried with the retry memory it had, and a preemption is no stop from outside."""
    run = Run(submitted).started()
    run.tell(pod("squares", "pending"))
    admitted = run.tell(pod("squares", "admitted"))
    assert kinds(admitted) == ["pod-admitted"]
    run.tell(pod("squares", "running"))
    run.tell(pod("squares", "failed", exit_code=137, oom=True))
    for attempt in range(1, STOP_RETRIES + 3):
        preempted = run.tell(pod("squares", "preempted", attempt=attempt))
        assert kinds(preempted) == ["pod-preempted", "task-state"]
        assert run.record.tasks["squares"] is TaskState.PREEMPTED
        retry = msg.RetryPod(task="squares", worker="w0", attempt=attempt + 1, retry_memory=True)
        assert preempted.commands == [retry]
    assert kinds(run.tell(pod("squares", "admitted", attempt=STOP_RETRIES + 3))) == [
        "pod-admitted",
        "task-state",
    ]
    assert run.record.tasks["squares"] is TaskState.QUEUED
    assert run.state.stops.get(("squares", "w0"), 0) == 0


def test_a_preempted_extra_worker_is_retried_without_changing_its_task(
    submitted: ev.Submitted,
) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    preempted = run.tell(pod("squares", "preempted", worker="w1"))
    assert kinds(preempted) == ["pod-preempted"]
    assert preempted.commands == [msg.RetryPod(task="squares", worker="w1", attempt=1)]
    assert run.record.tasks["squares"] is TaskState.RUNNING


def test_a_kill_on_the_first_memory_after_a_preemption_is_retried(submitted: ev.Submitted) -> None:
    """Argo gives the attempt after a preemption that followed a kill for memory the first
    memory again (spec 11 findings): its kill, reported with the memory it had, is no second
    kill with the retry memory; the attempt after it gets the retry memory."""
    run = Run(submitted).started()
    run.tell(pod("squares", "failed", exit_code=137, oom=True))
    run.tell(pod("squares", "preempted", attempt=1))
    first_memory = pod(
        "squares", "failed", attempt=2, exit_code=137, oom=True, on_retry_memory=False
    )
    decision = run.tell(first_memory)
    assert run.record.tasks["squares"] is TaskState.RETRYING
    assert decision.commands == [
        msg.RetryPod(task="squares", worker="w0", attempt=3, retry_memory=True)
    ]
    run.tell(pod("squares", "failed", attempt=3, exit_code=137, oom=True, on_retry_memory=True))
    assert run.record.tasks["squares"] is TaskState.FAILED


def test_a_resume_takes_over_the_pods_of_a_cluster_which_outlive_the_service(
    submitted: ev.Submitted,
) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    run.tell(pod("plot", "failed", exit_code=143))
    decision = run.tell(msg.Resume(pods_survive=True))
    assert decision.events == []  # nothing failed: the pod still runs in the cluster
    [submit] = decision.commands
    assert submit == msg.SubmitRun(
        ready=frozenset({"squares"}), next_attempts={("squares", "w0"): 0, ("plot", "plot"): 1}
    )


def test_a_run_the_backend_refuses_for_good_ends_failed_with_the_reason(
    submitted: ev.Submitted,
) -> None:
    run = Run(submitted)
    run.tell(msg.Resume())
    refused = run.tell(msg.SubmissionRefused(reason="task 'plot': no image"))
    assert kinds(refused) == ["failed"]
    assert run.record.message == "the run could not be submitted: task 'plot': no image"
    assert run.tell(msg.SubmissionRefused(reason="again")) == Decision()


# -- reservations ---------------------------------------------------------------------------------


@pytest.fixture
def reserving(submitted: ev.Submitted) -> ev.Submitted:
    return msgspec.structs.replace(submitted, reserve="node-1")


def test_a_reserved_run_holds_its_node_before_it_is_submitted(reserving: ev.Submitted) -> None:
    run = Run(reserving)
    resumed = run.tell(msg.Resume())
    assert kinds(resumed) == ["environment-resolved", "built"]
    assert resumed.commands == [msg.ReserveNode(node="node-1")]
    taken = run.tell(msg.NodeReservation(node="node-1", taken=True))
    assert kinds(taken) == ["node-reserved"]
    assert taken.commands == [SQUARES_FIRST]
    assert run.record.reserved == "node-1"
    again = run.tell(msg.Resume())
    assert again.events == [] and again.commands == [SQUARES_FIRST], "reserved once, built once"


def test_a_reserved_run_releases_its_node_after_its_terminal_event(
    reserving: ev.Submitted,
) -> None:
    run = Run(reserving)
    run.tell(msg.Resume())
    run.tell(msg.NodeReservation(node="node-1", taken=True))
    run.tell(msg.WorkflowAccepted(name="simrun-x"))
    run.tell(pod("squares", "succeeded", exit_code=0, merged_marker=True))
    run.tell(pod("plot", "succeeded", exit_code=0))
    gone = run.tell(msg.PodsGone())
    assert kinds(gone) == ["succeeded"]
    assert gone.commands == [msg.ReleaseNode(node="node-1")]
    released = run.tell(msg.NodeRelease(node="node-1"))
    assert kinds(released) == ["node-released"]
    assert run.record.reserved is None and run.record.state is RunState.SUCCEEDED
    assert run.tell(msg.Resume()) == Decision(), "nothing is left to release"


def test_a_release_not_recorded_is_asked_again_at_every_resume(reserving: ev.Submitted) -> None:
    run = Run(reserving)
    run.tell(msg.Resume())
    run.tell(msg.NodeReservation(node="node-1", taken=True))
    run.tell(msg.WorkflowAccepted(name="simrun-x"))
    run.tell(pod("squares", "running"))
    run.tell(msg.CancelAsked(by="bob"))
    cancelled = run.tell(msg.PodsGone())
    assert kinds(cancelled)[-1] == "cancelled"
    assert cancelled.commands[-1] == msg.ReleaseNode(node="node-1")
    for _ in range(2):  # the release failed: the actor restarts, the resume asks again
        assert run.tell(msg.Resume()) == Decision(commands=[msg.ReleaseNode(node="node-1")])
    assert kinds(run.tell(msg.NodeRelease(node="node-1"))) == ["node-released"]
    assert run.tell(msg.NodeRelease(node="node-1")) == Decision()


def test_a_node_that_cannot_be_reserved_fails_the_run_unsubmitted(
    reserving: ev.Submitted,
) -> None:
    run = Run(reserving)
    run.tell(msg.Resume())
    refused = run.tell(
        msg.NodeReservation(node="node-1", taken=False, reason="it is reserved for run r2")
    )
    assert kinds(refused) == ["failed"] and refused.commands == [], "nothing to release"
    assert run.record.message == (
        "the run could not be submitted: node 'node-1' cannot be reserved: "
        "it is reserved for run r2"
    )


def test_a_refused_submission_releases_the_node_it_reserved(reserving: ev.Submitted) -> None:
    run = Run(reserving)
    run.tell(msg.Resume())
    run.tell(msg.NodeReservation(node="node-1", taken=True))
    refused = run.tell(msg.SubmissionRefused(reason="no image"))
    assert kinds(refused) == ["failed"]
    assert refused.commands == [msg.ReleaseNode(node="node-1")]


def test_a_run_cancelled_before_its_submission_reserves_nothing(reserving: ev.Submitted) -> None:
    run = Run(reserving)
    run.state.apply(ev.CancelRequested(seq=2, by="bob"))
    resumed = run.tell(msg.Resume())
    assert msg.StopPods() in resumed.commands
    assert not any(isinstance(c, msg.ReserveNode) for c in resumed.commands)
    assert run.tell(msg.PodsGone()).commands == []


# -- environments ---------------------------------------------------------------------------------


@pytest.fixture
def snapshotted(submitted: ev.Submitted) -> ev.Submitted:
    model = SourceProvenance(name="model", commit="a" * 40, snapshot="snapshots/model/" + "b" * 64)
    return msgspec.structs.replace(submitted, sources=[model])


IMAGE = "registry:5000/simrun-env:abc"


def test_a_snapshotted_model_gets_its_environment_and_image_before_its_submission(
    snapshotted: ev.Submitted,
) -> None:
    run = Run(snapshotted)
    resumed = run.tell(msg.Resume(builds_images=True))
    assert resumed == Decision(commands=[msg.ResolveEnvironment()])
    ready = run.tell(msg.EnvironmentReady(image=IMAGE, lock_sha256="c" * 64))
    assert kinds(ready) == ["environment-resolved"]
    assert ready.commands == [msg.BuildImage(image=IMAGE)]
    assert run.record.image == IMAGE and run.record.built is None
    again = run.tell(msg.Resume(builds_images=True))
    assert again == Decision(commands=[msg.BuildImage(image=IMAGE)]), "not resolved twice"
    built = run.tell(msg.ImageReady(image=IMAGE, seconds=12.5))
    assert kinds(built) == ["built"] and built.commands == [SQUARES_FIRST]
    [event] = built.events
    assert isinstance(event, ev.Built) and (event.image, event.seconds) == (IMAGE, 12.5)
    assert run.tell(msg.ImageReady(image=IMAGE, cached=True)) == Decision(), "built once"
    assert run.tell(msg.Resume(builds_images=True)).commands == [SQUARES_FIRST]


def test_a_model_without_an_environment_runs_in_the_service_s_own(
    snapshotted: ev.Submitted,
) -> None:
    run = Run(msgspec.structs.replace(snapshotted, reserve="node-1"))
    run.tell(msg.Resume(builds_images=True))
    ready = run.tell(msg.EnvironmentReady(image=None))
    assert kinds(ready) == ["environment-resolved", "built"]
    assert ready.commands == [msg.ReserveNode(node="node-1")], "then its node, then the rest"


def test_without_images_or_a_snapshot_nothing_is_resolved(
    submitted: ev.Submitted, snapshotted: ev.Submitted
) -> None:
    assert Run(submitted).tell(msg.Resume(builds_images=True)).commands == [SQUARES_FIRST]
    assert Run(snapshotted).tell(msg.Resume()).commands == [SQUARES_FIRST]


def test_an_environment_that_fails_fails_the_run_unsubmitted(snapshotted: ev.Submitted) -> None:
    run = Run(snapshotted)
    run.tell(msg.Resume(builds_images=True))
    failed = run.tell(msg.EnvironmentFailed(reason="uv lock: no solution"))
    assert kinds(failed) == ["failed"] and failed.commands == []
    assert run.record.message == "the environment of the run failed: uv lock: no solution"


def test_a_run_cancelled_while_its_image_builds_is_not_submitted(
    snapshotted: ev.Submitted,
) -> None:
    run = Run(snapshotted)
    run.tell(msg.Resume(builds_images=True))
    run.tell(msg.EnvironmentReady(image=IMAGE))
    cancel = run.tell(msg.CancelAsked(by="bob"))
    assert msg.StopPods() in cancel.commands
    assert kinds(run.tell(msg.PodsGone())) == ["cancelled"]
    assert run.tell(msg.ImageReady(image=IMAGE, seconds=3.0)) == Decision()


def test_a_venv_of_the_snapshots_that_cannot_be_made_fails_the_run_before_any_pod(
    snapshotted: ev.Submitted,
) -> None:
    run = Run(snapshotted).started()  # the local backend: no image, its own venv of the run
    failed = run.tell(msg.EnvironmentFailed(reason="pip exited with code 1"))
    assert kinds(failed) == ["failed"]
    assert run.record.message == "the environment of the run failed: pip exited with code 1"
    late = Run(snapshotted).started()
    late.tell(pod("squares", "running"))
    assert late.tell(msg.EnvironmentFailed(reason="late")) == Decision()


def test_a_workflow_gone_under_a_live_run_preempts_its_live_attempts_and_resubmits(
    submitted: ev.Submitted,
) -> None:
    """Recovery of a deleted workflow is the decider's: the attempts the run had live end
    preempted (no stop counted), the tasks done are left out and every worker goes on after
    its attempts so far, with the retry memory of a worker killed for memory."""
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    run.tell(pod("squares", "running", worker="w1"))
    run.tell(pod("squares", "failed", worker="w1", exit_code=137, oom=True))
    run.tell(pod("squares", "running", worker="w1", attempt=1))
    gone = run.tell(msg.WorkflowGone(name="simrun-x"))
    assert kinds(gone) == ["pod-preempted", "task-state", "pod-preempted"]
    assert [(e.worker, e.attempt) for e in gone.events if isinstance(e, ev.PodPreempted)] == [
        ("w0", 0),
        ("w1", 1),
    ]
    assert run.record.tasks["squares"] is TaskState.PREEMPTED
    assert gone.commands == [
        msg.SubmitRun(
            ready=frozenset({"squares"}),
            next_attempts={("squares", "w0"): 1, ("squares", "w1"): 2},
            retry_memory=frozenset({("squares", "w1")}),
        )
    ]
    assert run.state.stops.get(("squares", "w0"), 0) == 0
    again = run.tell(msg.WorkflowGone(name="simrun-x"))
    assert again.events == [] and again.commands == gone.commands, "told twice: submitted again"


def test_a_workflow_gone_leaves_out_the_tasks_done_and_waiting_for_their_marker(
    submitted: ev.Submitted,
) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    waiting = run.tell(pod("squares", "succeeded", exit_code=0))
    assert waiting.commands == [msg.AwaitMergeMarker(task="squares")]
    run.tell(pod("plot", "running"))
    gone = run.tell(msg.WorkflowGone(name="simrun-x"))
    assert kinds(gone) == ["pod-preempted", "task-state"]
    (submit,) = gone.commands
    assert isinstance(submit, msg.SubmitRun) and submit.done == frozenset({"squares"})
    assert submit.ready == frozenset({"plot"})
    assert submit.next_attempts == {("squares", "w0"): 1, ("plot", "plot"): 1}


def test_a_workflow_gone_while_the_run_is_ending_only_records_the_ends(
    submitted: ev.Submitted,
) -> None:
    run = Run(submitted).started()
    run.tell(pod("squares", "running"))
    run.tell(msg.CancelAsked(by="bob"))
    gone = run.tell(msg.WorkflowGone(name="simrun-x"))
    assert kinds(gone) == ["pod-preempted"] and gone.commands == []
    assert kinds(run.tell(msg.PodsGone()))[-1] == "cancelled"
    assert run.tell(msg.WorkflowGone(name="simrun-x")) == Decision()


def test_a_workflow_gone_before_it_was_submitted_decides_nothing(submitted: ev.Submitted) -> None:
    run = Run(submitted)
    run.tell(msg.Resume())
    assert run.tell(msg.WorkflowGone(name="simrun-x")) == Decision()


# -- the start of a task -------------------------------------------------------------------------


def diamond() -> ev.Submitted:
    """`left` and `right` read from `top`, `bottom` from both: a task of two inputs."""

    def command(task_id: str, *inputs: str) -> TaskSpec:
        settings = {"image": "none", "args": ["true"], "cores": 1, "memory_gb": 1.0}
        ports = {f"in{i}": f"{source}.out" for i, source in enumerate(inputs)}
        return TaskSpec(id=task_id, type="command", settings=settings, inputs=ports)

    workflow = Workflow(
        name="diamond",
        tasks=[
            command("top"),
            command("left", "top"),
            command("right", "top"),
            command("bottom", "left", "right"),
        ],
    )
    return sample_submitted(workflow, sample_plans(workflow))


def started(decision: Decision) -> list[str]:
    return [c.task for c in decision.commands if isinstance(c, msg.StartTask)]


def test_a_task_is_started_once_every_task_it_reads_from_is_done() -> None:
    run = Run(diamond())
    [submit] = run.tell(msg.Resume()).commands
    assert submit == msg.SubmitRun(ready=frozenset({"top"}))
    run.tell(msg.WorkflowAccepted(name="simrun-x"))
    assert started(run.tell(pod("top", "running"))) == []
    assert started(run.tell(pod("top", "succeeded", exit_code=0))) == ["left", "right"]
    run.tell(pod("left", "running"))
    assert started(run.tell(pod("left", "succeeded", exit_code=0))) == [], "right is not done"
    run.tell(pod("right", "running"))
    assert started(run.tell(pod("right", "succeeded", exit_code=0))) == ["bottom"]


def test_no_task_is_started_after_a_failure_or_a_cancel() -> None:
    run = Run(diamond()).started()
    run.tell(pod("top", "running"))
    run.tell(msg.CancelAsked(by="bob"))
    assert started(run.tell(pod("top", "succeeded", exit_code=0))) == []
    run = Run(diamond()).started()
    run.tell(pod("top", "succeeded", exit_code=0))
    run.tell(pod("left", "failed", exit_code=3))
    assert started(run.tell(pod("right", "succeeded", exit_code=0))) == []


def test_a_split_task_starts_what_reads_it_only_once_merged(submitted: ev.Submitted) -> None:
    run = Run(submitted).started()
    waiting = run.tell(pod("squares", "succeeded", exit_code=0))
    assert started(waiting) == [], "the coordinator ended, the merge is not seen yet"
    assert started(run.tell(msg.MergeMarker(task="squares", found=True))) == ["plot"]


def test_a_resumed_run_starts_what_its_done_tasks_let_start() -> None:
    run = Run(diamond()).started()
    run.tell(pod("top", "succeeded", exit_code=0))
    run.tell(pod("left", "running"))
    [submit] = [c for c in run.tell(msg.Resume()).commands if isinstance(c, msg.SubmitRun)]
    assert (submit.done, submit.ready) == (frozenset({"top"}), frozenset({"left", "right"}))
