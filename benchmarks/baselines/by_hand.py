"""The physical limit of a run: the task type's own functions called by hand, in one process.

    python by_hand.py squares OUT UNITS SLEEP_S PROCESSES
    python by_hand.py chain OUT TASKS SLEEP_S

`squares` computes the units of one squares task in a plain `ProcessPoolExecutor` of
`PROCESSES` processes and merges them; `chain` runs `TASKS` squares tasks of one unit each one
after the other, each in a pool of its own process (as a runner isolates a task), and merges
each. The outputs go below OUT, as simrun writes them below a task's `out/`.
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path

from simrun_core.plugins import TaskPaths
from simrun_core.task_types.demo import SquaresSettings, compute_unit, merge, setup


def task_paths(out_root: Path, task: str) -> TaskPaths:
    """The paths of a task below `out_root`, shaped like the ones simrun gives a task."""
    task_dir = out_root / task
    return TaskPaths(
        store=out_root,
        run_dir=out_root,
        task_dir=task_dir,
        out=task_dir / "out",
        inputs={},
        scratch=task_dir / "scratch",
    )


def run_task(paths: TaskPaths, settings: SquaresSettings, processes: int) -> None:
    """Set up, compute every unit in a pool of `processes` processes, merge."""
    setup(settings, paths)
    with ProcessPoolExecutor(max_workers=processes) as pool:
        units = range(settings.n)
        list(pool.map(compute_unit, repeat(settings), units, repeat(paths)))
    merge(settings, paths)


def main(argv: list[str]) -> None:
    """Run the squares task or the chain the arguments name."""
    mode, out_root = argv[0], Path(argv[1])
    if mode == "squares":
        units, sleep_s, processes = int(argv[2]), float(argv[3]), int(argv[4])
        settings = SquaresSettings(n=units, sleep_s=sleep_s)
        run_task(task_paths(out_root, "squares"), settings, processes)
    elif mode == "chain":
        tasks, sleep_s = int(argv[2]), float(argv[3])
        for number in range(1, tasks + 1):
            settings = SquaresSettings(n=1, sleep_s=sleep_s)
            run_task(task_paths(out_root, f"t{number}"), settings, 1)
    else:
        raise SystemExit(f"unknown mode {mode!r}: squares or chain")


if __name__ == "__main__":
    main(sys.argv[1:])
