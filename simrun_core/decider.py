"""The policy of a run, one pure function for every backend: `decide(state, message)`.

Given the folded state of a run (`RunFold`: the record, the units done, the reports, the stops of
each worker) and one message of its actor, it returns the events to append and the commands to
carry out, one `_apply_*` handler per kind of message, like temporalio's `activate()`. It does
no I/O and never raises for a message it does not expect (nothing happens then). Retries
(`decide_retry`), the start of a task once every task it reads from is done (`SubmitRun.ready`,
then `StartTask`), the states of tasks, the merge-marker rule and the end of the run are decided
here and nowhere else; everything it reads is folded from the log, so a service that restarts
decides as the one before would have.

The end of a run takes two steps: a task failed, a cancel was asked or every task is done, so the
decider asks the actor to stop the pods (or, when nothing runs, to settle), and once the actor
tells it the pods are gone, with what every harness log had left, it appends the last events and
the terminal one.

A workflow that went from under a live run (`WorkflowGone`: deleted by hand, or by a cluster's
time to live) is recovered here too, as a resume: the attempts live end preempted and the run is
submitted again with every worker after its attempts; a backend recreates nothing by itself.

The events it decides carry no `seq` nor `time`: the actor stamps both when it appends them, so
equal states and messages give equal decisions (tests/core/test_core_decider_properties.py).

A new run on a backend that builds images, whose model was snapshotted, has its environment
resolved (`ResolveEnvironment`, then `environment-resolved`) and its image made sure of
(`BuildImage`, then `built`) before anything else; a failure of either fails the run. A run with a
reservation has its node reserved before it is submitted (`ReserveNode`, then
`node-reserved` and `SubmitRun`; a refusal fails the run) and released after its terminal event
(`ReleaseNode`, then `node-released`): the terminal record is written first, and a release that
did not happen is asked again whenever the actor of the ended run resumes (spec 41).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, NamedTuple

import msgspec

from simrun_core import events as ev
from simrun_core import exits
from simrun_core.fold import RunFold, RunRecord
from simrun_core.launch import main_worker
from simrun_core.messages import (
    AnswerCancel,
    AnyCommand,
    AwaitMergeMarker,
    BuildImage,
    CancelAsked,
    Decision,
    EnvironmentFailed,
    EnvironmentReady,
    HarnessEvent,
    HarnessRead,
    ImageReady,
    KeepLogs,
    Learn,
    MergeMarker,
    Message,
    NodeRelease,
    NodeReservation,
    PodChanged,
    PodsGone,
    ReleaseNode,
    ReserveNode,
    ResolveEnvironment,
    Resume,
    RetryPod,
    Settle,
    StartTask,
    StopPods,
    StoreWritable,
    SubmissionRefused,
    SubmitRun,
    WorkflowAccepted,
    WorkflowGone,
)
from simrun_core.states import FINAL_TASK_STATES, TaskState

STOP_RETRIES = 3
"""How often a worker stopped from outside (a signal, an eviction) is retried."""
RESTARTED = "the service stopped while the pod ran"
NOT_MERGED = "the coordinator succeeded without merging the units"

NOTHING = Decision()


class Retry(NamedTuple):
    """What follows an attempt that failed: retry it? with the retry memory? and why."""

    retry: bool
    retry_memory: bool
    message: str


def decide_retry(
    code: int, oom: bool, on_retry_memory: bool, stops: int, retry_per_worker_gb: float
) -> Retry:
    """The retry of an attempt that exited with `code`, the same on every backend.

    A kill for memory with evidence is retried once with the retry memory per process, a second
    one fails the task naming it; a stop from outside (a signal's exit code: 137 without
    evidence, 143, an eviction) is retried up to `STOP_RETRIES` times; any other exit fails at
    once. The Argo backend writes the same rule into its `retryStrategy`.
    """
    memory = f"{retry_per_worker_gb:g} GiB per process"
    if code == exits.KILLED and oom:
        if on_retry_memory:
            return Retry(False, True, f"killed for memory again with the retry memory of {memory}")
        return Retry(True, True, f"killed for memory; retried with {memory}")
    if exits.stopped_from_outside(code):
        if stops < STOP_RETRIES:
            return Retry(True, on_retry_memory, f"stopped from outside (exit code {code})")
        return Retry(False, on_retry_memory, f"stopped from outside {stops + 1} times")
    if code == exits.DISK_FULL:
        return Retry(False, on_retry_memory, f"the disk of the store is full (exit code {code})")
    return Retry(False, on_retry_memory, f"exit code {code}")


def decide(state: RunFold, message: Message) -> Decision:
    """The events and commands that follow from one message, given the folded state of a run."""
    record = state.record
    if record is None:
        return NOTHING
    handler = _HANDLERS.get(type(message))
    if handler is None:
        return NOTHING
    return _releasing_at_the_end(record, handler(state, record, message))


def _releasing_at_the_end(record: RunRecord, decision: Decision) -> Decision:
    """A decision that ends a run holding a node releases it after the terminal event."""
    node = record.reserved
    if node is None or not any(isinstance(e, ev.TERMINAL_EVENTS) for e in decision.events):
        return decision
    return Decision(decision.events, [*decision.commands, ReleaseNode(node=node)])


# -- the end of a run ---------------------------------------------------------------------------


def failed_task(record: RunRecord) -> str | None:
    """The first task that failed, None while none did."""
    return next((task for task, s in record.tasks.items() if s is TaskState.FAILED), None)


def all_done(record: RunRecord) -> bool:
    """Whether every task of the run is done."""
    return all(s is TaskState.DONE for s in record.tasks.values())


def stopping(record: RunRecord) -> bool:
    """Whether the run is being ended by a cancel or a failed task: nothing is retried."""
    return record.cancel_requested is not None or failed_task(record) is not None


def retrying(record: RunRecord) -> bool:
    """Whether an attempt that ends now is retried: not while the run is being stopped, nor
    once every task is done (an extra worker stopped at the end has nothing left to do)."""
    return not stopping(record) and not all_done(record)


STOPPED_WHILE_RUNNING = frozenset({TaskState.RUNNING, TaskState.RETRYING, TaskState.PREEMPTED})
"""The states of a task whose pods ran: stopped by the end of its run, it is `cancelled`."""


def _terminal(record: RunRecord, store_error: str | None = None) -> Decision:
    """The end of a run once nothing runs (nothing while it is not ending): the tasks stopped
    while they ran are cancelled (with their logs kept), then the terminal event; the tasks
    that never began are skipped by the fold."""
    failed = failed_task(record)
    end: Callable[[], ev.Event]
    if store_error is not None:
        why = f"the run was stopped: the store cannot be written: {store_error}"
        end = partial(ev.Failed, message=why)
    elif record.cancel_requested is not None:
        why = f"cancelled by {record.cancel_requested}"
        end = partial(ev.Cancelled, message=why)
    elif failed is not None:
        why = f"stopped: task {failed!r} failed"
        reason = record.task_messages.get(failed, "it failed")
        end = partial(ev.Failed, message=f"task {failed!r} failed: {reason}")
    elif all_done(record):
        return Decision([ev.Succeeded()])
    else:
        return NOTHING
    events: list[ev.Event] = []
    commands: list[AnyCommand] = []
    for task, state in record.tasks.items():
        if state in STOPPED_WHILE_RUNNING:
            events.append(ev.TaskStateChanged(task=task, state=TaskState.CANCELLED, message=why))
            events.append(ev.LogsKept(task=task))
            commands.append(KeepLogs(task=task))
    return Decision([*events, end()], commands)


# -- copies of the harness logs ------------------------------------------------------------------


class _Copies:
    """The harness events to append that the log does not have yet (nor this decision)."""

    def __init__(self, state: RunFold) -> None:
        self.state = state
        self.units: set[tuple[str, int]] = set()
        self.reports: dict[tuple[str, str, int], ev.WorkerReport] = {}
        self.merged: set[str] = set()

    def take(self, events: Iterable[HarnessEvent]) -> list[ev.Event]:
        taken: list[ev.Event] = []
        record = self.state.record
        assert record is not None
        for event in events:
            if isinstance(event, ev.UnitDone):
                key = (event.task, event.index)
                if key in self.units or self.state.unit_is_done(event.task, event.index):
                    continue
                self.units.add(key)
            elif isinstance(event, ev.UnitsDone):
                new = self._new_units(event)
                if new is None:
                    continue
                event = new
            elif isinstance(event, ev.WorkerReport):
                report_key = (event.task, event.worker, event.attempt)
                if report_key in self.reports or report_key in self.state.reported:
                    continue
                self.reports[report_key] = event
            elif isinstance(event, ev.Merged):
                if event.task in self.merged or event.task in record.merged:
                    continue
                self.merged.add(event.task)
            else:
                continue
            taken.append(event)
        return taken

    def _new_units(self, event: ev.UnitsDone) -> ev.UnitsDone | None:
        """The batch with only its units that are neither in the log nor copied already (the
        same event when all are new), None when none is."""
        new: list[tuple[int, float]] = []
        for index, seconds in ev.done_units(event):
            key = (event.task, index)
            if key in self.units or self.state.unit_is_done(event.task, index):
                continue
            self.units.add(key)
            new.append((index, seconds))
        if len(new) == len(event.indices):
            return event
        if not new:
            return None
        return msgspec.structs.replace(
            event,
            indices=tuple(index for index, _ in new),
            seconds=tuple(seconds for _, seconds in new),
        )

    def report(self, task: str, worker: str, attempt: int) -> ev.WorkerReport | None:
        """The report of an attempt: copied now or in the log already."""
        key = (task, worker, attempt)
        return self.reports.get(key) or self.state.reported.get(key)


# -- the handlers ---------------------------------------------------------------------------------


def _apply_resume(state: RunFold, record: RunRecord, message: Resume) -> Decision:
    """Start a new run, or continue one an earlier service left: its pods that ran are failed
    (retried unless the run is ending) and the run is submitted again with the next attempt of
    every worker, or, where pods outlive the service, taken over as they are; a run that was
    ending is ended."""
    if record.ended:
        if record.reserved is not None:
            return Decision(commands=[ReleaseNode(node=record.reserved)])
        return NOTHING
    events: list[ev.Event] = []
    ending = stopping(record)
    if record.backend_name is None and record.built is None:
        if message.builds_images and not ending and _has_environment(record):
            if record.image is not None:  # resolved before a restart: its image is built next
                return Decision(commands=[BuildImage(image=record.image)])
            return Decision(commands=[ResolveEnvironment()])
        events += [ev.EnvironmentResolved(image=None), ev.Built(image=None)]
    for task, pods in record.pods.items():
        for pod in pods.values():
            if pod.state in ("pending", "running") and not message.pods_survive:
                events.append(
                    ev.PodFailed(
                        task=task,
                        worker=pod.worker,
                        attempt=pod.attempt,
                        retry=not ending,
                        message=RESTARTED,
                    )
                )
    commands: list[AnyCommand] = [KeepLogs(task=task) for task in record.logs_kept]
    merging = _awaiting_marker(record)
    if ending:
        commands.append(StopPods())
    elif all_done(record):
        commands.append(_end_of_work(record, pods_live=message.pods_survive))
    elif _to_reserve(record) is not None:
        commands.append(ReserveNode(node=record.reserve or ""))
    else:
        commands += [AwaitMergeMarker(task=task) for task in sorted(merging)]
        commands.append(_submit_run(record, merging, message.pods_survive))
    return Decision(events, commands)


def _apply_workflow_gone(state: RunFold, record: RunRecord, message: WorkflowGone) -> Decision:
    """The run's workflow went while nothing asked to stop it (deleted by hand, or by its time
    to live): as at a `Resume` whose pods did not survive, the attempts the run had live end,
    here as preempted (deleted from outside, as a queue deletes a pod: no stop counted), and
    the run is submitted again, every worker after its attempts so far, the tasks done left
    out. A run that is ending only records the ends: its `StopPods` or `Settle` is under way."""
    if record.ended or record.backend_name is None:
        return NOTHING
    events: list[ev.Event] = []
    ending = stopping(record)
    for task, pods in record.pods.items():
        plan = record.plans.get(task)
        for pod in pods.values():
            if pod.state not in LIVE_POD_STATES:
                continue
            events.append(ev.PodPreempted(task=task, worker=pod.worker, attempt=pod.attempt))
            main = plan is not None and pod.worker == main_worker(plan)
            if main and not ending and record.tasks.get(task) not in FINAL_TASK_STATES:
                events.append(ev.TaskStateChanged(task=task, state=TaskState.PREEMPTED))
    if ending or all_done(record):
        return Decision(events)
    return Decision(events, [_submit_run(record, _awaiting_marker(record), pods_survive=False)])


LIVE_POD_STATES = frozenset({"pending", "running"})
"""The states of a pod attempt that has not ended (admitted is still `pending` in the record)."""


def _end_of_work(
    record: RunRecord, *, pods_live: bool = True, ended: Iterable[ev.Event] = ()
) -> AnyCommand:
    """What follows once every task is done: the pods still live (extra workers started or
    waiting for admission after their task was done; not those whose end is in `ended`, the
    events being decided) are stopped, so the run's workflow goes and the run ends now (spec
    41); with none left, the run settles."""
    ending = {
        (e.task, e.worker, e.attempt)
        for e in ended
        if isinstance(e, (ev.PodSucceeded, ev.PodFailed, ev.PodPreempted))
    }
    live = pods_live and any(
        pod.state in LIVE_POD_STATES and (task, pod.worker, pod.attempt) not in ending
        for task, pods in record.pods.items()
        for pod in pods.values()
    )
    return StopPods() if live else Settle()


def _has_environment(record: RunRecord) -> bool:
    """Whether the run's environment comes from its snapshots: its model (the first source)
    was snapshotted. Else it runs in the service's own environment."""
    return bool(record.sources) and record.sources[0].snapshot is not None


