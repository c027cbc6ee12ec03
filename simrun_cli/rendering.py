"""`simrun render WORKFLOW --argo`: the Argo Workflow a submission would create, with no service
and no cluster, planned with the task types installed here against the nodes of a file or three
of a default shape (simrun_core.argo.render); the settings planned by the `plan` of their types
first, as a submission plans them (`simrun_cli.request.plan_tasks`)."""

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
from simrun_core.workflow import SplitMode, load_workflow


def load_nodes(path: Path) -> list[Node]:
    """The nodes of a YAML (or JSON) file: a list of `{name, cores, memory_gb, gpus}`;
    CliError naming the file and the entry that is wrong."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise CliError(f"{path}: cannot be read: {error.strerror}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise CliError(f"{path}: no YAML or JSON: {error}") from None
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
