"""What every benchmark shares: sizes, rows of the table, statistics, interleaving, the machine."""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Size:
    """How big each benchmark runs: `full` for `benchmarks/run`, `smoke` for the test suite."""

    name: str
    reps: int
    warm_up: bool
    # local_overhead
    squares_units: int
    squares_sleep_s: float
    chain_tasks: int
    chain_sleep_s: float
    # ledger: sizes, units per timed window (simrun, rename) and the largest window
    ledger_sizes: tuple[int, ...]
    ledger_window: int
    rename_window: int
    # events
    append_single: int
    append_batches: int
    append_batch_size: int
    fold_events: int
    finished_units: int
    live_units: int
    get_samples: int
    # api
    posts: int
    sse_subscribers: int
    sse_units: int
    sse_sleep_s: float
    sse_hold_s: float
    load_runs: int  # runs submitted at once while `GET /me` is sampled
    load_units: int  # zero-work units of each
    # peers: rounds of squares and chain; zero-work sizes and their rounds; Snakemake's limits
    peers_reps: int
    peers_zero_units: tuple[int, ...]
    peers_zero_reps: tuple[int, ...]
    peers_snakemake_max_units: int
    peers_snakemake_reps: int
    peers_run: bool  # False: only whether each peer is installed (the test suite's size)
    # scale: zero-work units against the limit (reps of their own), one huge run
    scale_units: int
    scale_reps: int
    scale_huge_units: int
    # many_runs: live runs at once, units of each, units per second of each pod, trials
    many_runs: int
    many_units: int
    many_rate: float
    many_reps: int
    # cli: the commands timed against their baseline (each)
    cli_reps: int
    # clients: SSE subscribers of one live run, ones that never read, slow-header connections,
    # how long each phase holds them, units per second of the live run's pod
    clients_subscribers: int
    clients_silent: int
    clients_slow: int
    clients_hold_s: float
    clients_rate: float


FULL = Size(
    name="full",
    reps=5,
    warm_up=True,
    squares_units=200,
    squares_sleep_s=0.05,
    chain_tasks=5,
    chain_sleep_s=0.02,
    ledger_sizes=(1_000, 10_000, 100_000),
    ledger_window=3_000,
    rename_window=60,
    append_single=50,
    append_batches=20,
    append_batch_size=100,
    fold_events=1_000_000,
    finished_units=100_000,
    live_units=100_000,
    get_samples=20,
    posts=200,
    sse_subscribers=200,
    sse_units=40,
    sse_sleep_s=0.1,
    sse_hold_s=1.0,
    load_runs=50,
    load_units=200,
    peers_reps=3,
    peers_zero_units=(1_000, 20_000),
    peers_zero_reps=(3, 1),
    peers_snakemake_max_units=1_000,
    peers_snakemake_reps=1,
    peers_run=True,
    scale_units=20_000,
    scale_reps=3,
    scale_huge_units=1_000_000,
    many_runs=1_000,
    many_units=1_000,
    many_rate=2.0,  # 2,000 units/s in total at 1,000 runs; the first 880 of each written at once
    many_reps=1,
    cli_reps=21,
    clients_subscribers=2_000,
    clients_silent=300,
    clients_slow=1_000,
    clients_hold_s=20.0,
    clients_rate=20.0,
)

SMOKE = Size(
    name="smoke",
    reps=1,
    warm_up=False,
    squares_units=4,
    squares_sleep_s=0.01,
    chain_tasks=2,
    chain_sleep_s=0.0,
    ledger_sizes=(100, 400),
    ledger_window=40,
    rename_window=10,
    append_single=3,
    append_batches=2,
    append_batch_size=10,
    fold_events=2_000,
    finished_units=500,
    live_units=500,
    get_samples=3,
    posts=4,
    sse_subscribers=3,
    sse_units=2,
    sse_sleep_s=0.02,
    sse_hold_s=0.2,
    load_runs=2,
    load_units=4,
    peers_reps=1,
    peers_zero_units=(),
    peers_zero_reps=(),
    peers_snakemake_max_units=20,
    peers_snakemake_reps=1,
    peers_run=False,
    scale_units=50,
    scale_reps=1,
    scale_huge_units=300,
    many_runs=3,
    many_units=20,
    many_rate=50.0,
    many_reps=1,
    cli_reps=2,
    clients_subscribers=5,
    clients_silent=3,
    clients_slow=5,
    clients_hold_s=1.0,
    clients_rate=20.0,
)

