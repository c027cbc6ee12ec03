"""chain: where the time of a chain of one-unit tasks goes, from the run's own event timestamps.

    python -m benchmarks.chain [--reps N] [--tasks N] [--sleep S] [--root DIR]

starts a local service (`simrun serve --local`) in a scratch project and runs a chain of
`tasks` tasks, each reading the one before, through the API (`POST /runs`, then
`GET /runs/{run}/wait`) and through the CLI (`simrun submit --local --wait`), for split tasks
(demo.squares with one unit of `sleep` s) and for `command` tasks (`sleep S`). It prints the
wall per task beyond the work and the timeline of each chain: from the run log
(`runs/<run>/events.jsonl`: submitted, pod-started, pod-succeeded, succeeded) and the harness
logs (`tasks/<task>/events/*.jsonl`: the first unit-started, the last unit done), the medians
of submitted -> first task start, task start -> first unit, last unit -> task end (its
report), task end -> its pod-succeeded, task end -> next task start and last pod-succeeded ->
run succeeded (see `Timeline`). `local_overhead` makes the table's rows of
the same functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import yaml

from benchmarks.common import median
from benchmarks.service import BenchService, start_service, stop_service
from simrun_core import events as ev
from simrun_core.store import iter_log

KINDS = ("split", "command")
DONE = tuple(getattr(ev, name) for name in ("UnitDone", "UnitsDone") if hasattr(ev, name))
"""The events of a harness log that say units are done (one per unit, or a batch of them)."""


def chain_workflow(kind: str, tasks: int, sleep_s: float) -> dict:
    """`tasks` tasks, each after the one before (its port `after`): split tasks (demo.squares
    of one unit sleeping `sleep_s`) or `command` tasks (`sleep SLEEP_S`)."""
    chain = []
    for number in range(1, tasks + 1):
        task: dict
        if kind == "split":
            task = {"id": f"t{number}", "type": "demo.squares"}
            task["settings"] = {"n": 1, "sleep_s": sleep_s}
            output = "squares"
        elif kind == "command":
            args = ["sleep", f"{sleep_s:g}"] if sleep_s else ["true"]
            settings = {"image": "none", "args": args, "cores": 1, "memory_gb": 0.5}
            task = {"id": f"t{number}", "type": "command", "settings": settings}
            output = "out"
        else:
            raise ValueError(f"no chain of {kind!r} tasks: {' or '.join(KINDS)}")
        if number > 1:
            task["inputs"] = {"after": f"t{number - 1}.{output}"}
        chain.append(task)
    return {"name": f"chain-{kind}", "tasks": chain}


def api_chain(service: BenchService, workflow: dict) -> tuple[float, str]:
    """Submit a workflow through the API and wait for its end: the wall seconds and the run id
    (raises unless it succeeded)."""
    started = time.perf_counter()
    record = service.submit(workflow)
    summary = service.wait(record["id"])
    wall = time.perf_counter() - started
    if summary["state"] != "succeeded":
        raise RuntimeError(f"run {record['id']} ended {summary['state']}")
    return wall, str(record["id"])


@dataclasses.dataclass(frozen=True)
class Timeline:
    """The milliseconds of the phases of one chain, each a list over its tasks. A task starts
    when its harness took it up (the `started` of its report: its order, for a spare; its
    pod-started for a `command` task) and ends with its report (its pod-succeeded without one);
    units are the harness's own unit-started and units-done. `submitted_at` and `ended_at` are
    the times of the run's first and last events."""

    submitted_to_first_start: float
    start_to_first_unit: list[float]
    last_unit_to_end: list[float]
    end_to_pod_done: list[float]
    end_to_next_start: list[float]
    last_pod_to_run_end: float
    submitted_at: datetime
    ended_at: datetime

    @property
    def run_ms(self) -> float:
        """The run from its first event to its last."""
        return _ms(self.submitted_at, self.ended_at)


