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

from benchmarks import chain as chains
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
PROBE_UNITS = 2_000
"""The units of the disk probe before each rep (see `disk_probe`)."""


@dataclasses.dataclass(frozen=True)
class _Rep:
    """One rep of the units: simrun's wall and its phases (ms, see `_simrun_rep`), the limit's
    wall and the disk probe made just before simrun's (us a unit)."""

    wall: float
    limit: float
    phases: dict[str, float]
    probe_us: float

    def describe(self) -> str:
        phases = ", ".join(f"{name} {ms:.0f}" for name, ms in self.phases.items())
        return (
            f"simrun {self.wall:.2f} s ({phases} ms), limit {self.limit:.2f} s, "
            f"disk probe {self.probe_us:.0f} us a unit"
        )


def disk_probe(directory: Path, units: int) -> float:
    """The microseconds a unit's changes of the file system take here now, on average over
    `units`: what simrun's harness makes a unit (an exclusive link for its claim, its file
    written under a temporary name and renamed, a link for its completion) with no Python
    beyond the calls. The disk of this machine varies, and the units row is paid in them."""
    directory.mkdir(parents=True)
    (directory / "claim").mkdir()
    (directory / "done").mkdir()
    started = time.perf_counter()
    for index in range(units):
        os.symlink("worker", f"{directory}/claim/{index}.0")
        temporary = f"{directory}/{index}.json.tmp"
        with open(temporary, "w") as file:
            file.write('{"unit": 0}')
        os.rename(temporary, f"{directory}/{index}.json")
        os.symlink("worker", f"{directory}/done/{index}")
    return (time.perf_counter() - started) / units * 1e6


def _simrun_rep(project: Path, workflow: Path) -> tuple[float, dict[str, float]]:
    """`submit --local --wait` of the units; its wall and where it went (ms) from the command's
    clock and the run's events: the command until `submitted`, then until the harness took
    the task, until its first unit, over the units, from the last unit to the run's last
    event, and from it to the command's exit."""
    began = time.time()
    clock = time.perf_counter()
    run_id = submit_wait(project, workflow)
    wall = time.perf_counter() - clock
    line = chains.timeline(project / ".simrun" / "store", run_id)
    start_to_unit = line.start_to_first_unit[0] if line.start_to_first_unit else 0.0
    to_end = line.last_unit_to_end[0] if line.last_unit_to_end else 0.0
    after_units = to_end + line.end_to_pod_done[0] + line.last_pod_to_run_end
    phases = {
        "command": (line.submitted_at.timestamp() - began) * 1000,
        "harness": line.submitted_to_first_start,
        "first unit": start_to_unit,
        "units": line.run_ms - line.submitted_to_first_start - start_to_unit - after_units,
        "end": after_units,
        "exit": (began + wall - line.ended_at.timestamp()) * 1000,
    }
    return wall, phases


def run(ctx: Context) -> list[Row]:
    """Measure the zero-work units against the limit, then the huge run; the rows."""
    size = ctx.size
    project = ctx.scratch / "project"
    project.mkdir(parents=True)
    units = project / "units.yaml"
    units.write_text(yaml.safe_dump(squares_workflow(size.scale_units, 0.0)))
    processes = len(os.sched_getaffinity(0))
    outs = (ctx.scratch / "by-hand" / str(number) for number in itertools.count())
    probes = (ctx.scratch / "probe" / str(number) for number in itertools.count())
    args = ["squares", str(size.scale_units), "0", str(processes)]
    service = start_service(project)
    try:
        if size.warm_up:
            submit_wait(project, units)
            by_hand(args, next(outs))
        ctx.log(f"units: {size.scale_units} zero-work units, {size.scale_reps} reps")
        ours, limits = interleaved(
            size.scale_reps,
            lambda rep: (disk_probe(next(probes), PROBE_UNITS), *_simrun_rep(project, units)),
            lambda rep: timed(lambda: by_hand(args, next(outs))),
        )
        reps = [
            _Rep(wall, limit, phases, probe)
            for (probe, wall, phases), limit in zip(ours, limits, strict=True)
        ]
        for number, rep in enumerate(reps):
            ctx.log(f"units: rep {number}: {rep.describe()}")
        walls = [rep.wall for rep in reps]
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
                "one fresh python; both walls include the start of python. Each rep: "
                + "; ".join(rep.describe() for rep in reps)
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
