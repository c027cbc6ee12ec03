"""Views of a folded run record for the API: the list item and the progress of its tasks."""

from __future__ import annotations

from simrun_core.fold import RunRecord
from simrun_core.states import TaskState
from simrun_core.wire import ProgressView, RunItem, TaskProgressView

UNFINISHED_TASK_MAX = 0.99


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
    return RunItem(
        id=record.id,
        state=record.state,
        workflow=record.workflow.name,
        group=record.group,
        submitted_by=record.submitted_by,
        owner=record.owner,
        agent=record.agent,
        priority=record.priority,
        tasks=dict(record.tasks),
        created=record.created,
        finished=record.finished,
        message=record.message,
        seq=record.seq,
        progress=None if record.ended else run_progress(record),
    )


def progress_view(record: RunRecord) -> ProgressView:
    """The progress of every task of a run."""
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
        )
    return ProgressView(run=record.id, state=record.state, seq=record.seq, tasks=tasks)
