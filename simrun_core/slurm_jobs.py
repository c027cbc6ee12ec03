"""The batch jobs of a run on Slurm: the `slurm:` block of the settings, the batch job of each
attempt of a run's workers, and the scripts a submission would create (`simrun render
WORKFLOW --slurm`), without a service or a cluster. Pure: the Slurm backend submits what
`batch_job_of` makes, the renderer prints it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final, Unpack

import msgspec

from simrun_core import slurm
from simrun_core.argv import expand_argv
from simrun_core.errors import WorkflowError
from simrun_core.fold import RunRecord, fold
from simrun_core.launch import editable_snapshots, launch_for, main_worker
from simrun_core.planner import Node
from simrun_core.planning import SubmissionOptions, submitted_offline
from simrun_core.plugins import TaskType
from simrun_core.store import RunPaths
from simrun_core.workflow import Workflow

RENDER_RUN_ID: Final = "00000000-000000-000000"
"""The run id of rendered scripts: a run id's form, no run's."""
RENDER_TIME: Final = datetime(2000, 1, 1, tzinfo=UTC)
RENDERED_BY: Final = "render"
RENDER_STORE: Final = Path("/shared/simrun/store")
"""The store of rendered scripts without a settings file: that of `deploy/slurm/settings.yaml`."""
DEFAULT_NODES: Final = tuple(Node(name=f"node{n}", cores=8, memory_gb=32.0) for n in (1, 2, 3))
"""The nodes planned on without a file of them: three of 8 cores and 32 GiB, so a split task
shows its extra workers."""


class SlurmSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `slurm:` block of the service's settings.

    `partitions` maps a priority class (`simrun-owner-base` ...) to its partition, each class
    its own name by default; `scratch_path` is the node-local scratch; `grace_s` the seconds a
    worker is told it has after SIGTERM (Slurm's `KillWait` gives them: the service refuses to
    start with a longer one); `account` and
    `sbatch_options` go on every job; `python` is the harness's interpreter on the nodes (the
    service's own by default, on a path every node sees); `poll_s` the period of the one
    `squeue` of every run; `pod_start_s` about the seconds from a job's submission to its first
    unit on idle nodes (the planner adds a job to a split task only while every job keeps at
    least this much work)."""

    partitions: dict[str, str] = msgspec.field(default_factory=dict)
    scratch_path: str = "/tmp/simrun"
    grace_s: float = 30.0
    account: str | None = None
    sbatch_options: list[str] = msgspec.field(default_factory=list)
    python: str | None = None
    poll_s: float = 2.0
    pod_start_s: Annotated[float, msgspec.Meta(gt=0)] = 1.0

    def __post_init__(self) -> None:
        owned = [
            f"sbatch_options[{index}] {option!r}"
            for index, option in enumerate(self.sbatch_options)
            if option.split("=")[0] in OWNED_OPTIONS or option.startswith("-J")
        ]
        if owned:
            raise ValueError(
                f"{', '.join(owned)}: simrun sets each job's name and comment itself (the run, "
                "task, worker and attempt it follows and takes over by)"
            )


OWNED_OPTIONS: Final = frozenset({"--job-name", "--comment"})
"""The sbatch options simrun's bookkeeping owns (`simrun_core.slurm.sbatch_lines`): a site's
`sbatch_options` after them would replace them."""


def batch_job_of(
    record: RunRecord,
    types: Mapping[str, TaskType],
    task: str,
    worker: str,
    attempt: int,
    retry_memory: bool,
    *,
    store: Path,
    settings: SlurmSettings,
    python: str,
    reservation: str | None = None,
) -> slurm.BatchJob:
    """The batch job of an attempt of a run's worker: its launch (the memory limit enforced,
    as a job's is), its partition, cores, memory and GPUs from the plan, its command.
    WorkflowError for a task whose type has no command."""
    plan = record.plans[task]
    task_type = types[record.workflow.task(task).type]
    launch = launch_for(
        record,
        task,
        worker,
        attempt,
        task_type=task_type,
        store=store,
        scratch=settings.scratch_path,
        node="",
        cores=plan.shape.cores,
        grace_s=settings.grace_s,
        memory_source="process",
        memory_enforced=True,
        retry_memory=retry_memory,
        editable=editable_snapshots(record, store),
    )
    paths = RunPaths(store, record.id)
    if launch.entry is not None:
        argv = [python, "-m", f"simrun_harness.{launch.entry}"]
    elif task_type.name == "command":
        spec = record.workflow.task(task)
        command = msgspec.convert(spec.settings, task_type.settings)
        inputs = {port: str(store / path) for port, path in launch.inputs.items()}
        args: Any = command.args  # type: ignore[attr-defined]
        argv = expand_argv(args, str(paths.settings(task)), str(paths.out(task)), inputs)
    else:
        raise WorkflowError(f"task {task!r}: type {task_type.name!r} has no command")
    extra = worker != main_worker(plan)  # an extra pod of a split task: requeued, lower class
    priority_class = plan.extra_priority if extra else plan.base_priority
    memory_gb = plan.shape.retry_memory_gb if retry_memory else plan.shape.memory_gb
    environment = {}
    model = record.sources[0] if record.sources else None
    if model is not None and model.path and not model.snapshot:
        environment["PYTHONPATH"] = model.path
    return slurm.BatchJob(
        launch=launch,
        argv=argv,
        partition=slurm.partition_of(priority_class, settings.partitions),
        cores=plan.shape.cores,
        memory_mb=slurm.memory_mb(memory_gb),
        gpus=plan.shape.gpus,
        requeue=extra,
        log_dir=str(paths.logs(task)),
        scratch_root=settings.scratch_path,
        account=settings.account,
        reservation=reservation,
        options=tuple(settings.sbatch_options),
        environment=environment,
    )


def render_jobs(
    workflow: Workflow,
    types: Mapping[str, TaskType],
    *,
    nodes: Sequence[Node] = DEFAULT_NODES,
    store: Path = RENDER_STORE,
    settings: SlurmSettings | None = None,
    python: str | None = None,
    **options: Unpack[SubmissionOptions],
) -> list[slurm.BatchJob]:
    """The batch jobs a submission of `workflow` on Slurm creates: the first attempt of every
    worker of every task in the workflow's order (a task's jobs are submitted once its inputs
    succeeded), planned on `nodes`, the store at `store` on every node, with the `slurm:`
    block `settings` (else its defaults) and the harness's interpreter `python` (else the
    block's, else this one). Raises WorkflowError with every problem of the workflow, or of
    its planning."""
    settings = settings if settings is not None else SlurmSettings()
    python = python or settings.python or sys.executable
    submitted = submitted_offline(
        workflow,
        types,
        nodes,
        run_id=RENDER_RUN_ID,
        time=RENDER_TIME,
        submitted_by=RENDERED_BY,
        backend="slurm",
        pod_start_s=settings.pod_start_s,
        **options,
    )
    record = fold([submitted])
    reservation = slurm.reservation_name(record.id) if record.reserve is not None else None
    return [
        batch_job_of(
            record,
            types,
            task.id,
            worker,
            0,
            False,
            store=store,
            settings=settings,
            python=python,
            reservation=reservation,
        )
        for task in record.workflow.order()
        for worker in slurm.pod_workers(record.plans[task.id])
    ]
