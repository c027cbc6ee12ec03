"""The work every peer runs, as simrun's demo squares does it: stdlib only, one definition.

A unit sleeps, then writes `{"index": i, "square": i * i}` to `OUT/squares/<i>.json`
(atomically, as `simrun_core.task_types.demo` does); the final step sums the squares of the
units and writes `OUT/summary.json`. A chain is `tasks` one-unit tasks, each after the one
before, each writing its unit and its sum below `OUT/t<k>/`.

The peer scripts import this module from their own directory (it is their `sys.path[0]`) and
never import `benchmarks` or simrun, so a peer's start costs only python and the peer itself.
Each script ends by printing one JSON line of its phases (`figures`), which the benchmark reads.

As a command it runs one step, for peers whose jobs are processes (Snakemake's `shell:`):

    python work.py unit OUT INDEX SLEEP_S | sum OUT UNITS | chain-task OUT NUMBER SLEEP_S
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# A script exits with this code, saying why on stderr, when its peer cannot be imported.
MISSING_EXIT = 3
STARTED = time.perf_counter()


@dataclasses.dataclass(frozen=True)
class Work:
    """What a peer script is asked to run: `squares UNITS SLEEP_S OUT` or `chain TASKS SLEEP_S
    OUT`, and the address of the peer's running cluster when it has one."""

    kind: str
    count: int
    sleep_s: float
    out: Path
    address: str = ""


def parse_work(argv: list[str]) -> Work:
    """The work of a script's arguments: KIND COUNT SLEEP_S OUT [ADDRESS]."""
    if len(argv) not in (4, 5) or argv[0] not in ("squares", "chain"):
        raise SystemExit("usage: squares|chain COUNT SLEEP_S OUT [ADDRESS]")
    address = argv[4] if len(argv) == 5 else ""
    return Work(argv[0], int(argv[1]), float(argv[2]), Path(argv[3]), address)


def write_json_atomic(path: Path, value: object) -> None:
    """Write JSON through a temporary file in the same directory and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as file:
        json.dump(value, file)
    os.replace(tmp, path)


def compute_unit(out: str, index: int, sleep_s: float) -> int:
    """Sleep, then write the square of `index` below `out`; the index."""
    if sleep_s:
        time.sleep(sleep_s)
    squares = Path(out) / "squares"
    squares.mkdir(parents=True, exist_ok=True)
    write_json_atomic(squares / f"{index}.json", {"index": index, "square": index**2})
    return index


def sum_units(out: str, units: int, *after: object) -> int:
    """Sum the squares the units wrote below `out` into `out/summary.json`; the sum.

    `after` carries what the step waits for (the units' results), which it does not read."""
    total = 0
    for index in range(units):
        total += json.loads((Path(out) / "squares" / f"{index}.json").read_text())["square"]
    write_json_atomic(Path(out) / "summary.json", {"n": units, "sum": total})
    return total


def chain_task(out: str, number: int, sleep_s: float, after: object = None) -> int:
    """Task `number` of a chain: its one unit and its sum below `out/t<number>`; its number."""
    task_out = str(Path(out) / f"t{number}")
    compute_unit(task_out, 0, sleep_s)
    sum_units(task_out, 1)
    return number


def expected_sum(units: int) -> int:
    """The sum of the squares of 0..units-1, what a squares work must write."""
    return (units - 1) * units * (2 * units - 1) // 6


def check(work: Work) -> None:
    """Raise unless the work's final step wrote what it should."""
    if work.kind == "squares":
        summary = json.loads((work.out / "summary.json").read_text())
        if summary != {"n": work.count, "sum": expected_sum(work.count)}:
            raise RuntimeError(f"wrong summary {summary}")
    else:
        last = json.loads((work.out / f"t{work.count}" / "summary.json").read_text())
        if last != {"n": 1, "sum": 0}:
            raise RuntimeError(f"wrong summary of the last task {last}")


def missing(peer: str, error: BaseException) -> None:
    """Exit with MISSING_EXIT, saying that `peer` cannot be imported."""
    print(f"{peer} cannot be imported: {error}", file=sys.stderr, flush=True)
    raise SystemExit(MISSING_EXIT)


def figures(**seconds: float) -> None:
    """Print the phases of the script (seconds) as the one JSON line the benchmark reads."""
    print(json.dumps({"figures": seconds}), flush=True)


def main(argv: list[str]) -> None:
    """Run the one step the arguments name."""
    if len(argv) == 4 and argv[0] == "unit":
        compute_unit(argv[1], int(argv[2]), float(argv[3]))
    elif len(argv) == 3 and argv[0] == "sum":
        sum_units(argv[1], int(argv[2]))
    elif len(argv) == 4 and argv[0] == "chain-task":
        chain_task(argv[1], int(argv[2]), float(argv[3]))
    else:
        raise SystemExit("usage: unit OUT INDEX SLEEP_S | sum OUT UNITS | chain-task OUT N SLEEP_S")


if __name__ == "__main__":
    main(sys.argv[1:])
