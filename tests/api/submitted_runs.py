"""A submitted run written to a store, as the service records it: the log's first event, with
the planner's plans of its tasks on one node. For tests that drive a real `RunActor`."""

from __future__ import annotations

from pathlib import Path

from simrun_core import events as ev
from simrun_core.planner import Node, plan_task
from simrun_core.plugins import load_task_types
from simrun_core.resources import resolve_resources
from simrun_core.store import LogWriter, RunPaths
from simrun_core.workflow import Priority, SplitMode, TaskSpec, Workflow

NODE = Node(name="node-1", cores=2, memory_gb=8.0)


def write_submitted_run(store: Path, run_id: str, name: str, tasks: list[TaskSpec]) -> RunPaths:
    """The paths of a run whose log holds only its `submitted`, its tasks planned on `NODE`."""
    types = load_task_types()
    plans = {}
    for task in tasks:
        task_type = types[task.type]
        settings = task_type.decode_settings(task.settings)
        plans[task.id] = plan_task(
            task,
            task_type,
            resolve_resources(task, task_type, settings),
            [NODE],
            SplitMode.FASTEST,
            Priority.OWNER,
            task_type.units(settings),
        )
    paths = RunPaths(store, run_id)
    writer = LogWriter(paths.events)
    workflow = Workflow(name=name, tasks=tasks)
    writer.append(
        ev.Submitted(seq=1, run=run_id, workflow=workflow, submitted_by="u", owner="u", plans=plans)
    )
    writer.close()
    return paths
