"""Whole runs on the fake cluster: a Supervisor with the Argo backend, the generated Workflow
run by the emulated Argo, Kueue and kubelet, the pods running the real harness of this
checkout (`simrun-worker`) with the store claim mapped to the service's own store.

So the run's log is what the service made of the watch events, and its outputs are what the
harness wrote, compared with the local mode's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import yaml
from cluster_runs import HARNESS_ENV, Service, kinds, submitted
from fake.cluster import FakeCluster, NodeSpec
from unit_events import done_indices

from simrun_core import events as ev
from simrun_core.store import RunPaths
from simrun_core.workflow import Priority, TaskSpec, Workflow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RUN_ID = "20260101-000000-0c1a57"
TIMEOUT_S = 60.0
NODES = [NodeSpec("node-1", cores=4, memory_gb=8.0)]


async def run_to_the_end(cluster: FakeCluster, workflow: Workflow, db: Path) -> list[ev.Event]:
    """Submit `workflow` to a Supervisor on the Argo backend of `cluster`; its log once ended."""
    async with Service(cluster, db) as service:
        await service.submit(*submitted(RUN_ID, workflow, cluster.nodes, Priority.STANDARD))
        await service.until(
            lambda: service.supervisor.load(RUN_ID).ended, "the run's end", TIMEOUT_S
        )
        return service.log(RUN_ID)


def in_order(seen: list[str], expected: list[str]) -> bool:
    """Whether `expected` is a subsequence of `seen`."""
    rest = iter(seen)
    return all(kind in rest for kind in expected)


def test_squares_runs_to_succeeded_with_the_local_summary(tmp_path: Path) -> None:
    workflow = msgspec.convert(yaml.safe_load((EXAMPLES / "squares.yaml").read_text()), Workflow)
    with FakeCluster(tmp_path, nodes=NODES, env_overrides=HARNESS_ENV) as cluster:
        events = asyncio.run(run_to_the_end(cluster, workflow, tmp_path / "db.sqlite"))
        assert cluster.errors == []
    seen = kinds(events)
    assert seen[-1] == "succeeded", seen
    assert in_order(
        seen,
        [
            "submitted",
            "workflow-submitted",
            "pod-admitted",
            "pod-started",
            "units-done",
            "succeeded",
        ],
    ), seen
    n = workflow.tasks[0].settings["n"]
    assert sorted(done_indices(events)) == list(range(n))
    summary = RunPaths(cluster.store_dir, RUN_ID).out("squares") / "summary.json"
    expected: dict[str, Any] = {"n": n, "sum": sum(i * i for i in range(n))}
    assert msgspec.json.decode(summary.read_bytes()) == expected
    assert summary.read_text() == f'{{"n": {n}, "sum": {expected["sum"]}}}'  # as in local mode


TOTAL = (
    "import json, pathlib, sys\n"
    "*inputs, out = sys.argv[1:]\n"
    "sums = dict()\n"
    "for port_path in inputs:\n"
    "    port, path = port_path.split('=', 1)\n"
    "    files = pathlib.Path(path).glob('*.json')\n"
    "    sums[port] = sum(json.loads(f.read_text())['square'] for f in files)\n"
    "pathlib.Path(out).mkdir(parents=True, exist_ok=True)\n"
    "(pathlib.Path(out) / 'total.json').write_text(json.dumps(sums, sort_keys=True))\n"
)


def test_two_split_tasks_and_a_command_reading_both_succeed(tmp_path: Path) -> None:
    """Two squares tasks of a coordinator and an extra worker each on two nodes of 2 cores
    (the quota admits two pods at a time), then a command task summing both outputs."""
    sizes = {"a": 300, "b": 200}
    total = {
        "image": "python:3.11",
        "args": ["python", "-c", TOTAL, "{input}", "{out}"],
        "cores": 1,
        "memory_gb": 0.25,
    }
    workflow = Workflow(
        name="two-and-total",
        tasks=[
            *(
                TaskSpec(id=task, type="demo.squares", settings={"n": n, "sleep_s": 0.01})
                for task, n in sizes.items()
            ),
            TaskSpec(
                id="total",
                type="command",
                settings=total,
                inputs={"a": "a.squares", "b": "b.squares"},
            ),
        ],
    )
    nodes = [NodeSpec(f"node-{i}", cores=2, memory_gb=4.0) for i in (1, 2)]
    with FakeCluster(tmp_path, nodes=nodes, env_overrides=HARNESS_ENV) as cluster:
        events = asyncio.run(run_to_the_end(cluster, workflow, tmp_path / "db.sqlite"))
        assert cluster.errors == []
    seen = kinds(events)
    assert seen[-1] == "succeeded", seen
    paths = RunPaths(cluster.store_dir, RUN_ID)
    started = {(e.task, e.worker) for e in events if isinstance(e, ev.PodStarted)}
    assert {("a", "w0"), ("b", "w0"), ("total", "total")} <= started, started
    for task, n in sizes.items():
        done = set(done_indices(events, task))
        assert done == set(range(n))
        summary = msgspec.json.decode((paths.out(task) / "summary.json").read_bytes())
        assert summary == {"n": n, "sum": sum(i * i for i in range(n))}
    result = msgspec.json.decode((paths.out("total") / "total.json").read_bytes())
    assert result == {task: sum(i * i for i in range(n)) for task, n in sizes.items()}
