"""A plugin type for the tests of the units in flight, found by `in_flight_plugin:MARKED`.

The units of `harness_test_plugin:GATED`, each first marking that it began with the empty file
`<task_dir>/begun/<index>`, so a test knows which units a process of the pool took up and which
only waited in the worker's queue.
"""

from harness_test_plugin import GATED, GatedSettings, compute_gated

from simrun_core.plugins import TaskPaths, TaskType


def compute_marked(settings: GatedSettings, index: int, paths: TaskPaths) -> None:
    """Mark the unit begun, then compute it as the gated type does."""
    begun = paths.task_dir / "begun"
    begun.mkdir(exist_ok=True)
    (begun / str(index)).touch()
    compute_gated(settings, index, paths)


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
