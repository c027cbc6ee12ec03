"""The Workflow a submission would create, without a service or a cluster, for review and GitOps
(`simrun render WORKFLOW --argo`, issue 12).

The workflow is checked and planned as a submission is (`simrun_api.submission`), with the
resources of the types' hints and the overrides of the workflow (a renderer has no learned
observations), against given nodes or three of a default shape. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Unpack

from simrun_core import events as ev
from simrun_core.argo.workflow import workflow_manifest
from simrun_core.cluster import ClusterConfig
from simrun_core.fold import RunRecord, fold
from simrun_core.planner import Node
from simrun_core.planning import SubmissionOptions, submitted_offline
from simrun_core.plugins import TaskType
from simrun_core.workflow import Workflow

RENDER_RUN_ID: Final = "00000000-000000-000000"
"""The run id of a rendered workflow: a run id's form, no run's."""
RENDER_TIME: Final = datetime(2000, 1, 1, tzinfo=UTC)
RENDERED_BY: Final = "render"
UNBUILT_IMAGE: Final = "simrun-environment:unbuilt"
"""The image of a rendered run without one: a submission builds the environment's image."""
DEFAULT_NODES: Final = tuple(Node(name=f"worker-{n}", cores=8, memory_gb=32.0) for n in (1, 2, 3))
"""The nodes planned on without those of a cluster: three of 8 cores and 32 GiB (as the three
agents of the k3d cluster of the tests), so a split task shows its extra workers."""


class RenderOptions(SubmissionOptions, total=False):
    """The options of `render_run`: those of the submission, and `nodes` to plan on (else
    `DEFAULT_NODES`), the `run_id` (else `RENDER_RUN_ID`) and the run's `image` (else
    `UNBUILT_IMAGE`, where a submission would build one)."""

    nodes: Sequence[Node]
    run_id: str
    image: str | None


def render_record(
    workflow: Workflow,
    types: Mapping[str, TaskType],
    config: ClusterConfig,
    *,
    nodes: Sequence[Node] = DEFAULT_NODES,
    run_id: str = RENDER_RUN_ID,
    image: str | None = None,
    **options: Unpack[SubmissionOptions],
) -> RunRecord:
    """The record a run of `workflow` would fold to once submitted on `nodes` and its image
    known (see `RenderOptions`): its plans and resources, group, reservation and image.

    Raises WorkflowError with every problem of the workflow, or of its planning.
    """
    submitted = submitted_offline(
        workflow,
        types,
        nodes,
        run_id=run_id,
        time=RENDER_TIME,
        submitted_by=RENDERED_BY,
        backend="argo",
        pod_start_s=config.pod_start_s,
        **options,
    )
    resolved = ev.EnvironmentResolved(seq=2, time=RENDER_TIME, image=image or UNBUILT_IMAGE)
    return fold([submitted, resolved])


def render_run(
    workflow: Workflow,
    types: Mapping[str, TaskType],
    config: ClusterConfig,
    **options: Unpack[RenderOptions],
) -> dict[str, Any]:
    """The Argo Workflow a submission of `workflow` would create (see `render_record` for the
    arguments and errors); what `simrun render WORKFLOW --argo` prints."""
    return workflow_manifest(render_record(workflow, types, config, **options), types, config)
