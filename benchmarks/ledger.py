"""ledger: zero-work units claimed and completed per second, simrun's ledger against renames.

Each trial forks 1 or 2 worker processes; each claims the units of a small ledger of its own
first (so the copy-on-write faults after the fork are not timed), builds its ledger object,
waits at a barrier, then claims and completes units (`claim` + `complete`, no work) in a
bounded loop. The throughput of a trial is its units over the span from the first start to the
last end. Before each trial the file systems are synced (so a short trial does not pay for the
write-back of the trials before it); the repetitions of the sizes are interleaved as well.

A control: before each trial of simrun's ledger, the time of an exclusive create of an entry
as the ledger makes them (a link naming a worker) in the `claim/` shard directory of the trial's
window (`create_latency_ms`). On a virtual disk it differs from one directory to another by up
to 30 times (where ext4 put the directory's inodes), and simrun's ledger costs about two creates
per unit (a claim and a done, each in the shard of 1,000 units of its index), so the control
tells a slow directory from a slow ledger.

simrun (`simrun_harness.ledger.Ledger`, exclusive creates): fresh ledgers of `n` units, as
many as the trials need; each trial takes a window of units no worker claimed before, of the
same size at every `n` (the smallest `n` at most), so every size pays the same write-back of
its creates and only the size of the ledger differs. A worker's cursor starts at
`crc32(worker) % n`, so the ids of the workers are picked to start at the window (two workers
at its two halves, as workers of different ids spread over a ledger).

rename (`baselines/rename_ledger.py`): a ledger of `n` units with the upper half pending and
the lower half done, the middle of a run (a claim lists `pending/`, so its cost falls as the
run goes on; the middle costs the average). Each trial claims a window of the lowest pending
units, which are put back to pending afterwards, so every trial starts from the same state.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import queue
import time
import zlib
from pathlib import Path
from typing import Any

from benchmarks.baselines import rename_ledger
from benchmarks.common import Context, Row, median
from simrun_harness.ledger import SHARD_UNITS, Ledger

THROUGHPUT_GOAL = 5_000.0
SCALING_GOAL = 1.5
RENAME_FACTOR_GOAL = 10.0
WORKER_COUNTS = (1, 2)
WARM_UNITS = 20
TRIAL_TIMEOUT_S = 300.0
PROBE_FILES = 200


def worker_id_at(n_units: int, start: int, taken: set[str]) -> str:
    """A worker id whose cursor in simrun's ledger of `n_units` starts at unit `start`."""
    for number in itertools.count():
        worker = f"bench-{number}"
        if zlib.crc32(worker.encode()) % n_units == start and worker not in taken:
            taken.add(worker)
            return worker
    raise AssertionError("unreachable")


def _work(
    kind: str,
    root: str,
    n_units: int,
    worker: str,
    limit: int,
    barrier: Any,
    results: Any,
) -> None:
    """In a worker process: claim and complete up to `limit` units after the barrier.

    Before the barrier it claims a few units of a small ledger of its own, so the first touches
    of memory shared with the parent after the fork (copy on write) are not timed.
    """
    warm = _ledger(kind, Path(root).parent / f"warm-{kind}-{worker}", WARM_UNITS)
    while (index := warm.claim(worker)) is not None:
        warm.complete(index, worker)
    ledger = _ledger(kind, Path(root), n_units)
    claimed = []
    barrier.wait()
    started = _clock()
    for _ in range(limit):
        index = ledger.claim(worker)
        if index is None:
            break
        ledger.complete(index, worker)
        claimed.append(index)
    ended = _clock()
    results.put((started, ended, claimed))


def _ledger(kind: str, root: Path, n_units: int) -> Any:
    if kind == "simrun":
        return Ledger(root, n_units)
    return rename_ledger.Ledger(root, n_units)


def _clock() -> float:
    """CLOCK_MONOTONIC: one clock for every process of the machine."""
    return time.monotonic()


