"""Views of a folded run record for the API: the run as users see it, its list item and the
progress of its tasks. Clients read these, never the fold's record."""

from __future__ import annotations

from collections.abc import Mapping

from simrun_core.fold import PodRecord, RunRecord
from simrun_core.planner import TaskPlan
from simrun_core.resources import ResolvedResources
from simrun_core.states import TaskState
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

UNFINISHED_TASK_MAX = 0.99
GIB = 1024**3


def run_progress(record: RunRecord) -> float:
    """The progress of a run from 0 to 1: the mean over its tasks, 1 only once all are over.

    A task that is over counts whole, a split task the share of its units done (at most
    `UNFINISHED_TASK_MAX`, its merge is still to come), any other task nothing.
    """
    if not record.tasks:
        return 0.0
    total = 0.0
    for task, state in record.tasks.items():
        if state in (TaskState.DONE, TaskState.SKIPPED):
            total += 1.0
            continue
        progress = record.progress.get(task)
        if progress is not None and progress.units:
            total += min(UNFINISHED_TASK_MAX, progress.done / progress.units)
    return total / len(record.tasks)


def run_item(record: RunRecord) -> RunItem:
    """The summary of a run for lists and long polls."""
    progress = None if record.ended else run_progress(record)
    return _item(record, dict(record.tasks), progress)


def view_item(view: RunView) -> RunItem:
    """The list item of a run from its view: `run_item` of the record it was made of."""
    return _item(view, {task: found.state for task, found in view.tasks.items()}, view.progress)


def _item(run: RunRecord | RunView, tasks: dict[str, TaskState], progress: float | None) -> RunItem:
    """The list item of a run, of its record or its view (they have these fields alike)."""
    return RunItem(
        id=run.id,
        state=run.state,
        workflow=run.workflow.name,
        group=run.group,
        submitted_by=run.submitted_by,
        owner=run.owner,
        agent=run.agent,
        priority=run.priority,
        tasks=tasks,
        created=run.created,
        finished=run.finished,
        message=run.message,
        seq=run.seq,
        progress=progress,
    )


def progress_view(record: RunRecord, claimed: Mapping[str, int] | None = None) -> ProgressView:
    """The progress of every task of a run; `claimed` are the units the live workers of each
    task hold claimed in its ledger (none given: none counted)."""
    tasks = {}
    for task, state in record.tasks.items():
        progress = record.progress.get(task)
        tasks[task] = TaskProgressView(
            state=state,
            units=progress.units if progress else None,
            done=progress.done if progress else 0,
            first_done=progress.first_done if progress else None,
            last_done=progress.last_done if progress else None,
            message=record.task_messages.get(task),
            counts=ledger_counts(record, task, (claimed or {}).get(task, 0)),
            first=progress.first if progress else None,
            last=progress.last if progress else None,
        )
    return ProgressView(run=record.id, state=record.state, seq=record.seq, tasks=tasks)


def ledger_counts(record: RunRecord, task: str, claimed: int = 0) -> LedgerCounts | None:
    """The counts of the ledger of a split task (None for an unsplit one): its units done as
    the run's log has them, `claimed` of the rest while the task is live (an ended run, or a
    final task, holds none), the others pending."""
    progress = record.progress.get(task)
    if progress is None or progress.units is None:
        return None
    total = progress.units
    done = min(progress.done, total)
    live = not record.ended and not record.tasks[task].final
    held = max(0, min(claimed, total - done)) if live else 0
    return LedgerCounts(pending=total - done - held, claimed=held, done=done, total=total)


def run_view(record: RunRecord) -> RunView:
    """The run as `GET /runs/{run}` answers it."""
    types = {task.id: task.type for task in record.workflow.tasks}
    return RunView(
        id=record.id,
        seq=record.seq,
        state=record.state,
        workflow=record.workflow,
        submitted_by=record.submitted_by,
        owner=record.owner,
        agent=record.agent,
        priority=record.priority,
        group=record.group,
        sources=list(record.sources),
        tasks={task: _task_view(record, task, types.get(task, "")) for task in record.tasks},
        progress=None if record.ended else run_progress(record),
        backend=record.backend,
        backend_name=record.backend_name,
        image=record.image,
        reserve=record.reserve,
        local_commands=record.local_commands,
        cancel_requested=record.cancel_requested,
        created=record.created,
        built=record.built,
        started=record.started,
        finished=record.finished,
        message=record.message,
        warnings=list(record.warnings),
    )


def task_view(record: RunRecord, task: str) -> TaskView:
    """One task of `run_view(record)`; KeyError for a task the run does not have."""
    task_type = next((spec.type for spec in record.workflow.tasks if spec.id == task), "")
    return _task_view(record, task, task_type)


def _task_view(record: RunRecord, task: str, task_type: str) -> TaskView:
    progress = record.progress.get(task)
    plan = record.plans.get(task)
    return TaskView(
        type=task_type,
        state=record.tasks[task],
        message=record.task_messages.get(task),
        units=progress.units if progress else None,
        done=progress.done if progress else 0,
        first_done=progress.first_done if progress else None,
        last_done=progress.last_done if progress else None,
        plan=None if plan is None else _plan_view(plan, record.resources.get(task)),
        pods=_pod_views(record.pods.get(task, {}), record.oom_kills.get(task, {})),
    )


def _plan_view(plan: TaskPlan, resources: ResolvedResources | None) -> PlanView:
    shape = plan.shape
    return PlanView(
        pods=plan.pods,
        cores=shape.cores,
        memory_gb=float(shape.memory_gb),
        processes=shape.processes,
        per_worker_gb=shape.per_worker_gb,
        retry_memory_gb=float(shape.retry_memory_gb),
        retry_per_worker_gb=shape.retry_per_worker_gb,
        scratch_gb=shape.scratch_gb,
        gpus=shape.gpus,
        source=resources.source if resources else None,
        seconds_per_unit=resources.seconds_per_unit if resources else None,
        samples=resources.samples if resources else 0,
    )


def _pod_views(pods: dict[str, PodRecord], kills: dict[str, list[int]]) -> list[PodView]:
    """The workers of a task in the order they appeared; a worker killed for memory without a
    pod event is at its last attempt killed, failed."""
    views = [_pod_view(pod, kills.get(pod.worker, [])) for pod in pods.values()]
    for worker, attempts in kills.items():
        if worker not in pods and attempts:
            killed = PodRecord(worker=worker, attempt=max(attempts), state="failed", oom=True)
            views.append(_pod_view(killed, attempts))
    return views


def _pod_view(pod: PodRecord, kills: list[int]) -> PodView:
    peak, limit = pod.peak_memory_bytes, pod.memory_limit_bytes
    return PodView(
        worker=pod.worker,
        attempt=pod.attempt,
        state=pod.state,
        node=pod.node,
        exit_code=pod.exit_code,
        oom=pod.oom,
        oom_kills=sorted(kills),
        peak_memory_gb=None if peak is None else round(peak / GIB, 4),
        memory_limit_gb=None if limit is None else round(limit / GIB, 4),
        processes=pod.processes,
        units_done=pod.units_done,
        gpus=pod.gpus,
    )
