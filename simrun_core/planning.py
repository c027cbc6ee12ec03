"""A workflow checked and planned without a service, the same for every client that plans
offline (`simrun render --argo`, `simrun export --cwl`): its structure, its tasks against the
types, a reserved node, then the resources and pods of every task; and the `submitted` event of
such a run. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TypedDict, Unpack

from simrun_core import events as ev
from simrun_core.errors import Problem, WorkflowError
from simrun_core.planner import (
    MAX_PIECES,
    POD_START_S,
    Node,
    PlanError,
    TaskPlan,
    plan_task,
    usable_nodes,
)
from simrun_core.plugins import TaskType, check_workflow
from simrun_core.provenance import SourceProvenance
from simrun_core.resources import ResolvedResources, resolve_resources
from simrun_core.workflow import Priority, SplitMode, Workflow, structural_problems


class SubmissionOptions(TypedDict, total=False):
    """How a client that plans offline submits a workflow, as `simrun submit` would.

    `priority` (standard by default); `group` the group of the run; `reserve` the node the run
    reserves (else the workflow's); `split` the submission's split mode (else the task's, else
    the workflow's); `sources` the provenance of the run's sources, the model first.
    """

    priority: Priority
    group: str | None
    reserve: str | None
    split: SplitMode | None
    sources: Sequence[SourceProvenance]


def submitted_offline(
    workflow: Workflow,
    types: Mapping[str, TaskType],
    nodes: Sequence[Node],
    *,
    run_id: str,
    time: datetime,
    submitted_by: str,
    backend: str,
    writer: ev.Writer = ev.Writer.SERVICE,
    pod_start_s: float = POD_START_S,
    max_pods: int = MAX_PIECES,
    refusals: Sequence[Problem] = (),
    **options: Unpack[SubmissionOptions],
) -> ev.Submitted:
    """The `submitted` event of a run of `workflow` on `backend`, planned on `nodes` without a
    service (`plan_offline`: the resources of the types' hints and the workflow's overrides);
    `writer` who writes the run's log (`simrun export` writes the one of a CWL run).

    Raises WorkflowError as `plan_offline` does, with `refusals` among the problems.
    """
    priority = options.get("priority", Priority.STANDARD)
    reserve = options.get("reserve") or workflow.reserve
    plans, resources = plan_offline(
        workflow,
        types,
        nodes,
        run_id=run_id,
        priority=priority,
        split=options.get("split"),
        pod_start_s=pod_start_s,
        max_pods=max_pods,
        reserve=reserve,
        refusals=refusals,
    )
    return ev.Submitted(
        seq=1,
        time=time,
        run=run_id,
        workflow=workflow,
        submitted_by=submitted_by,
        owner=submitted_by,
        priority=priority,
        group=options.get("group"),
        plans=plans,
        resources=resources,
        reserve=reserve,
        sources=list(options.get("sources", ())),
        backend=backend,
        writer=writer,
    )


def plan_offline(
    workflow: Workflow,
    types: Mapping[str, TaskType],
    nodes: Sequence[Node],
    *,
    run_id: str,
    priority: Priority = Priority.STANDARD,
    split: SplitMode | None = None,
    pod_start_s: float = POD_START_S,
    max_pods: int = MAX_PIECES,
    reserve: str | None = None,
    refusals: Sequence[Problem] = (),
) -> tuple[dict[str, TaskPlan], dict[str, ResolvedResources]]:
    """The plans and resources of the tasks of `workflow` on `nodes`.

    `split` is the submission's split mode (else the task's, else the workflow's); `reserve`
    the node the run reserves; `refusals` problems of the caller's own, reported with those of
    the tasks. Raises WorkflowError with every problem of the workflow's structure, else of its
    tasks, else of the reservation, else of the planning.
    """
    problems = structural_problems(workflow)
    if problems:
        raise WorkflowError(problems)
    checked, problems = check_workflow(workflow, dict(types))
    problems += refusals
    if problems:
        raise WorkflowError(problems)
    node_list = list(nodes)
    if reserve is not None:
        try:
            usable_nodes(node_list, run_id, reserve)
        except PlanError as error:
            raise WorkflowError(Problem(error.reason, field="reserve")) from None
    resources: dict[str, ResolvedResources] = {}
    plans: dict[str, TaskPlan] = {}
    for task in checked:
        spec = task.spec
        resources[spec.id] = resolve_resources(spec, task.task_type, task.settings)
        try:
            plans[spec.id] = plan_task(
                spec,
                task.task_type,
                resources[spec.id],
                node_list,
                split or spec.split or workflow.split,
                priority,
                task.units,
                pod_start_s,
                max_pods=max_pods,
                run_id=run_id,
                reserve=reserve,
            )
        except PlanError as error:
            problems.append(error.problem())
    if problems:
        raise WorkflowError(problems)
    return plans, resources