def trial(
    kind: str, root: Path, n_units: int, workers: list[tuple[str, int]]
) -> tuple[float, list[int]]:
    """Run the workers (id, limit) of one trial in processes; units/s and the units claimed.

    The file systems are synced first, so the journal of the trials before (and of the
    preparation) is not written back during this one.
    """
    os.sync()
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(workers))
    results = context.Queue()
    processes = [
        context.Process(
            target=_work, args=(kind, str(root), n_units, worker, limit, barrier, results)
        )
        for worker, limit in workers
    ]
    for process in processes:
        process.start()
    outcomes = []
    deadline = time.monotonic() + TRIAL_TIMEOUT_S
    try:
        while len(outcomes) < len(processes):
            try:
                outcomes.append(results.get(timeout=1.0))
            except queue.Empty:
                failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    raise RuntimeError(f"a {kind} ledger worker failed ({failed})") from None
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
    claimed = sorted(index for _, _, indices in outcomes for index in indices)
    span = max(end for _, end, _ in outcomes) - min(start for start, _, _ in outcomes)
    return len(claimed) / span, claimed


def create_latency_ms(directory: Path, count: int = PROBE_FILES) -> float:
    """Milliseconds per exclusive create of an entry in `directory` as the ledger makes them,
    a link naming a worker (a control of the file system: entries named so no ledger reads
    them, removed again). The directory is made when it does not exist."""
    directory.mkdir(parents=True, exist_ok=True)
    names = [str(directory / f".probe-{number}") for number in range(count)]
    started = time.perf_counter()
    for name in names:
        os.symlink("bench-probe", name)
    elapsed = time.perf_counter() - started
    for name in names:
        os.unlink(name)
    return elapsed * 1000 / count


def prepare_rename(root: Path, n_units: int) -> rename_ledger.Ledger:
    """A rename ledger in the middle of its run: the lower half done, the upper half pending."""
    for name in ("pending", "claimed", "done"):
        (root / name).mkdir(parents=True)
    half = n_units // 2
    for index in range(half):
        (root / "done" / str(index)).touch()
    for index in range(half, n_units):
        (root / "pending" / str(index)).touch()
    return rename_ledger.Ledger(root, n_units)


def restore_rename(root: Path, claimed: list[int]) -> None:
    """Put the units a trial completed back to pending."""
    for index in claimed:
        os.rename(root / "done" / str(index), root / "pending" / str(index))


