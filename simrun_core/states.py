"""The states of a run and of its tasks."""

import enum


class RunState(enum.StrEnum):
    """State of a run: submitting, queued, running, then one of the three ends."""

    SUBMITTING = "submitting"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def ended(self) -> bool:
        """Whether the run is over."""
        return self in ENDED_RUN_STATES


ENDED_RUN_STATES = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED})


class TaskState(enum.StrEnum):
    """State of a task of a run.

    waiting: its inputs are not done; queued: its pods wait for cores; running: a pod runs;
    preempted / retrying: no pod runs and one waits for its retry; done, failed; cancelled: the
    run was cancelled (or failed) while the task ran, its pods were stopped; skipped: the run
    ended before the task began.
    """

    WAITING = "waiting"
    QUEUED = "queued"
    RUNNING = "running"
    PREEMPTED = "preempted"
    RETRYING = "retrying"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"

    @property
    def final(self) -> bool:
        """Whether the task will not change any more."""
        return self in FINAL_TASK_STATES


FINAL_TASK_STATES = frozenset(
    {TaskState.DONE, TaskState.FAILED, TaskState.CANCELLED, TaskState.SKIPPED}
)