def timeline(store: Path, run_id: str) -> Timeline:
    """The timeline of a finished chain run of `store`."""
    run_dir = store / "runs" / run_id
    started: dict[str, datetime] = {}
    ended: dict[str, datetime] = {}
    done: dict[str, datetime] = {}
    order: list[str] = []
    first = end = None
    for _, event in iter_log(run_dir / "events.jsonl"):
        first = first or event.time
        end = event.time
        if isinstance(event, ev.PodStarted) and event.task not in order:
            order.append(event.task)
            started[event.task] = event.time
        elif isinstance(event, ev.WorkerReport):
            ended[event.task] = event.time
            if event.started is not None:
                started[event.task] = datetime.fromtimestamp(event.started, tz=event.time.tzinfo)
        elif isinstance(event, ev.PodSucceeded):
            done[event.task] = event.time
    assert first is not None and end is not None and order
    for task in order:
        ended.setdefault(task, done[task])
    start_to_unit, unit_to_end, end_to_done, end_to_next = [], [], [], []
    for number, task in enumerate(order):
        first_unit, last_unit = _unit_times(run_dir / "tasks" / task / "events")
        if first_unit is not None and last_unit is not None:
            start_to_unit.append(_ms(started[task], first_unit))
            unit_to_end.append(_ms(last_unit, ended[task]))
        end_to_done.append(_ms(ended[task], done[task]))
        if number + 1 < len(order):
            end_to_next.append(_ms(ended[task], started[order[number + 1]]))
    return Timeline(
        submitted_to_first_start=_ms(first, started[order[0]]),
        start_to_first_unit=start_to_unit,
        last_unit_to_end=unit_to_end,
        end_to_pod_done=end_to_done,
        end_to_next_start=end_to_next,
        last_pod_to_run_end=_ms(done[order[-1]], end),
        submitted_at=first,
        ended_at=end,
    )


def _unit_times(events: Path) -> tuple[datetime | None, datetime | None]:
    """The first unit-started and the last unit done of a task's harness logs."""
    first = last = None
    for path in sorted(events.glob("*.jsonl")):
        for _, event in iter_log(path):
            if isinstance(event, ev.UnitStarted) and (first is None or event.time < first):
                first = event.time
            elif isinstance(event, DONE) and (last is None or event.time > last):
                last = event.time
    return first, last


def _ms(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds() * 1000


def describe(timelines: Iterable[Timeline]) -> str:
    """The medians of the phases over chains (per task where a phase is one), milliseconds."""
    found = list(timelines)

    def per_task(values: list[list[float]]) -> str:
        flat = [value for chain in values for value in chain]
        return f"{median(flat):.1f}" if flat else "-"

    return (
        f"submitted->start {median([t.submitted_to_first_start for t in found]):.1f}, "
        f"start->unit {per_task([t.start_to_first_unit for t in found])}, "
        f"unit->end {per_task([t.last_unit_to_end for t in found])}, "
        f"end->pod done {per_task([t.end_to_pod_done for t in found])}, "
        f"end->next start {per_task([t.end_to_next_start for t in found])}, "
        f"last pod->run end {median([t.last_pod_to_run_end for t in found]):.1f}, "
        f"run {median([t.run_ms for t in found]):.1f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the chains and print their walls and timelines."""
    from benchmarks.local_overhead import submit_wait

    parser = argparse.ArgumentParser(prog="python -m benchmarks.chain", description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--sleep", type=float, default=0.02)
    parser.add_argument("--root", type=Path, default=None)
    options = parser.parse_args(argv)
    root = options.root or Path(tempfile.mkdtemp(prefix="simrun-chain-"))
    project = root / "project"
    service = start_service(project)
    work = options.tasks * options.sleep
    try:
        for kind in KINDS:
            workflow = chain_workflow(kind, options.tasks, options.sleep)
            path = project / f"chain-{kind}.yaml"
            path.write_text(yaml.safe_dump(workflow))
            api_chain(service, workflow)  # warm up
            results: dict[str, list[tuple[float, str]]] = {"api": [], "cli": []}
            for _ in range(options.reps):
                results["api"].append(api_chain(service, workflow))
                started = time.perf_counter()
                run_id = submit_wait(project, path)
                results["cli"].append((time.perf_counter() - started, run_id))
            for way, done in results.items():
                per_task = median([(wall - work) / options.tasks for wall, _ in done])
                lines = [timeline(service.store, run_id) for _, run_id in done]
                print(
                    f"{kind:7} {way}: {per_task * 1000:.1f} ms per task beyond the work "
                    f"(wall {median([wall for wall, _ in done]):.3f} s); {describe(lines)}",
                    flush=True,
                )
    finally:
        stop_service(service)
    return 0


if __name__ == "__main__":
    sys.exit(main())
