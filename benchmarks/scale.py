"""scale: throughput of many zero-work units, and one run of a very large number of them.

- units: `simrun submit --local --wait` of one squares task of `scale_units` units of no work,
  with the local service running, against `baselines/by_hand.py squares`: the same
  `compute_unit` calls in a `ProcessPoolExecutor` of as many processes, in a fresh python.
  Every unit is a claim, a completion in the ledger, the events of the harness, their copy
  into the run log and the CLI's fold of the streamed events: what is paid per unit.
- huge: one run of `scale_huge_units` zero-work units submitted to the service (`POST /runs`,
  then `GET /runs/{run}/wait`): the growth of the service's resident memory over the run (its
  RSS at the end minus before the submission), the lines of the run's log against its units,
  and the seconds `fold()` takes over that log. Held to: at most `LINES_SHARE_GOAL` lines a
  unit (the harness writes completed units in batches, `units-done`) and at most
  `RSS_PER_UNIT_GOAL` bytes of service memory a unit (a bit a unit in the fold, nothing a unit
  elsewhere).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from pathlib import Path

import yaml

from benchmarks.common import Context, Row, interleaved, median, timed
from benchmarks.local_overhead import by_hand, squares_workflow, submit_wait
from benchmarks.service import BenchService, ServiceFailed, start_service, stop_service
from simrun_core.fold import fold
from simrun_core.store import iter_log

WALL_GOAL = 1.15
LINES_SHARE_GOAL = 0.5
"""At least two units a line on average: what writing completed units without waiting gives
on 2 cores (a batch is what completed while the worker was busy, bounded by the units in
flight: `IN_FLIGHT_PER_PROCESS` calls of the pool a process)."""
RSS_PER_UNIT_GOAL = 64.0


def run(ctx: Context) -> list[Row]:
    """Measure the zero-work units against the limit, then the huge run; the rows."""
    size = ctx.size
    project = ctx.scratch / "project"
    project.mkdir(parents=True)
    units = project / "units.yaml"
    units.write_text(yaml.safe_dump(squares_workflow(size.scale_units, 0.0)))
    processes = len(os.sched_getaffinity(0))
    outs = (ctx.scratch / "by-hand" / str(number) for number in itertools.count())
    args = ["squares", str(size.scale_units), "0", str(processes)]
    service = start_service(project)
    try:
        if size.warm_up:
            submit_wait(project, units)
            by_hand(args, next(outs))
        ctx.log(f"units: {size.scale_units} zero-work units, {size.scale_reps} reps")
        walls, limits = interleaved(
            size.scale_reps,
            lambda rep: timed(lambda: submit_wait(project, units)),
            lambda rep: timed(lambda: by_hand(args, next(outs))),
        )
        ctx.log(f"units: simrun {median(walls):.3f} s, limit {median(limits):.3f} s")
        huge = _huge_run(service, size.scale_huge_units, ctx)
    finally:
        stop_service(service)
    ratio = median(walls) / median(limits)
    rss_per_unit = huge.rss_growth / size.scale_huge_units
    share = huge.lines / size.scale_huge_units
    return [
        Row(
            key="scale.units",
            benchmark=(
                f"scale: {size.scale_units} zero-work units, wall of `submit --local --wait`"
            ),
            simrun=median(walls),
            baseline=median(limits),
            unit="s",
            goal=f"ratio <= {WALL_GOAL:.2f}",
            met=ratio <= WALL_GOAL,
            note=(
                f"baseline: the same compute_unit calls in a ProcessPoolExecutor({processes}), "
                "one fresh python; both walls include the start of python"
            ),
        ),
        Row(
            key="scale.huge_lines",
            benchmark=f"scale: one run of {size.scale_huge_units} zero-work units, log lines",
            simrun=float(huge.lines),
            baseline=float(size.scale_huge_units),
            unit="lines",
            goal=f"ratio <= {LINES_SHARE_GOAL:g}",
            met=share <= LINES_SHARE_GOAL,
            gap=(
                ""
                if share <= LINES_SHARE_GOAL
                else "a batch holds what completed while the worker was busy, at most about "
                "the units in flight (2 calls of the pool a process): more in flight, or a "
                "short wait for more before writing, would make batches bigger"
            ),
            note=(
                f"baseline: one line per unit. The run took {huge.seconds:.1f} s; its log "
                f"({huge.log_bytes / 1e6:.1f} MB) folds in {huge.fold_seconds:.3f} s"
            ),
        ),
        Row(
            key="scale.huge_rss",
            benchmark=(
                f"scale: one run of {size.scale_huge_units} zero-work units, service RSS "
                "growth per unit"
            ),
            simrun=rss_per_unit,
            baseline=None,
            unit="B/unit",
            goal=f"<= {RSS_PER_UNIT_GOAL:g} B/unit",
            met=rss_per_unit <= RSS_PER_UNIT_GOAL,
            note=(
                f"VmRSS of the service after the run minus before it: "
                f"{huge.rss_growth / 2**20:.1f} MiB; peak (VmHWM) growth "
                f"{huge.peak_growth / 2**20:.1f} MiB"
            ),
        ),
    ]


@dataclasses.dataclass(frozen=True)
class _Huge:
    """What the huge run measured: its wall, its log (lines, bytes, fold seconds) and the
    growth of the service's memory (now and peak) over it."""

    seconds: float
    lines: int
    log_bytes: int
    fold_seconds: float
    rss_growth: int
    peak_growth: int


def _huge_run(service: BenchService, units: int, ctx: Context) -> _Huge:
    """Submit one run of `units` zero-work units, wait for it and measure it."""
    ctx.log(f"huge: one run of {units} zero-work units")
    rss_before, peak_before = service.rss_bytes(), service.peak_rss_bytes()
    started = time.perf_counter()
    record = service.submit(squares_workflow(units, 0.0))
    summary = service.wait(record["id"], timeout=3600.0)
    seconds = time.perf_counter() - started
    if summary["state"] != "succeeded":
        raise ServiceFailed(f"the run of {units} units ended {summary['state']}")
    rss_growth = service.rss_bytes() - rss_before
    peak_growth = service.peak_rss_bytes() - peak_before
    path: Path = service.events_path(record["id"])
    with open(path, "rb") as file:
        lines = sum(1 for _ in file)
    fold_seconds = median([timed(lambda: fold(e for _, e in iter_log(path))) for _ in range(3)])
    ctx.log(
        f"huge: {seconds:.1f} s, {lines} lines, fold {fold_seconds:.3f} s, "
        f"RSS +{rss_growth / 2**20:.1f} MiB (peak +{peak_growth / 2**20:.1f} MiB)"
    )
    return _Huge(seconds, lines, path.stat().st_size, fold_seconds, rss_growth, peak_growth)
