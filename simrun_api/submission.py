"""A submission checked and planned: the `submitted` event of a new run, or the reasons why not."""

from __future__ import annotations

from typing import Any

import msgspec

from simrun_core.errors import WorkflowError
from simrun_core.events import Submitted
from simrun_core.planner import Node, PlanError, TaskPlan, plan_task
from simrun_core.plugins import TaskType, validate_workflow
from simrun_core.resources import resolve_resources
from simrun_core.store import new_run_id
from simrun_core.wire import Identity, SubmitRequest
from simrun_core.workflow import Priority, Workflow, structural_errors


class SubmissionRefused(ValueError):
    """A submission that cannot run; the message names every reason."""


def workflow_errors(workflow: Workflow, types: dict[str, TaskType]) -> list[str]:
    """Every error of a workflow: its structure, its types, settings and ports."""
    errors = structural_errors(workflow)
    return errors + validate_workflow(workflow, types)


def plan_submission(
    request: SubmitRequest,
    identity: Identity,
    priority: Priority,
    types: dict[str, TaskType],
    nodes: list[Node],
    max_pods: int,
    backend: str,
    reservations: bool,
) -> tuple[Submitted, dict[str, dict[str, Any]]]:
    """The `submitted` event of a valid submission and the settings of its tasks.

    SubmissionRefused names the workflow and every error: structure, types, settings, plans.
    """
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
    run_id = new_run_id()
    plans: dict[str, TaskPlan] = {}
    settings: dict[str, dict[str, Any]] = {}
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
        mode = request.split or task.split or workflow.split
        resources = resolve_resources(task, task_type, decoded)
        try:
            plans[task.id] = plan_task(
                task,
                task_type,
                resources,
                nodes,
                mode,
                priority,
                units,
                max_pods=max_pods,
                run_id=run_id,
                reserve=reserve,
            )
        except PlanError as error:
            raise SubmissionRefused(str(error)) from None
        settings[task.id] = msgspec.to_builtins(task.settings)
    submitted = Submitted(
        run=run_id,
        workflow=workflow,
        submitted_by=identity.name,
        owner=identity.owner,
        agent=identity.name if identity.kind == "agent" else None,
        priority=priority,
        group=request.group,
        sources=request.sources,
        plans=plans,
        backend=backend,
        local_commands=request.local_commands,
    )
    return submitted, settings