def _once_built(record: RunRecord) -> AnyCommand:
    """What follows once the image of a new run is ready: reserve its node, or submit it."""
    node = _to_reserve(record)
    if node is not None:
        return ReserveNode(node=node)
    return _submit_run(record, _awaiting_marker(record), pods_survive=False)


def _apply_environment(state: RunFold, record: RunRecord, message: EnvironmentReady) -> Decision:
    """The environment is resolved: its image is built next (the service's own needs none)."""
    if record.ended or record.built is not None:
        return NOTHING
    resolved = ev.EnvironmentResolved(image=message.image, lock_sha256=message.lock_sha256)
    if stopping(record):
        return Decision([resolved])
    if message.image is None:
        return Decision([resolved, ev.Built(image=None)], [_once_built(record)])
    return Decision([resolved], [BuildImage(image=message.image)])


def _apply_image(state: RunFold, record: RunRecord, message: ImageReady) -> Decision:
    """The image is in the registry: recorded, then the run's node is reserved or it is
    submitted."""
    if record.ended or record.built is not None:
        return NOTHING
    built = ev.Built(image=message.image, seconds=message.seconds, cached=message.cached)
    if stopping(record):
        return Decision([built])
    return Decision([built], [_once_built(record)])


def _apply_environment_failed(
    state: RunFold, record: RunRecord, message: EnvironmentFailed
) -> Decision:
    """An environment that cannot be resolved, built or made (the local backend's venv of the
    snapshots) fails the run; nothing of it ran (once a pod ran, its environment was made)."""
    if record.ended or record.pods:
        return NOTHING
    return Decision([ev.Failed(message=f"the environment of the run failed: {message.reason}")])


