"""The resources of a task: its type's hint, learned observations or an override of the workflow."""

from __future__ import annotations

import msgspec

from simrun_core.plugins import TaskType
from simrun_core.workflow import TaskSpec


class ResolvedResources(msgspec.Struct, frozen=True):
    """The resources a task is planned with, and where they come from."""

    memory_base_gb: float
    memory_per_worker_gb: float
    scratch_gb: float = 0.0
    gpus: int = 0
    workers: int | None = None
    cores_per_worker: int = 1
    source: str = "plugin hint"


def resolve_resources(
    task: TaskSpec, task_type: TaskType, settings: msgspec.Struct
) -> ResolvedResources:
    """The resources of a task from the hint of its type, replaced by the task's override.

    A `command` task takes its resources from its settings: one process of all its cores.
    """
    if task_type.name == "command":
        return ResolvedResources(
            memory_base_gb=0.0,
            memory_per_worker_gb=float(settings.memory_gb),
            scratch_gb=float(settings.scratch_gb),
            gpus=int(settings.gpus),
            workers=1,
            cores_per_worker=int(settings.cores),
            source="settings",
        )
    hint = task_type.hint
    resolved = ResolvedResources(
        memory_base_gb=hint.memory_base_gb,
        memory_per_worker_gb=hint.memory_per_worker_gb,
        scratch_gb=hint.scratch_gb,
        gpus=hint.gpus,
    )
    override = task.resources
    if override is None:
        return resolved
    return msgspec.structs.replace(
        resolved,
        memory_per_worker_gb=override.memory_per_worker_gb or resolved.memory_per_worker_gb,
        scratch_gb=resolved.scratch_gb if override.scratch_gb is None else override.scratch_gb,
        gpus=resolved.gpus if override.gpus is None else override.gpus,
        workers=override.workers,
        source="override",
    )
