"""Samples shared by the simrun_core tests: a workflow of two tasks, its plans, a realistic log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from simrun_core import events as ev
from simrun_core.planner import Node, TaskPlan, plan_task
from simrun_core.plugins import load_task_types
from simrun_core.resources import resolve_resources
from simrun_core.states import TaskState
from simrun_core.workflow import Priority, SplitMode, TaskSpec, Workflow

T0 = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
RUN_ID = "20240506-070809-a1b2c3"
NODE = Node(name="node-1", cores=2, memory_gb=24.0)


def at(seconds: float) -> datetime:
    """The time `seconds` after T0."""
    return T0 + timedelta(seconds=seconds)


def sample_workflow() -> Workflow:
    """A split task of 3 units and a command task that reads its output port."""
    return Workflow(
        name="squares-and-plot",
        tasks=[
            TaskSpec(id="squares", type="demo.squares", settings={"n": 3}),
            TaskSpec(
                id="plot",
                type="command",
                settings={
                    "image": "tools:1",
                    "args": ["plot", "--input={input}", "--out={out}"],
                    "cores": 1,
                    "memory_gb": 2.0,
                },
                inputs={"squares": "squares.squares"},
            ),
        ],
    )


def sample_plans(workflow: Workflow) -> dict[str, TaskPlan]:
    """The plans of the workflow's tasks on one node of 2 cores and 24 GiB."""
    types = load_task_types()
    result = {}
    for task in workflow.tasks:
        task_type = types[task.type]
        settings = task_type.decode_settings(task.settings)
        resources = resolve_resources(task, task_type, settings)
        result[task.id] = plan_task(
            task,
            task_type,
            resources,
            [NODE],
            SplitMode.FASTEST,
            Priority.OWNER,
            task_type.units(settings),
        )
    return result


def sample_submitted(workflow: Workflow, plans: dict[str, TaskPlan]) -> ev.Submitted:
    """The first event of the run."""
    return ev.Submitted(
        seq=1,
        time=at(0),
        run=RUN_ID,
        workflow=workflow,
        submitted_by="alice",
        owner="alice",
        priority=Priority.OWNER,
        group="demo",
        plans=plans,
    )


def sample_log(submitted: ev.Submitted) -> list[ev.Event]:
    """A whole successful run: 3 units (one reported twice), a merge, the command, the end."""
    running, done = TaskState.RUNNING, TaskState.DONE
    return [
        submitted,
        ev.EnvironmentResolved(seq=2, time=at(1), image=None),
        ev.Built(seq=3, time=at(2), image="registry:5000/simrun:1"),
        ev.WorkflowSubmitted(seq=4, time=at(3), name=f"simrun-{RUN_ID}"),
        ev.TaskStateChanged(seq=5, time=at(4), task="squares", state=running),
        ev.PodStarted(seq=6, time=at(5), task="squares", worker="squares-0", node="node-1"),
        ev.UnitDone(seq=7, time=at(6), task="squares", index=0, worker="squares-0", seconds=0.5),
        ev.UnitDone(seq=8, time=at(7), task="squares", index=2, worker="squares-0", seconds=0.5),
        ev.UnitDone(seq=9, time=at(8), task="squares", index=1, worker="squares-0", seconds=0.5),
        ev.UnitDone(seq=10, time=at(9), task="squares", index=1, worker="squares-1", seconds=0.7),
        ev.WorkerReport(
            seq=11,
            time=at(10),
            task="squares",
            worker="squares-0",
            processes=2,
            units_done=3,
            peak_memory_bytes=1_000_000,
        ),
        ev.PodSucceeded(seq=12, time=at(11), task="squares", worker="squares-0"),
        ev.Merged(seq=13, time=at(12), task="squares", worker="squares-0"),
        ev.TaskStateChanged(seq=14, time=at(13), task="squares", state=done),
        ev.TaskStateChanged(seq=15, time=at(14), task="plot", state=running),
        ev.PodStarted(seq=16, time=at(15), task="plot", worker="plot-0", node="node-1"),
        ev.PodSucceeded(seq=17, time=at(16), task="plot", worker="plot-0"),
        ev.TaskStateChanged(seq=18, time=at(17), task="plot", state=done),
        ev.LogsKept(seq=19, time=at(18), task="squares"),
        ev.LogsKept(seq=20, time=at(19), task="plot"),
        ev.Succeeded(seq=21, time=at(20), message="2 tasks done"),
    ]