def _to_reserve(record: RunRecord) -> str | None:
    """The node a run not yet submitted still has to reserve before its submission."""
    if record.reserve is None or record.reserved is not None or record.backend_name is not None:
        return None
    return record.reserve


def _submit_run(record: RunRecord, merging: frozenset[str], pods_survive: bool) -> SubmitRun:
    """The submission of a run: the tasks done (and those whose coordinator merged and that wait
    for its marker; a task merged by a pod of its own still needs that pod), those that start
    now, the next attempt of every worker, the workers killed for memory."""
    merged = frozenset(t for t in merging if record.plans[t].coordinator_merges)
    done = frozenset(t for t, s in record.tasks.items() if s is TaskState.DONE) | merged
    return SubmitRun(
        done=done,
        ready=_ready(record, done),
        next_attempts={
            (task, pod.worker): pod.attempt + _next(pod.state, pods_survive)
            for task, pods in record.pods.items()
            for pod in pods.values()
        },
        retry_memory=frozenset(
            (task, worker) for task, workers in record.oom_kills.items() for worker in workers
        ),
    )


def _next(pod_state: str, pods_survive: bool) -> int:
    """How far the next attempt of a worker is from its last one at a resume: the same one,
    taken over, where a pod that ran is still running; else the one after."""
    return 0 if pods_survive and pod_state in ("pending", "running") else 1


