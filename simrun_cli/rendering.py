"""`simrun render WORKFLOW --argo`: the Argo Workflow a submission would create, and `--slurm`:
the Slurm batch scripts, with no service and no cluster, planned with the task types installed
here against the nodes of a file or three of a default shape (simrun_core.argo.render,
simrun_core.slurm_jobs); the settings planned by the `plan` of their types first, as a
submission plans them (`simrun_cli.request.plan_tasks`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import yaml

from simrun_cli.errors import CliError
from simrun_cli.provenance import SourceError, parse_source
from simrun_cli.request import plan_tasks, source_provenance
from simrun_core.argo.render import DEFAULT_NODES, render_run
from simrun_core.cluster import ClusterConfig
from simrun_core.errors import WorkflowError
from simrun_core.planner import Node
from simrun_core.plugins import load_task_types
from simrun_core.slurm import BatchJob, batch_script
from simrun_core.slurm_jobs import DEFAULT_NODES as SLURM_NODES
from simrun_core.slurm_jobs import RENDER_STORE, SlurmSettings, render_jobs
from simrun_core.workflow import SplitMode, load_workflow


def read_yaml(path: Path, kind: str) -> Any:
    """The data of a YAML file given as an option; CliError naming the file when it cannot be
    read or is no `kind`."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as error:
        raise CliError(f"{path}: cannot be read: {error.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise CliError(f"{path}: no {kind}: {error}") from None


def load_nodes(path: Path) -> list[Node]:
    """The nodes of a YAML (or JSON) file: a list of `{name, cores, memory_gb, gpus}`;
    CliError naming the file and the entry that is wrong."""
    data = read_yaml(path, "YAML or JSON")
    try:
        nodes = msgspec.convert(data, list[Node])
    except msgspec.ValidationError as error:
        why = f"{path}: not a list of nodes (name, cores, memory_gb, gpus): {error}"
        raise CliError(why) from None
    if not nodes:
        raise CliError(f"{path}: no node to plan on")
    return nodes


def render_argo(
    workflow: Path,
    sources: list[str],
    nodes: Path | None,
    group: str | None,
    single_server: bool,
    reserve: str | None,
) -> dict[str, Any]:
    """The Workflow of a submission of the file `workflow`; CliError naming what is wrong."""
    try:
        named = [parse_source(option) for option in sources]
        planned = plan_tasks(load_workflow(workflow), named[0][1] if named else None)
        provenance = source_provenance(named)
        return render_run(
            planned,
            load_task_types(),
            ClusterConfig(),
            nodes=load_nodes(nodes) if nodes is not None else DEFAULT_NODES,
            group=group,
            reserve=reserve,
            split=SplitMode.SINGLE_SERVER if single_server else None,
            sources=provenance,
        )
    except WorkflowError as error:
        raise CliError(str(error.naming(str(workflow)))) from None
    except SourceError as error:
        raise CliError(str(error)) from None


def load_slurm_settings(path: Path) -> tuple[Path, SlurmSettings]:
    """The store and the `slurm:` block of a service's settings file (the store relative to
    the file, as the service reads it; `RENDER_STORE` without one); CliError naming the file and
    what is wrong: a missing file, no mapping, an unknown or invalid key of the block."""
    data = read_yaml(path, "YAML")
    if not isinstance(data, dict):
        raise CliError(f"{path}: not a mapping of setting to value")
    store = data.get("store")
    if store is not None and not isinstance(store, str):
        raise CliError(f"{path}: store: expected a path, got {store!r}")
    try:
        settings = msgspec.convert(data.get("slurm") or {}, SlurmSettings, strict=False)
    except msgspec.ValidationError as error:
        raise CliError(f"{path}: slurm: {error}") from None
    return (path.parent / store if store else RENDER_STORE), settings


def render_slurm(
    workflow: Path,
    sources: list[str],
    nodes: Path | None,
    settings: Path | None,
    group: str | None,
    single_server: bool,
    reserve: str | None,
) -> list[BatchJob]:
    """The batch jobs of a submission of the file `workflow` on Slurm, with the store and the
    `slurm:` block of the settings file `settings` (`render_jobs`); CliError naming what is
    wrong."""
    store, block = load_slurm_settings(settings) if settings else (RENDER_STORE, SlurmSettings())
    try:
        named = [parse_source(option) for option in sources]
        planned = plan_tasks(load_workflow(workflow), named[0][1] if named else None)
        return render_jobs(
            planned,
            load_task_types(),
            nodes=load_nodes(nodes) if nodes is not None else SLURM_NODES,
            store=store.absolute(),
            settings=block,
            group=group,
            reserve=reserve,
            split=SplitMode.SINGLE_SERVER if single_server else None,
            sources=source_provenance(named),
        )
    except WorkflowError as error:
        raise CliError(str(error.naming(str(workflow)))) from None
    except SourceError as error:
        raise CliError(str(error)) from None


def slurm_scripts(jobs: list[BatchJob]) -> str:
    """The batch scripts of jobs, one after the other, a blank line between two."""
    return "\n".join(batch_script(job) for job in jobs)


def slurm_json(jobs: list[BatchJob]) -> list[dict[str, Any]]:
    """The jobs as `render --slurm --json` prints them: name, task, worker, partition, script."""
    return [
        {
            "name": job.name,
            "task": job.launch.task,
            "worker": job.launch.worker,
            "partition": job.partition,
            "script": batch_script(job),
        }
        for job in jobs
    ]
