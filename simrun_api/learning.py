"""Resource learning: what the reports of a final task teach about the resources of its type.

What is learned is a projection of the run logs, as the index is: a task that ends done or
failed (`task-state`) is learned from the worker reports its log has at that event. So a service
whose learned resources are gone (the file removed, or moved aside as broken) learns them again
from the logs (`learn_from_log`), the same observations as the first time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from simrun_api.resources import ResourceStore
from simrun_core import events as ev
from simrun_core.fold import FoldError, RunFold, RunRecord
from simrun_core.plugins import TaskType
from simrun_core.resources import observation_from_report, resource_key
from simrun_core.snapshot_types import types_of_run
from simrun_core.states import TaskState
from simrun_core.store import LogCorrupt, RunPaths, iter_blocks

LEARNED_STATES = frozenset({TaskState.DONE, TaskState.FAILED})
"""The task states the service learns at (the decider's `Learn` goes with them)."""

log = logging.getLogger(__name__)


async def learn_from_task(
    resources: ResourceStore,
    types: dict[str, TaskType],
    record: RunRecord,
    task: str,
    reports: list[ev.WorkerReport],
) -> None:
    """Record an observation per report of a final task (none for `command` tasks, whose
    resources are the user's); a failure to learn is logged, never fails the run."""
    spec = record.workflow.task(task)
    task_type = types.get(spec.type)
    if task_type is None or task_type.name == "command" or not reports:
        return
    model = record.sources[0].name if record.sources else ""
    resolved = record.resources.get(task)
    base = resolved.memory_base_gb if resolved else task_type.hint.memory_base_gb
    done = record.tasks.get(task) is TaskState.DONE
    try:
        # Decoded by the type: a type of the run's snapshots decodes as its plugin did.
        key = resource_key(task_type, task_type.decode_settings(spec.settings), model)
        for report in reports:
            oom = report.oom_kills > 0
            observation = observation_from_report(
                key,
                report,
                base,
                oom=oom,
                run=record.id,
                task=task,
                succeeded=done and not oom and not report.failed,
            )
            await resources.record(observation)
    except Exception:
        log.exception("run %s: the reports of task %s were not learned", record.id, task)


class TaskReports:
    """A task that became final in a log, with the reports its log had at that event."""

    __slots__ = ("reports", "task")

    def __init__(self, task: str, reports: list[ev.WorkerReport]) -> None:
        self.task = task
        self.reports = reports


def final_task_reports(
    blocks: Iterable[list[ev.Event]],
) -> tuple[RunRecord | None, list[TaskReports]]:
    """Fold a log (its events in blocks); the record and every task that became done or failed,
    with its reports at that event (what the run's actor learned from then). Pure."""
    folder = RunFold()
    learned: list[TaskReports] = []
    for block in blocks:
        start = 0
        for position, event in enumerate(block):
            if isinstance(event, ev.TaskStateChanged) and event.state in LEARNED_STATES:
                record = folder.record
                was_final = record is not None and record.tasks.get(event.task) in LEARNED_STATES
                folder.apply_all(block[start : position + 1])
                start = position + 1
                if not was_final and not (folder.record is not None and folder.record.ended):
                    reports = list(folder.reports.get(event.task, []))
                    learned.append(TaskReports(event.task, reports))
        folder.apply_all(block[start:])
    return folder.record, learned


async def learn_from_log(
    resources: ResourceStore, types: dict[str, TaskType], paths: RunPaths
) -> int:
    """Learn again what the tasks of a run's log taught (recording a report twice changes
    nothing); the tasks learned from. A log that does not fold is logged and left out."""
    try:
        record, learned = await asyncio.to_thread(final_task_reports, _blocks(paths))
    except (LogCorrupt, FoldError, OSError) as error:
        log.warning(
            "run %s: its log does not fold, nothing is learned from it: %s", paths.dir.name, error
        )
        return 0
    if record is None:
        return 0
    run_types = types_of_run(types, record)
    for entry in learned:
        await learn_from_task(resources, run_types, record, entry.task, entry.reports)
    return len(learned)


def _blocks(paths: RunPaths) -> Iterable[list[ev.Event]]:
    for _, events in iter_blocks(paths.events):
        yield events