SIZES = {size.name: size for size in (FULL, SMOKE)}


@dataclasses.dataclass
class Row:
    """One line of the table: a figure of simrun, its baseline, and the goal it is held to.

    `ratio` is always simrun / baseline. `met` is None for a figure without a goal. `gap` says,
    for a missed goal, what causes the gap and what would close it (RESULTS.md prints it).
    """

    key: str
    benchmark: str
    simrun: float | None
    baseline: float | None
    unit: str
    goal: str = "-"
    met: bool | None = None
    gap: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        """simrun / baseline, None without both."""
        if self.simrun is None or not self.baseline:
            return None
        return self.simrun / self.baseline


@dataclasses.dataclass
class Context:
    """What a benchmark gets: its size, a scratch directory of its own and a logger."""

    size: Size
    scratch: Path
    log: Callable[[str], None]


def median(values: Sequence[float]) -> float:
    """The median of at least one value."""
    return statistics.median(values)


def percentile(values: Sequence[float], share: float) -> float:
    """The value below which `share` (0..1) of the values lie (nearest rank)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = max(0, min(len(ordered) - 1, round(share * len(ordered) + 0.5) - 1))
    return ordered[rank]


def interleaved(
    reps: int, simrun: Callable[[int], T], baseline: Callable[[int], T]
) -> tuple[list[T], list[T]]:
    """Run `simrun(rep)` and `baseline(rep)` `reps` times each, alternating which goes first
    (ABBA...), so a drift of the machine spreads over both; their results in order."""
    ours: list[T] = []
    theirs: list[T] = []
    for rep in range(reps):
        if rep % 2 == 0:
            theirs.append(baseline(rep))
            ours.append(simrun(rep))
        else:
            ours.append(simrun(rep))
            theirs.append(baseline(rep))
    return ours, theirs


def timed(action: Callable[[], object]) -> float:
    """The wall seconds of `action()`."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def simrun_command() -> list[str]:
    """The `simrun` console script of this interpreter (not a shim in front of it)."""
    scripts = Path(sys.executable).parent
    script = scripts / "simrun"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "simrun_cli"]


def git_commit() -> str:
    """The commit of the working tree, `+dirty` when it has changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def memory_gib() -> float:
    """The memory of the machine in GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3


def file_system(path: Path) -> str:
    """The type and device of the file system `path` is on, from /proc/mounts."""
    path = path.resolve()
    best = ("?", "?", "")
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        device, mount, kind = parts[0], parts[1], parts[2]
        if (path == Path(mount) or Path(mount) in path.parents) and len(mount) >= len(best[2]):
            best = (kind, device, mount)
    return f"{best[0]} ({best[1]} on {best[2]})"


def load_average() -> str:
    """The load averages of 1, 5 and 15 minutes."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine spent busy since boot (/proc/stat: all but idle, iowait)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(value) for value in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    guest = sum(ticks[8:10]) if len(ticks) > 9 else 0  # already counted in user and nice
    return (sum(ticks) - idle - guest) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of its children that ended (services, commands)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def machine(scratch: Path) -> dict[str, str]:
    """The machine the figures were measured on."""
    return {
        "cores": f"{len(os.sched_getaffinity(0))} usable ({os.cpu_count()} online)",
        "memory": f"{memory_gib():.1f} GiB",
        "python": f"{platform.python_version()} ({sys.executable})",
        "commit": git_commit(),
        "system": f"{platform.system()} {platform.release()}",
        "scratch file system": file_system(scratch),
    }
