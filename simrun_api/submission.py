"""A submission checked and planned: the `submitted` event of a new run, or the reasons why not.

Checking is sync and pure (`checked_tasks`), resolving the resources of each task reads the
learned observations (`resolve_all`), planning is pure again (`plan_tasks`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from simrun_api.resources import ResourceStore
from simrun_core.errors import WorkflowError
from simrun_core.events import Submitted
from simrun_core.planner import Node, PlanError, TaskPlan, plan_task
from simrun_core.plugins import TaskType, validate_workflow
from simrun_core.resources import ResolvedResources, expected_seconds
from simrun_core.wire import Identity, SubmitRequest, TaskEstimate
from simrun_core.workflow import Priority, TaskSpec, Workflow, structural_errors


class SubmissionRefused(ValueError):
    """A submission that cannot run; the message names every reason."""


@dataclasses.dataclass(frozen=True)
class CheckedTask:
    """A task of a valid workflow with its type, decoded settings and units (None unsplit)."""

    spec: TaskSpec
    task_type: TaskType
    settings: msgspec.Struct
    units: int | None


def workflow_errors(workflow: Workflow, types: dict[str, TaskType]) -> list[str]:
    """Every error of a workflow: its structure, its types, settings and ports."""
    errors = structural_errors(workflow)
    return errors + validate_workflow(workflow, types)


def checked_tasks(
    request: SubmitRequest, types: dict[str, TaskType], backend: str, reservations: bool
) -> list[CheckedTask]:
    """The tasks of a submission in order; SubmissionRefused names every error."""
    workflow = request.workflow
    errors = workflow_errors(workflow, types)
    if errors:
        raise SubmissionRefused(f"workflow {workflow.name!r}: " + "; ".join(errors))
    reserve = request.reserve or workflow.reserve
    if reserve and not reservations:
        raise SubmissionRefused(
            f"workflow {workflow.name!r}: node {reserve!r} cannot be reserved: "
            f"the {backend} backend has no reservations"
        )
    checked = []
    for task in workflow.order():
        task_type = types[task.type]
        try:
            decoded = task_type.decode_settings(task.settings)
            units = task_type.units(decoded)
        except WorkflowError as error:
            raise SubmissionRefused(f"task {task.id!r}: settings: {error}") from None
        except Exception as error:
            raise SubmissionRefused(
                f"task {task.id!r}: counting its units failed: {type(error).__name__}: {error}"
            ) from None
        if units is not None and units < 1:
            raise SubmissionRefused(f"task {task.id!r}: it has {units} units, at least 1 needed")
        checked.append(CheckedTask(task, task_type, decoded, units))
    return checked


def model_of(request: SubmitRequest) -> str:
    """The model of a submission: the name of its first source, empty without."""
    return request.sources[0].name if request.sources else ""


async def resolve_all(
    tasks: list[CheckedTask], store: ResourceStore, model: str
) -> dict[str, ResolvedResources]:
    """The resources of every task, learned from the observations of its key."""
    return {
        task.spec.id: await store.resolve(task.spec, task.task_type, task.settings, model)
        for task in tasks
    }


def plan_tasks(
    run_id: str,
    request: SubmitRequest,
    tasks: list[CheckedTask],
    resources: dict[str, ResolvedResources],
    priority: Priority,
    nodes: list[Node],
    max_pods: int,
) -> dict[str, TaskPlan]:
    """The plans of the tasks of a run; SubmissionRefused names a task that fits on no node."""
    workflow = request.workflow
    plans: dict[str, TaskPlan] = {}
    for task in tasks:
        spec = task.spec
        resolved = resources[spec.id]
        try:
            plans[spec.id] = plan_task(
                spec,
                task.task_type,
                resolved,
                nodes,
                request.split or spec.split or workflow.split,
                priority,
                task.units,
                max_pods=max_pods,
                run_id=run_id,
                reserve=request.reserve or workflow.reserve,
            )
        except PlanError as error:
            raise SubmissionRefused(str(error)) from None
    return plans


def estimates(
    plans: dict[str, TaskPlan], resources: dict[str, ResolvedResources]
) -> dict[str, TaskEstimate]:
    """The resources, plan and expected seconds of every task."""
    return {
        task_id: TaskEstimate(
            resources=resources[task_id],
            plan=plan,
            seconds=expected_seconds(plan, resources[task_id].seconds_per_unit),
        )
        for task_id, plan in plans.items()
    }


def submitted_event(
    run_id: str,
    request: SubmitRequest,
    identity: Identity,
    priority: Priority,
    plans: dict[str, TaskPlan],
    resources: dict[str, ResolvedResources],
    backend: str,
) -> tuple[Submitted, dict[str, dict[str, Any]]]:
    """The `submitted` event of a planned run and the settings of its tasks as submitted."""
    submitted = Submitted(
        run=run_id,
        workflow=request.workflow,
        submitted_by=identity.name,
        owner=identity.owner,
        agent=identity.name if identity.kind == "agent" else None,
        priority=priority,
        group=request.group,
        sources=request.sources,
        plans=plans,
        resources=resources,
        reserve=request.reserve or request.workflow.reserve,
        backend=backend,
        local_commands=request.local_commands,
    )
    settings = {task.id: msgspec.to_builtins(task.settings) for task in request.workflow.tasks}
    return submitted, settings
