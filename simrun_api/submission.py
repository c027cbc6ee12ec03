"""A submission checked and planned: the `submitted` event of a new run, or the reasons why not.

Checking is sync and pure (`checked_tasks`), resolving the resources of each task reads the
learned observations (`resolve_all`), planning is pure again (`plan_tasks`); each gives every
problem it finds (`simrun_core.errors.Problem`), so a refusal lists them all at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from simrun_api.backends.containers import no_engine_message
from simrun_api.resources import ResourceStore
from simrun_core.errors import Problem
from simrun_core.events import Submitted
from simrun_core.planner import (
    POD_START_S,
    Node,
    PlanError,
    TaskPlan,
    plan_task,
    usable_nodes,
)
from simrun_core.plugins import TaskCheck, TaskType, check_workflow, checkable_problems
from simrun_core.resources import ResolvedResources, expected_seconds
from simrun_core.snapshot_types import ProbedType
from simrun_core.wire import Identity, SubmitRequest, TaskEstimate
from simrun_core.workflow import (
    Priority,
    data_problem,
    decode_workflow,
    struct_problems,
    structural_problems,
)


def body_problems(
    body: object, model: type[msgspec.Struct], types: Mapping[str, TaskType] | None = None
) -> list[Problem]:
    """Every problem that keeps a decoded JSON body from being a `model` (a `SubmitRequest`, or
    another struct with a `workflow`): no object, too deep or too large (`data_problem`), its
    own fields, and each field of each task of its workflow, with the problems the checks of
    the `types` find beside them (`checkable_problems`: a wrong setting is named with a wrong
    resource). A body without them decodes; the structural problems of its workflow are left to
    `checked_tasks`, to be listed with the rest.
    """
    if body is None:
        return [Problem("the body is empty: a JSON object with the workflow is expected")]
    shape = data_problem(body)
    if shape is not None:
        return [shape]
    if not isinstance(body, dict):
        return [Problem("the body is no JSON object with the workflow")]
    problems = struct_problems(body, model, skip=("workflow",))
    if "workflow" not in body:
        problems.append(Problem("missing, it is required", field="workflow"))
    else:
        workflow, found = decode_workflow(body["workflow"])
        if workflow is None:
            problems.extend(found)
            problems.extend(checkable_problems(body["workflow"], types or {}))
    return problems


def checked_tasks(
    request: SubmitRequest,
    types: dict[str, TaskType],
    backend: str,
    reservations: bool,
    local_commands: bool = False,
    engine: str | None = None,
) -> tuple[list[TaskCheck], list[Problem]]:
    """The tasks of a submission whose settings decoded (in order when the workflow has none
    of the problems) and every problem of the submission but those of planning.

    `local_commands`: whether the backend runs the `command` tasks as the run says
    (`Capabilities.local_commands`); `engine` the container engine it found, which a run with
    `local_commands: docker` needs (refused without one, never recorded and ignored)."""
    workflow = request.workflow
    problems = structural_problems(workflow)
    checked, found = check_workflow(workflow, types)
    problems.extend(found)
    reserve = request.reserve or workflow.reserve
    if reserve and not reservations:
        message = f"node {reserve!r} cannot be reserved: the {backend} backend has no reservations"
        problems.append(Problem(message, field="reserve"))
    if request.local_commands is not None and not local_commands:
        message = (
            f"{request.local_commands!r} is for the local service: the {backend} backend runs "
            "every command task in its image"
        )
        problems.append(Problem(message, field="local_commands"))
    elif request.local_commands == "docker" and engine is None:
        problems.append(Problem(no_engine_message(), field="local_commands"))
    if not problems:
        position = {task.id: index for index, task in enumerate(workflow.order())}
        checked.sort(key=lambda task: position[task.spec.id])
    return checked, problems


def model_of(request: SubmitRequest) -> str:
    """The model of a submission: the name of its first source, empty without."""
    return request.sources[0].name if request.sources else ""


async def resolve_all(
    tasks: list[TaskCheck], store: ResourceStore, model: str
) -> dict[str, ResolvedResources]:
    """The resources of every task, learned from the observations of its key."""
    return {
        task.spec.id: await store.resolve(task.spec, task.task_type, task.settings, model)
        for task in tasks
    }


def plan_tasks(
    run_id: str,
    request: SubmitRequest,
    tasks: list[TaskCheck],
    resources: dict[str, ResolvedResources],
    priority: Priority,
    nodes: list[Node],
    max_pods: int,
    pod_start_s: float = POD_START_S,
) -> tuple[dict[str, TaskPlan], list[Problem]]:
    """The plans of the tasks of a run on a backend of `max_pods` and `pod_start_s` (its
    `Capabilities.pod_start_s`), and the problem of every task that fits on no node (or of the
    node to reserve, once)."""
    workflow = request.workflow
    reserve = request.reserve or workflow.reserve
    if reserve:
        try:
            usable_nodes(nodes, run_id, reserve)
        except PlanError as error:
            return {}, [Problem(error.reason, field="reserve")]
    plans: dict[str, TaskPlan] = {}
    problems: list[Problem] = []
    for task in tasks:
        spec = task.spec
        try:
            plans[spec.id] = plan_task(
                spec,
                task.task_type,
                resources[spec.id],
                nodes,
                request.split or spec.split or workflow.split,
                priority,
                task.units,
                pod_start_s,
                max_pods=max_pods,
                run_id=run_id,
                reserve=reserve,
            )
        except PlanError as error:
            problems.append(error.problem())
    return plans, problems


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
    snapshot_types: dict[str, ProbedType] | None = None,
) -> tuple[Submitted, dict[str, dict[str, Any]]]:
    """The `submitted` event of a planned run and the settings of its tasks as submitted;
    `snapshot_types` are the types of its snapshots it was checked with
    (`simrun_api.snapshot_types`)."""
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
        snapshot_types=snapshot_types or {},
    )
    settings = {task.id: msgspec.to_builtins(task.settings) for task in request.workflow.tasks}
    return submitted, settings