class SizeTrials:
    """The two ledgers of one size and their trials (see the module)."""

    def __init__(self, ctx: Context, n_units: int, window: int) -> None:
        reps = ctx.size.reps
        self.n_units = n_units
        trials = reps * len(WORKER_COUNTS)
        self.window = window
        rename_window = max(2, min(ctx.size.rename_window, n_units // 2))
        self.rename_window = rename_window - rename_window % 2
        # As many ledgers of this size as the trials' windows need, made before any trial.
        self.windows_per_ledger = n_units // window
        ledgers = -(-trials // self.windows_per_ledger)
        self.simrun_roots = [ctx.scratch / f"simrun-{n_units}-{k}" for k in range(ledgers)]
        for root in self.simrun_roots:
            Ledger(root, n_units)
        self.rename_root = ctx.scratch / f"rename-{n_units}"
        prepare_rename(self.rename_root, n_units)
        self.taken: dict[Path, set[str]] = {root: set() for root in self.simrun_roots}
        self.trials = 0
        self.figures: dict[tuple[str, int], list[float]] = {}
        self.create_ms: list[float] = []

    def simrun(self, count: int) -> float:
        """A trial of simrun's ledger with `count` workers on a window no worker claimed."""
        share = self.window // count
        root = self.simrun_roots[self.trials // self.windows_per_ledger]
        start = self.trials % self.windows_per_ledger * self.window
        self.trials += 1
        workers = [
            (worker_id_at(self.n_units, start + part * share, self.taken[root]), share)
            for part in range(count)
        ]
        os.sync()
        shard = root / "claim" / str(start // SHARD_UNITS)
        self.create_ms.append(create_latency_ms(shard))
        speed, claimed = trial("simrun", root, self.n_units, workers)
        if claimed != list(range(start, start + share * count)):
            raise RuntimeError(f"simrun's ledger claimed {claimed[:3]}... outside the window")
        return speed

    def rename(self, count: int) -> float:
        """A trial of the rename ledger with `count` workers, put back afterwards."""
        share = self.rename_window // count
        workers = [(f"w{number}", share) for number in range(count)]
        speed, claimed = trial("rename", self.rename_root, self.n_units, workers)
        if len(claimed) != share * count:
            raise RuntimeError(f"the rename ledger claimed {len(claimed)} of {share * count}")
        restore_rename(self.rename_root, claimed)
        return speed

    def round(self, rep: int) -> None:
        """One repetition: both ledgers with every number of workers, the order alternating."""
        for count in WORKER_COUNTS:
            pair = [("simrun", self.simrun), ("rename", self.rename)]
            if (rep + count) % 2:
                pair.reverse()
            for kind, run_trial in pair:
                self.figures.setdefault((kind, count), []).append(run_trial(count))

    def median(self, kind: str, count: int) -> float:
        """The median units/s of a ledger with `count` workers."""
        return median(self.figures[(kind, count)])


def run(ctx: Context) -> list[Row]:
    """Measure every size, the repetitions of the sizes interleaved; the rows of the table."""
    sizes = ctx.size.ledger_sizes
    window = min(ctx.size.ledger_window, *sizes)
    window -= window % 2
    trials = {n_units: SizeTrials(ctx, n_units, window) for n_units in sizes}
    for rep in range(ctx.size.reps):
        for n_units in sizes:
            trials[n_units].round(rep)
    for n_units, found in trials.items():
        ctx.log(
            f"{n_units:,} units (windows: simrun {found.window:,}, rename "
            f"{found.rename_window:,}; a create in a shard of simrun's claim/ "
            f"{median(found.create_ms):.3f} ms): "
            + ", ".join(
                f"{kind} x{count} {found.median(kind, count):,.0f}/s"
                for kind in ("simrun", "rename")
                for count in WORKER_COUNTS
            )
        )
    smallest, largest = min(sizes), max(sizes)
    rows = []
    for n_units in sizes:
        for count in WORKER_COUNTS:
            ours = trials[n_units].median("simrun", count)
            theirs = trials[n_units].median("rename", count)
            row = Row(
                key=f"ledger.{n_units}.{count}",
                benchmark=f"ledger: {_workers(count)}, {n_units:,} units",
                simrun=ours,
                baseline=theirs,
                unit="units/s",
            )
            if n_units == largest:
                goals = [f"ratio >= {RENAME_FACTOR_GOAL:g}"]
                met = ours / theirs >= RENAME_FACTOR_GOAL
                if count == 2:
                    goals.insert(0, f">= {THROUGHPUT_GOAL:,.0f} units/s")
                    met = met and ours >= THROUGHPUT_GOAL
                row.goal, row.met = "; ".join(goals), met
            rows.append(row)
    for count in WORKER_COUNTS:
        small, large = trials[smallest], trials[largest]
        ours = small.median("simrun", count) / large.median("simrun", count)
        theirs = small.median("rename", count) / large.median("rename", count)
        rows.append(
            Row(
                key=f"ledger.scaling.{count}",
                benchmark=(
                    f"ledger: per-unit cost at {largest:,} / at {smallest:,} units, "
                    f"{_workers(count)}"
                ),
                simrun=ours,
                baseline=theirs,
                unit="x",
                goal=f"simrun <= {SCALING_GOAL:g}",
                met=ours <= SCALING_GOAL,
                note=(
                    "control, an exclusive create of an entry (a link) in the claim/ shard "
                    "directory of the trial's window in simrun's ledger: "
                    f"{median(small.create_ms):.3f} ms at {smallest:,} units, "
                    f"{median(large.create_ms):.3f} ms at {largest:,} units (medians over its "
                    "trials; simrun's ledger makes two creates a unit)"
                )
                if count == WORKER_COUNTS[0]
                else "",
            )
        )
    rows[0].note = (
        "claim + complete of zero-work units in 1 or 2 forked processes; simrun: "
        "simrun_harness.ledger.Ledger; baseline: baselines/rename_ledger.py (spec 24) on the "
        "same file system; windows of units, see Sizes"
    )
    return rows


def _workers(count: int) -> str:
    return f"{count} worker{'s' if count > 1 else ''}"
