"""The units of a squares task as a user would hand-write them for Slurm: one batch job a part.

    python slurm_units.py OUT UNITS SLEEP_S PROCESSES PART PARTS

The job computes the units `PART, PART + PARTS, ...` of `UNITS` with the task type's own
`compute_unit` in a `ProcessPoolExecutor` of `PROCESSES` processes, writing below OUT as
simrun writes below a task's `out/`, then creates `OUT/done-<PART>`; whoever submitted the
jobs merges once every part is done (`by_hand.run_task` is the same work in one process).
"""

from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat
from pathlib import Path

from by_hand import task_paths

from simrun_core.task_types.demo import SquaresSettings, compute_unit, setup


def main(argv: list[str]) -> None:
    out_root = Path(argv[0])
    units, sleep_s, processes, part, parts = (
        int(argv[1]),
        float(argv[2]),
        int(argv[3]),
        int(argv[4]),
        int(argv[5]),
    )
    settings = SquaresSettings(n=units, sleep_s=sleep_s)
    paths = task_paths(out_root, "squares")
    setup(settings, paths)
    with ProcessPoolExecutor(max_workers=processes) as pool:
        mine = range(part, units, parts)
        list(pool.map(compute_unit, repeat(settings), mine, repeat(paths)))
    (out_root / f"done-{part}").touch()


if __name__ == "__main__":
    main(sys.argv[1:])
