"""`benchmarks/run`: run every benchmark, print one table, write `benchmarks/RESULTS.md`."""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks.common import (
    SIZES,
    Context,
    Row,
    busy_cpu_seconds,
    load_average,
    machine,
    own_cpu_seconds,
)
from benchmarks.gaps import gap
from benchmarks.report import format_table, results_markdown

BENCHMARKS = (
    "local_overhead",
    "ledger",
    "events",
    "api",
    "scale",
    "many_runs",
    "clients",
    "cli",
    "peers",
    "slurm",
)
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
SCRATCH_PREFIX = b"simrun-bench-"


def parse(argv: list[str]) -> argparse.Namespace:
    """The options of the command."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/run",
        description="Run simrun's benchmarks against their baselines; print and record the table.",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="BENCHMARK",
        help=f"benchmarks to run (default: all of {', '.join(BENCHMARKS)})",
    )
    parser.add_argument(
        "--size",
        choices=sorted(SIZES),
        default="full",
        help="full (the figures of RESULTS.md) or smoke (tiny, for the test suite)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="where to write the results (default: benchmarks/RESULTS.md for a full run of all)",
    )
    parser.add_argument(
        "--scratch",
        type=Path,
        default=None,
        help="a directory for the stores and ledgers (default: a temporary directory)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; exit 0 when each ran (whether its goals are met or not)."""
    options = parse(sys.argv[1:] if argv is None else argv)
    unknown = [name for name in options.names if name not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark {', '.join(unknown)}: choose of {', '.join(BENCHMARKS)}")
        return 2
    names = [name for name in BENCHMARKS if name in options.names] or list(BENCHMARKS)
    size = SIZES[options.size]
    results = options.results
    if results is None and size.name == "full" and names == list(BENCHMARKS):
        results = RESULTS
    if size.name == "full":
        wait_for_removals()
    base = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX.decode(), dir=options.scratch))
    started = time.monotonic()
    load_before = load_average()
    busy_before, own_before = busy_cpu_seconds(), own_cpu_seconds()
    rows: list[Row] = []
    failures: list[str] = []
    try:
        for name in names:
            scratch = base / name
            scratch.mkdir()
            began = time.monotonic()
            _log(f"{name}: start ({size.name})")
            try:
                module = importlib.import_module(f"benchmarks.{name}")
                context = Context(size=size, scratch=scratch, log=_logger(name))
                rows += module.run(context)
            except Exception:
                failures.append(name)
                _log(f"{name}: FAILED\n{traceback.format_exc()}")
            _log(f"{name}: {time.monotonic() - began:.1f} s")
            os.sync()  # the next benchmark does not pay for the write-back of this one
    finally:
        seconds = time.monotonic() - started
        remove_later(base)
    busy = busy_cpu_seconds() - busy_before
    others = max(0.0, busy - (own_cpu_seconds() - own_before))
    for row in rows:
        if row.met is False and not row.gap:
            row.gap = gap(row.key)
    print(format_table(rows), flush=True)
    print(f"{len(rows)} figures in {seconds:.0f} s; failed: {', '.join(failures) or 'none'}")
    if results is not None:
        facts = machine(base.parent)
        facts["load average (1 5 15 min) before / after"] = f"{load_before} / {load_average()}"
        available = seconds * len(os.sched_getaffinity(0))
        facts["CPU of other processes during the run"] = (
            f"{others:.0f} s of {available:.0f} s ({others / available:.0%}; the benchmarks "
            f"used {busy - others:.0f} s)"
        )
        facts["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        facts["duration"] = f"{seconds:.0f} s (size {size.name}, {size.reps} repetitions)"
        results.write_text(results_markdown(rows, facts, size, failures))
        print(f"wrote {results}")
    return 1 if failures else 0


def removals() -> list[int]:
    """The pids of the removals of earlier runs' scratch (`remove_later`) still going."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if Path(os.fsdecode(argv[0])).name == "rm" and any(SCRATCH_PREFIX in a for a in argv):
            found.append(int(entry.name))
    return found


def wait_for_removals() -> None:
    """Wait until the removals of earlier runs' scratch ended: removing the files of a full
    run keeps a core busy in the kernel for minutes (a discard per file), and the figures of
    a run made meanwhile were ~30% slower (2026-12-02: the msgspec baseline of the fold 2.2M
    lines/s against 3.0-3.4M)."""
    pids = removals()
    if pids:
        _log(f"waiting for the removal of earlier scratch (pids {pids})")
    while removals():
        time.sleep(1.0)


def remove_later(directory: Path) -> None:
    """Remove the scratch in a process of its own at the lowest priority, after this command.

    On a file system mounted with `discard` (this machine's), removing the 10^5 files of the
    ledgers issues a discard per file and can take minutes: that is not part of a benchmark.
    """
    subprocess.Popen(
        ["nice", "-n", "19", "rm", "-rf", str(directory)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _log(f"removing {directory} in the background")


def _log(message: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


def _logger(name: str):
    return lambda message: _log(f"{name}: {message}")
