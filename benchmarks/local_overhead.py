"""local_overhead: what a local run costs beyond running the task's code by hand.

- `simrun submit --local --wait` of squares (`squares_units` units of `sleep_s`) with the local
  service already running, against `baselines/by_hand.py squares`: the same `compute_unit`
  calls in a plain `ProcessPoolExecutor` of as many processes as the service gives the task (the
  machine's cores), plus the same merge. Both walls include the start of their python.
- a chain of `chain_tasks` tasks, each reading the one before, of split tasks (squares of one
  unit of `chain_sleep_s`) and of `command` tasks (`sleep chain_sleep_s`), each through the API
  (`POST /runs`, `GET /runs/{run}/wait`) and through `simrun submit --local --wait`: the seconds
  per task beyond the work, against `by_hand.py chain` (each task in a pool of its own process,
  one after the other), with the timeline of the runs from their events (`benchmarks/chain.py`)
  in the note.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from benchmarks import chain as chains
from benchmarks.common import Context, Row, interleaved, median, simrun_command, timed
from benchmarks.service import ServiceFailed, environment, start_service, stop_service
from simrun_core.events import decode_event

BY_HAND = Path(__file__).resolve().parent / "baselines" / "by_hand.py"
RUN_LINE = re.compile(r"run (\d{8}-\d{6}-[0-9a-f]{6}): (\w+)")
WALL_GOAL = 1.03
CHAIN_GOAL_S = {"api": 0.03, "cli": 0.05}
"""Seconds per chained task beyond its work, through the API and through the CLI (issue 16)."""
WAYS = {
    "api": "the API (POST /runs, GET /runs/{run}/wait)",
    "cli": "`simrun submit --local --wait`",
}


def squares_workflow(units: int, sleep_s: float) -> dict:
    """One split squares task."""
    settings = {"n": units, "sleep_s": sleep_s}
    return {
        "name": "squares",
        "tasks": [{"id": "squares", "type": "demo.squares", "settings": settings}],
    }


def chain_workflow(tasks: int, sleep_s: float) -> dict:
    """`tasks` squares tasks of one unit each, each after the one before (its port `after`)."""
    return {**chains.chain_workflow("split", tasks, sleep_s), "name": "chain"}


def submit_wait(project: Path, workflow: Path) -> str:
    """`simrun submit --local --wait WORKFLOW` in the project; the id of the run that succeeded."""
    done = subprocess.run(
        [*simrun_command(), "submit", "--local", "--wait", str(workflow)],
        cwd=project,
        capture_output=True,
        text=True,
        env=environment(),
        timeout=600,
    )
    found = RUN_LINE.findall(done.stdout)
    if done.returncode != 0 or not found or found[-1][1] != "succeeded":
        raise ServiceFailed(
            f"simrun submit {workflow.name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return found[-1][0]


def run_seconds(project: Path, run_id: str) -> float:
    """The seconds of a run inside the service: from its first event to its last."""
    lines = (project / ".simrun" / "store" / "runs" / run_id / "events.jsonl").read_bytes()
    events = lines.splitlines()
    first, last = decode_event(events[0]), decode_event(events[-1])
    return (last.time - first.time).total_seconds()


def by_hand(args: list[str], out: Path) -> None:
    """Run the by-hand baseline in a fresh python writing below `out` (a new directory each
    time, so no removal is timed); raise if it fails."""
    subprocess.run(
        [sys.executable, str(BY_HAND), args[0], str(out), *args[1:]],
        check=True,
        capture_output=True,
        timeout=600,
    )


def run(ctx: Context) -> list[Row]:
    """Measure the squares run and the chain; the rows of the table."""
    size = ctx.size
    project = ctx.scratch / "project"
    project.mkdir(parents=True)
    squares = project / "squares.yaml"
    squares.write_text(yaml.safe_dump(squares_workflow(size.squares_units, size.squares_sleep_s)))
    workflows = {
        kind: chains.chain_workflow(kind, size.chain_tasks, size.chain_sleep_s)
        for kind in chains.KINDS
    }
    files = {kind: project / f"chain-{kind}.yaml" for kind in chains.KINDS}
    for kind, workflow in workflows.items():
        files[kind].write_text(yaml.safe_dump(workflow))
    processes = len(os.sched_getaffinity(0))
    outs = (ctx.scratch / "by-hand" / str(number) for number in itertools.count())
    squares_args = ["squares", str(size.squares_units), str(size.squares_sleep_s), str(processes)]
    chain_args = ["chain", str(size.chain_tasks), str(size.chain_sleep_s)]

    service = start_service(project)
    runs: dict[str, list[str]] = {"squares": []}
    walls: dict[tuple[str, str], list[float]] = {}

    def simrun(workflow: Path, kind: str) -> float:
        started = time.perf_counter()
        runs[kind].append(submit_wait(project, workflow))
        return time.perf_counter() - started

    def chain_round(rep: int) -> None:
        """Each chain once through each way, in an order that turns with `rep`."""
        ways = [(kind, way) for kind in chains.KINDS for way in WAYS]
        for kind, way in ways if rep % 2 == 0 else ways[::-1]:
            if way == "api":
                wall, run_id = chains.api_chain(service, workflows[kind])
            else:
                started = time.perf_counter()
                run_id = submit_wait(project, files[kind])
                wall = time.perf_counter() - started
            walls.setdefault((kind, way), []).append(wall)
            runs.setdefault(f"chain.{kind}.{way}", []).append(run_id)

    try:
        if size.warm_up:  # both sides once: imports in the page cache, the service's first run
            submit_wait(project, files["split"])
            by_hand(chain_args, next(outs))
        ctx.log(
            f"squares: {size.squares_units} units of {size.squares_sleep_s} s, {size.reps} reps"
        )
        squares_walls, limits = interleaved(
            size.reps,
            lambda rep: simrun(squares, "squares"),
            lambda rep: timed(lambda: by_hand(squares_args, next(outs))),
        )
        ctx.log(f"chains: {size.chain_tasks} tasks of one unit, {size.reps} reps")
        _, chain_limits = interleaved(
            size.reps,
            chain_round,
            lambda rep: timed(lambda: by_hand(chain_args, next(outs))),
        )
    finally:
        stop_service(service)
    inside = {
        kind: median([run_seconds(project, run) for run in ids]) for kind, ids in runs.items()
    }
    ctx.log(
        f"squares {median(squares_walls):.3f} s (in the service {inside['squares']:.3f} s), limit "
        f"{median(limits):.3f} s; chains by hand {median(chain_limits):.3f} s"
    )
    work = size.chain_tasks * size.chain_sleep_s
    per_task_limit = median([(wall - work) / size.chain_tasks for wall in chain_limits])
    chain_rows = []
    for (kind, way), found in walls.items():
        per_task = median([(wall - work) / size.chain_tasks for wall in found])
        store = project / ".simrun" / "store"
        timelines = chains.describe(
            chains.timeline(store, run) for run in runs[f"chain.{kind}.{way}"]
        )
        ctx.log(f"chain of {kind} tasks through {way}: {per_task:.3f} s per task; {timelines}")
        goal = CHAIN_GOAL_S[way]
        chain_rows.append(
            Row(
                key=f"local_overhead.chain.{kind}.{way}",
                benchmark=(
                    f"local_overhead: chain of {size.chain_tasks} one-unit {kind} tasks through "
                    f"{way}, seconds per task beyond the work"
                ),
                simrun=per_task,
                baseline=per_task_limit,
                unit="s",
                goal=f"<= {goal:g} s",
                met=per_task <= goal,
                note=(
                    f"(wall - work) / tasks through {WAYS[way]}; baseline: each task in a "
                    "ProcessPoolExecutor(1) of its own, one after the other, in one fresh "
                    f"python. Timeline (medians, ms, from the runs' events): {timelines}. "
                    "Reference anchor: (4.8 s - 4.6 s) / 3 tasks = 0.067 s"
                ),
            )
        )
    ratio = median(squares_walls) / median(limits)
    return [
        Row(
            key="local_overhead.squares",
            benchmark=(
                f"local_overhead: squares {size.squares_units} units x "
                f"{size.squares_sleep_s:g} s, wall of `submit --local --wait`"
            ),
            simrun=median(squares_walls),
            baseline=median(limits),
            unit="s",
            goal=f"ratio <= {WALL_GOAL:.2f}",
            met=ratio <= WALL_GOAL,
            note=(
                f"baseline: the same compute_unit calls in a ProcessPoolExecutor({processes}) "
                "plus the merge, one fresh python; both walls include the start of python. "
                f"The run itself (first to last event) took {inside['squares']:.3f} s"
            ),
        ),
        *chain_rows,
    ]