def _awaiting_marker(record: RunRecord) -> frozenset[str]:
    """The split tasks whose coordinator succeeded and that are not final yet: they wait for
    their merge marker (and are not started again)."""
    waiting = set()
    for task, pods in record.pods.items():
        plan = record.plans.get(task)
        if plan is None or plan.units is None or record.tasks.get(task) in FINAL_TASK_STATES:
            continue
        coordinator = pods.get(main_worker(plan))
        if coordinator is not None and coordinator.state == "succeeded":
            waiting.add(task)
    return frozenset(waiting)


def _apply_reservation(state: RunFold, record: RunRecord, message: NodeReservation) -> Decision:
    """The run's node is reserved: recorded, then the run is submitted (or its end goes on);
    a refused reservation fails the run (nothing of it runs)."""
    if not message.taken:
        if record.ended:
            return NOTHING
        why = f"node {message.node!r} cannot be reserved: {message.reason}"
        return Decision([ev.Failed(message=f"the run could not be submitted: {why}")])
    events: list[ev.Event] = [ev.NodeReserved(node=message.node)]
    if record.ended:
        return Decision(events, [ReleaseNode(node=message.node)])
    if stopping(record):
        return Decision(events, [StopPods()])
    return Decision(events, [_submit_run(record, _awaiting_marker(record), pods_survive=False)])


