"""A plugin type for the tests of the units in flight, found by `in_flight_plugin:MARKED`.

The units of `harness_test_plugin:GATED`, each first marking that it began with the empty file
`<task_dir>/begun/<index>`, so a test knows which units a process of the pool took up and which
only waited in the worker's queue; `in_flight_plugin:UNTIL_STOPPED`, marked units that run
until the worker stops starting units (its SIGTERM) or the gate opens, so a test knows they
ran across the stop; `in_flight_plugin:MARKED_SQUARES`, the units of `demo.squares` marked
begun; and `in_flight_plugin:SELECTED`, zero-work units that mark themselves
begun as well, but for those its settings name: they wait for the gate (`gated`) or raise
(`failing`), and its setup can be slow (`setup_s`).
"""

import dataclasses
import time

import msgspec
from harness_test_plugin import GATE_TIMEOUT_S, GATED, GatedSettings, compute_gated

from simrun_core.plugins import TaskPaths, TaskType
from simrun_core.task_types import demo
from simrun_harness import pool


def mark_begun(index: int, paths: TaskPaths) -> None:
    """Mark the unit begun: the empty file `<task_dir>/begun/<index>`."""
    begun = paths.task_dir / "begun"
    begun.mkdir(exist_ok=True)
    (begun / str(index)).touch()


def compute_marked(settings: GatedSettings, index: int, paths: TaskPaths) -> None:
    """Mark the unit begun, then compute it as the gated type does."""
    mark_begun(index, paths)
    compute_gated(settings, index, paths)


def compute_until_stopped(settings: GatedSettings, index: int, paths: TaskPaths) -> None:
    """Mark the unit begun, wait until the worker has told the pool to begin no more units
    (the byte `UnitPool.stop_starting` sets, which this process of the pool shares) or the
    gate opens, then write the square of the index as `demo.squares` does."""
    mark_begun(index, paths)
    stopped = pool._process["stopped"]
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not stopped[0] and not (paths.task_dir / "gate").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"unit {index}: the worker never stopped starting units")
        time.sleep(0.01)
    demo.write_json_atomic(
        paths.out / "squares" / f"{index}.json", {"index": index, "square": index**2}
    )


def compute_marked_square(settings: demo.SquaresSettings, index: int, paths: TaskPaths) -> None:
    """Mark the unit begun, then compute it as `demo.squares` does (its `sleep_s` included)."""
    mark_begun(index, paths)
    demo.compute_unit(settings, index, paths)


class SelectedSettings(msgspec.Struct, forbid_unknown_fields=True):
    """`n` units; those in `gated` wait for the gate, those in `failing` raise; the setup of
    each process sleeps `setup_s` first."""

    n: int
    gated: list[int] = []
    failing: list[int] = []
    setup_s: float = 0.0


def setup_selected(settings: SelectedSettings, paths: TaskPaths) -> None:
    """Sleep `setup_s`, then set up as `demo.squares` does."""
    time.sleep(settings.setup_s)
    demo.setup(settings, paths)  # type: ignore[arg-type]


def compute_selected(settings: SelectedSettings, index: int, paths: TaskPaths) -> None:
    """Mark the unit begun; then raise, wait for the gate, or write its square at once."""
    mark_begun(index, paths)
    if index in settings.failing:
        raise ValueError(f"unit {index} fails as asked")
    if index in settings.gated:
        compute_gated(GatedSettings(n=settings.n), index, paths)
    else:
        demo.compute_unit(demo.SquaresSettings(n=settings.n), index, paths)


MARKED = TaskType(
    name="test.marked",
    settings=GatedSettings,
    outputs=GATED.outputs,
    hint=GATED.hint,
    count_units=GATED.count_units,
    setup=GATED.setup,
    compute_unit="in_flight_plugin:compute_marked",
    merge=GATED.merge,
)

UNTIL_STOPPED = dataclasses.replace(
    MARKED, name="test.until-stopped", compute_unit="in_flight_plugin:compute_until_stopped"
)

MARKED_SQUARES = dataclasses.replace(
    demo.SQUARES, name="test.marked-squares", compute_unit="in_flight_plugin:compute_marked_square"
)

SELECTED = dataclasses.replace(
    MARKED,
    name="test.selected",
    settings=SelectedSettings,
    setup="in_flight_plugin:setup_selected",
    compute_unit="in_flight_plugin:compute_selected",
)
