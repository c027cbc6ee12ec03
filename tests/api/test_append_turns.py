"""The appends of every run's log take turns: one thread at a time appends for the service."""

from __future__ import annotations

import threading
import time

from supervised import supervise

from simrun_api.actor import RunActor
from simrun_api.backends.fake import FakeBackend, Outcome
from simrun_core import events as ev
from simrun_core.planner import Node, plan_task
from simrun_core.plugins import load_task_types
from simrun_core.resources import resolve_resources
from simrun_core.states import RunState
from simrun_core.store import LogWriter, RunPaths
from simrun_core.workflow import Priority, SplitMode, TaskSpec, Workflow

RUNS = 8


def submitted_run(store, run_id: str) -> RunPaths:
    """A submitted run of one split task of two units, nothing else in its log."""
    types = load_task_types()
    task = TaskSpec(id="a", type="demo.squares", settings={"n": 2})
    task_type = types[task.type]
    settings = task_type.decode_settings(task.settings)
    plan = plan_task(
        task,
        task_type,
        resolve_resources(task, task_type, settings),
        [Node(name="node-1", cores=2, memory_gb=8.0)],
        SplitMode.FASTEST,
        Priority.OWNER,
        task_type.units(settings),
    )
    paths = RunPaths(store, run_id)
    writer = LogWriter(paths.events)
    workflow = Workflow(name="one", tasks=[task])
    writer.append(
        ev.Submitted(
            seq=1, run=run_id, workflow=workflow, submitted_by="u", owner="u", plans={"a": plan}
        )
    )
    writer.close()
    return paths


def test_the_runs_of_a_service_append_one_at_a_time(tmp_path, monkeypatch) -> None:
    store = tmp_path / "store"
    runs = [f"20250102-030405-{number:06x}" for number in range(RUNS)]
    for run_id in runs:
        submitted_run(store, run_id)
    inside = 0
    most = 0
    appends = 0
    lock = threading.Lock()
    append = RunActor._append

    def counted(self, numbered):
        nonlocal inside, most, appends
        with lock:
            inside += 1
            most = max(most, inside)
            appends += 1
        try:
            time.sleep(0.005)  # long enough for the appends of other runs to come meanwhile
            return append(self, numbered)
        finally:
            with lock:
                inside -= 1

    monkeypatch.setattr(RunActor, "_append", counted)
    backend = FakeBackend(store, autopilot=lambda pod: Outcome(exit_code=0))

    states: list[RunState] = []

    async def all_ended(supervisor) -> bool:
        states[:] = [supervisor.summary(run_id).state for run_id in runs]
        return all(state.ended for state in states)

    supervise(store, backend, all_ended)
    assert states == [RunState.SUCCEEDED] * RUNS
    assert appends >= RUNS * 3
    assert most == 1