def _apply_release(state: RunFold, record: RunRecord, message: NodeRelease) -> Decision:
    """The run's node was released (also after the run's end)."""
    if record.reserved != message.node:
        return NOTHING
    return Decision([ev.NodeReleased(node=message.node)])


def _apply_accepted(state: RunFold, record: RunRecord, message: WorkflowAccepted) -> Decision:
    if record.ended or record.backend_name is not None:
        return NOTHING
    return Decision([ev.WorkflowSubmitted(name=message.name)])


def _apply_refused(state: RunFold, record: RunRecord, message: SubmissionRefused) -> Decision:
    """A run the backend refused for good ends failed with the reason (nothing of it runs)."""
    if record.ended:
        return NOTHING
    return Decision([ev.Failed(message=f"the run could not be submitted: {message.reason}")])


def _apply_harness(state: RunFold, record: RunRecord, message: HarnessRead) -> Decision:
    if record.ended:
        return NOTHING
    return Decision(_Copies(state).take(message.events))


def _apply_cancel(state: RunFold, record: RunRecord, message: CancelAsked) -> Decision:
    """Accept a cancel of a run that is not ending: `cancel-requested`, then stop its pods."""
    if record.ended:
        return Decision(commands=[AnswerCancel(accepted=False, state=record.state.value)])
    if record.cancel_requested is not None:
        return Decision(commands=[AnswerCancel(accepted=False, state="cancelled")])
    if failed_task(record) is not None:
        return Decision(commands=[AnswerCancel(accepted=False, state="failed")])
    if all_done(record):
        return Decision(commands=[AnswerCancel(accepted=False, state="succeeded")])
    events: list[ev.Event] = [ev.CancelRequested(by=message.by)]
    return Decision(events, [AnswerCancel(accepted=True), StopPods()])


def _apply_pod(state: RunFold, record: RunRecord, message: PodChanged) -> Decision:
    if record.ended:
        return NOTHING
    copies = _Copies(state)
    events = copies.take(message.harness)
    pod_events, commands = _pod_events(record, copies, message, decide_retries=True)
    return Decision(events + pod_events, commands)


def _apply_gone(state: RunFold, record: RunRecord, message: PodsGone) -> Decision:
    if record.ended:
        return NOTHING
    events = _Copies(state).take(message.harness)
    end = _terminal(record)
    return Decision(events + end.events, end.commands)


def _apply_store(state: RunFold, record: RunRecord, message: StoreWritable) -> Decision:
    """End a run that was stopped because its log could not be written: the pod changes of
    meanwhile (no retries), what the harness logs had left, and `failed` naming the error."""
    if record.ended:
        return NOTHING
    copies = _Copies(state)
    events = copies.take(message.harness)
    for change in message.changes:
        events += copies.take(change.harness)
        events += _pod_events(record, copies, change, decide_retries=False)[0]
    end = _terminal(record, store_error=message.error)
    return Decision(events + end.events, end.commands)


