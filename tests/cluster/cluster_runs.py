"""Whole runs on the fake cluster, shared by its tests: a run's `submitted` event planned on
the cluster's nodes, and a Supervisor on the Argo backend of a FakeCluster."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from fake.cluster import FakeCluster, NodeSpec

from simrun_api.backends.argo import ArgoBackend
from simrun_api.index import RunIndex
from simrun_api.resources import ResourceStore
from simrun_api.supervisor import Supervisor
from simrun_core import events as ev
from simrun_core.planner import MAX_PIECES, Node, plan_task
from simrun_core.plugins import load_task_types
from simrun_core.resources import resolve_resources
from simrun_core.store import RunPaths, read_log
from simrun_core.workflow import Priority, SplitMode, Workflow

TIMEOUT_S = 45.0
HARNESS_ENV = {"SIMRUN_MEMORY_SOURCE": "process"}
"""The pods' harness reads its memory from its process tree: the fake kubelet's pods share
this machine's cgroup."""


def submitted(
    run_id: str,
    workflow: Workflow,
    nodes: list[NodeSpec],
    priority: Priority,
    *,
    mode: SplitMode | None = None,
    max_pods: int = MAX_PIECES,
    reserve: str | None = None,
) -> tuple[ev.Submitted, dict]:
    """The `submitted` event of `workflow` at `priority`, planned on the cluster's nodes (in
    `mode`, else the task's or the workflow's; on the node it reserves, if any), and the
    settings of its tasks."""
    types = load_task_types()
    planned_on = [Node(name=n.name, cores=n.cores, memory_gb=n.memory_gb) for n in nodes]
    plans, resources = {}, {}
    for task in workflow.tasks:
        task_type = types[task.type]
        settings = task_type.decode_settings(task.settings)
        resources[task.id] = resolve_resources(task, task_type, settings)
        plans[task.id] = plan_task(
            task,
            task_type,
            resources[task.id],
            planned_on,
            mode or task.split or workflow.split or SplitMode.FASTEST,
            priority,
            task_type.units(settings),
            max_pods=max_pods,
            run_id=run_id,
            reserve=reserve,
        )
    event = ev.Submitted(
        seq=1,
        run=run_id,
        workflow=workflow,
        submitted_by="u",
        owner="u",
        priority=priority,
        plans=plans,
        resources=resources,
        backend="argo",
        reserve=reserve,
    )
    settings = {task.id: msgspec.to_builtins(task.settings) for task in workflow.tasks}
    return event, settings


class Service:
    """A Supervisor on the Argo backend of a fake cluster, in an async with."""

    def __init__(self, cluster: FakeCluster, db: Path) -> None:
        self.cluster = cluster
        self.backend = ArgoBackend(
            cluster.config, configuration=cluster.configuration(), default_image="simrun:test"
        )
        self.index, self.resources = RunIndex(db), ResourceStore(db)
        self.supervisor = Supervisor(
            cluster.store_dir, self.backend, load_task_types(), self.index, self.resources
        )

    async def __aenter__(self) -> Service:
        await self.index.open()
        await self.resources.open()
        await self.supervisor.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.supervisor.close()
        await self.backend.close()
        await self.resources.close()
        await self.index.close()

    async def submit(self, event: ev.Submitted, settings: dict) -> None:
        await self.supervisor.submit(event, settings)

    def log(self, run_id: str) -> list[ev.Event]:
        return read_log(RunPaths(self.cluster.store_dir, run_id).events)

    async def until(
        self, condition: Callable[[], Any], what: str, timeout_s: float = TIMEOUT_S
    ) -> None:
        """Wait (polling every 0.05 s) until `condition()` holds, at most `timeout_s`."""
        try:
            async with asyncio.timeout(timeout_s):
                while not condition():
                    assert self.cluster.errors == []
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"waited {timeout_s} s for {what}") from None

    async def ended(self, run_id: str) -> list[ev.Event]:
        await self.until(lambda: self.supervisor.load(run_id).ended, f"run {run_id} to end")
        return self.log(run_id)


def kinds(events: list[ev.Event]) -> list[str]:
    return [event.__struct_config__.tag for event in events]
