"""Resource learning: what the reports of a final task teach about the resources of its type."""

from __future__ import annotations

import logging

from simrun_api.resources import ResourceStore
from simrun_core import events as ev
from simrun_core.fold import RunRecord
from simrun_core.plugins import TaskType
from simrun_core.resources import observation_from_report, resource_key
from simrun_core.states import TaskState

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