def _pod_events(
    record: RunRecord, copies: _Copies, change: PodChanged, *, decide_retries: bool
) -> tuple[list[ev.Event], list[AnyCommand]]:
    """The events of a pod change and the task state it implies (with a retry decided only
    when `decide_retries` and the run is not ending)."""
    task, worker, attempt = change.task, change.worker, change.attempt
    task_state = record.tasks.get(task)
    if task_state is None or task not in record.plans:
        return [], []
    queued: list[ev.Event] = []
    if task_state in (TaskState.WAITING, TaskState.RETRYING, TaskState.PREEMPTED):
        queued = [ev.TaskStateChanged(task=task, state=TaskState.QUEUED)]
    if change.phase == "pending":
        return queued, []
    if change.phase == "admitted":
        return [ev.PodAdmitted(task=task, worker=worker, attempt=attempt), *queued], []
    if change.phase == "preempted":
        return _preempted(record, change, decide_retries=decide_retries)
    if change.phase == "running":
        events: list[ev.Event] = [
            ev.PodStarted(
                task=task,
                worker=worker,
                attempt=attempt,
                node=change.node,
                pid=change.pid,
                gpus=change.gpus,
            )
        ]
        # an extra worker may start after its task is done (admitted late): no state back
        if task_state is not TaskState.RUNNING and task_state not in FINAL_TASK_STATES:
            events.append(ev.TaskStateChanged(task=task, state=TaskState.RUNNING))
        return events, []
    if change.phase == "succeeded":
        return _succeeded(record, copies, change)
    return _failed(record, copies, change, decide_retries=decide_retries)


def _preempted(
    record: RunRecord, change: PodChanged, *, decide_retries: bool
) -> tuple[list[ev.Event], list[AnyCommand]]:
    """A pod deleted by the queue for a higher priority: retried as the next attempt (with the
    retry memory it had), never counted as a stop; the task is `preempted` meanwhile unless the
    pod was an extra worker's."""
    task, worker, attempt = change.task, change.worker, change.attempt
    events: list[ev.Event] = [ev.PodPreempted(task=task, worker=worker, attempt=attempt)]
    if not decide_retries or not retrying(record):
        return events, []
    retry_memory = worker in record.oom_kills.get(task, {})
    retry = RetryPod(task=task, worker=worker, attempt=attempt + 1, retry_memory=retry_memory)
    if worker == main_worker(record.plans[task]):
        events.append(ev.TaskStateChanged(task=task, state=TaskState.PREEMPTED))
    return events, [retry]


def _succeeded(
    record: RunRecord, copies: _Copies, change: PodChanged
) -> tuple[list[ev.Event], list[AnyCommand]]:
    """A pod succeeded: an unsplit task is done; a split task is done when its coordinator
    succeeded and merged (a `merged` event, or the merge marker), and waits for the marker
    (`AwaitMergeMarker`) when neither is there yet; an extra worker's end changes no task."""
    task = change.task
    events: list[ev.Event] = [
        ev.PodSucceeded(task=task, worker=change.worker, attempt=change.attempt)
    ]
    plan = record.plans[task]
    if record.tasks.get(task) in FINAL_TASK_STATES or change.worker != main_worker(plan):
        return events, []
    merged = task in record.merged or task in copies.merged or change.merged_marker
    if plan.units is not None and not merged:
        return events, [AwaitMergeMarker(task=task)]
    return _task_done(record, task, events)


def _task_done(
    record: RunRecord, task: str, events: list[ev.Event]
) -> tuple[list[ev.Event], list[AnyCommand]]:
    """`events`, then the task done with its logs kept; the run settles when it was the last."""
    events = [*events, ev.TaskStateChanged(task=task, state=TaskState.DONE), ev.LogsKept(task=task)]
    commands: list[AnyCommand] = [KeepLogs(task=task), Learn(task=task)]
    if all(s is TaskState.DONE for t, s in record.tasks.items() if t != task):
        commands.append(_end_of_work(record, ended=events))
    elif not stopping(record):
        # first: what a chain waits for does not wait for the logs kept and the learning
        commands[:0] = [StartTask(task=ready) for ready in _ready_after(record, task)]
    return events, commands


def _ready(record: RunRecord, done: frozenset[str]) -> frozenset[str]:
    """The tasks to start at a submission: not done, and every task they read from is."""
    return frozenset(
        spec.id
        for spec in record.workflow.tasks
        if spec.id not in done and all(dep in done for dep in spec.dependencies())
    )


def _ready_after(record: RunRecord, task: str) -> list[str]:
    """The tasks that wait for `task` alone: it is done now, and so is every other task they
    read from. They are started now (the rule of every backend; Argo's DAG has it written in)."""
    return [
        spec.id
        for spec in record.workflow.tasks
        if task in spec.dependencies()
        and record.tasks.get(spec.id) is TaskState.WAITING
        and all(
            dep == task or record.tasks.get(dep) is TaskState.DONE for dep in spec.dependencies()
        )
    ]


def _task_failed(
    task: str, message: str, events: list[ev.Event]
) -> tuple[list[ev.Event], list[AnyCommand]]:
    """`events`, then the task failed with its logs kept, and the run's pods stopped."""
    events = [
        *events,
        ev.TaskStateChanged(task=task, state=TaskState.FAILED, message=message),
        ev.LogsKept(task=task),
    ]
    return events, [KeepLogs(task=task), Learn(task=task), StopPods()]


def _apply_marker(state: RunFold, record: RunRecord, message: MergeMarker) -> Decision:
    """A split task whose coordinator succeeded without merging: done once its marker was
    found, failed when it did not come within the grace (a harness that does not merge)."""
    task = message.task
    if record.ended or task not in record.plans or record.tasks.get(task) in FINAL_TASK_STATES:
        return NOTHING
    if message.found:
        return Decision(*_task_done(record, task, []))
    return Decision(*_task_failed(task, NOT_MERGED, []))


def _failed(
    record: RunRecord, copies: _Copies, change: PodChanged, *, decide_retries: bool
) -> tuple[list[ev.Event], list[AnyCommand]]:
    """A pod failed: retried as the next attempt (`decide_retry`), or its task failed and the
    run's pods are stopped; while the run is ending only the facts are recorded."""
    task, worker, attempt = change.task, change.worker, change.attempt
    code = change.exit_code if change.exit_code is not None else exits.HARNESS_BUG
    shape = record.plans[task].shape
    kills = record.oom_kills.get(task, {})
    report = copies.report(task, worker, attempt)
    # A kill for memory is OOMKilled, or a 137 whose harness counted a kill for memory (its
    # memory guard killed a process of its pool, the pod's container was not killed).
    oom = change.oom or (code == exits.KILLED and report is not None and report.oom_kills > 0)
    on_retry_memory = change.on_retry_memory
    if on_retry_memory is None:
        on_retry_memory = worker in kills
    retry = decide_retry(
        code,
        oom,
        on_retry_memory=on_retry_memory,
        stops=copies.state.stops.get((task, worker), 0),
        retry_per_worker_gb=shape.retry_per_worker_gb,
    )
    if report is not None and report.message and code in exits.HARNESS_ERRORS:
        why = report.message
    else:
        why = f"{retry.message}; {change.message}" if change.message else retry.message
    retried = retry.retry and decide_retries and retrying(record)
    events: list[ev.Event] = [
        ev.PodFailed(
            task=task,
            worker=worker,
            attempt=attempt,
            exit_code=change.exit_code,
            oom=oom,
            retry=retried,
            message=why,
        )
    ]
    if oom:
        events.append(
            ev.OomKilled(
                task=task,
                worker=worker,
                attempt=attempt,
                memory_gb=shape.memory_gb,
                retry_memory_gb=shape.retry_memory_gb,
            )
        )
    if not decide_retries or not retrying(record):
        return events, []
    retry_pod = RetryPod(
        task=task, worker=worker, attempt=attempt + 1, retry_memory=retry.retry_memory
    )
    if worker != main_worker(record.plans[task]):
        return events, [retry_pod] if retried else []  # an extra worker never fails its task
    if retried:
        events.append(ev.TaskStateChanged(task=task, state=TaskState.RETRYING))
        return events, [retry_pod]
    message = f"{worker} attempt {attempt}: {why or f'exit code {change.exit_code}'}"
    return _task_failed(task, message, events)


_Handler = Callable[[RunFold, RunRecord, Any], Decision]
_HANDLERS: dict[type[Message], _Handler] = {
    Resume: _apply_resume,
    EnvironmentReady: _apply_environment,
    ImageReady: _apply_image,
    EnvironmentFailed: _apply_environment_failed,
    NodeReservation: _apply_reservation,
    NodeRelease: _apply_release,
    WorkflowAccepted: _apply_accepted,
    SubmissionRefused: _apply_refused,
    PodChanged: _apply_pod,
    WorkflowGone: _apply_workflow_gone,
    HarnessRead: _apply_harness,
    CancelAsked: _apply_cancel,
    PodsGone: _apply_gone,
    MergeMarker: _apply_marker,
    StoreWritable: _apply_store,
}
