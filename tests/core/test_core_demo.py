"""simrun_core.task_types.demo: the squares demo, its units and merge, as a worker calls them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simrun_core.plugins import TaskPaths, resolve
from simrun_core.task_types import demo
from simrun_core.task_types.demo import SQUARES, SquaresSettings


@pytest.fixture
def paths(tmp_path: Path) -> TaskPaths:
    task_dir = tmp_path / "runs" / "r" / "tasks" / "squares"
    return TaskPaths(
        store=tmp_path,
        run_dir=tmp_path / "runs" / "r",
        task_dir=task_dir,
        out=task_dir / "out",
        inputs={},
        scratch=tmp_path / "scratch",
    )


def files_in(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def test_count_units() -> None:
    assert demo.count_units(SquaresSettings(n=7)) == 7
    assert demo.count_units(SquaresSettings(n=0)) == 0
    assert resolve(SQUARES.count_units)(SquaresSettings(n=12)) == 12


def test_setup_creates_the_output_port_and_may_run_twice(paths: TaskPaths) -> None:
    demo.setup(SquaresSettings(n=3), paths)
    demo.setup(SquaresSettings(n=3), paths)
    assert files_in(paths.out) == ["squares"]
    assert files_in(paths.out / "squares") == []


def test_compute_unit_writes_its_square_atomically(paths: TaskPaths) -> None:
    settings = SquaresSettings(n=5)
    resolve(SQUARES.setup)(settings, paths)
    compute = resolve(SQUARES.compute_unit)
    for index in (4, 0, 3):
        compute(settings, index, paths)
    assert files_in(paths.out / "squares") == ["0.json", "3.json", "4.json"]
    assert json.loads((paths.out / "squares" / "4.json").read_text()) == {"index": 4, "square": 16}
    assert json.loads((paths.out / "squares" / "0.json").read_text()) == {"index": 0, "square": 0}


def test_compute_unit_twice_gives_the_same_file(paths: TaskPaths) -> None:
    settings = SquaresSettings(n=5)
    demo.setup(settings, paths)
    demo.compute_unit(settings, 3, paths)
    first = (paths.out / "squares" / "3.json").read_bytes()
    demo.compute_unit(settings, 3, paths)
    assert (paths.out / "squares" / "3.json").read_bytes() == first
    assert files_in(paths.out / "squares") == ["3.json"]


def test_fail_at_raises_naming_the_unit(paths: TaskPaths) -> None:
    settings = SquaresSettings(n=5, fail_at=2)
    demo.setup(settings, paths)
    demo.compute_unit(settings, 1, paths)
    with pytest.raises(RuntimeError, match=r"^unit 2 fails as fail_at asks$"):
        demo.compute_unit(settings, 2, paths)
    assert files_in(paths.out / "squares") == ["1.json"]


def test_merge_writes_the_sum_of_squares(paths: TaskPaths) -> None:
    settings = SquaresSettings(n=10)
    demo.setup(settings, paths)
    for index in reversed(range(settings.n)):
        demo.compute_unit(settings, index, paths)
    resolve(SQUARES.merge)(settings, paths)
    summary = json.loads((paths.out / "summary.json").read_text())
    assert summary == {"n": 10, "sum": sum(i * i for i in range(10))}
    assert summary["sum"] == 285
    assert files_in(paths.out) == ["squares", "summary.json"]


def test_merge_of_no_units(paths: TaskPaths) -> None:
    settings = SquaresSettings(n=0)
    demo.setup(settings, paths)
    demo.merge(settings, paths)
    assert json.loads((paths.out / "summary.json").read_text()) == {"n": 0, "sum": 0}


def test_merge_needs_every_unit(paths: TaskPaths) -> None:
    settings = SquaresSettings(n=3)
    demo.setup(settings, paths)
    demo.compute_unit(settings, 0, paths)
    demo.compute_unit(settings, 2, paths)
    with pytest.raises(FileNotFoundError, match=r"1\.json"):
        demo.merge(settings, paths)
    assert files_in(paths.out) == ["squares"]


def test_write_json_atomic_replaces_and_leaves_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "value.json"
    demo.write_json_atomic(path, {"a": 1})
    demo.write_json_atomic(path, [1, 2])
    assert json.loads(path.read_text()) == [1, 2]
    assert files_in(tmp_path) == ["value.json"]


def test_write_json_atomic_leaves_nothing_on_an_error(tmp_path: Path) -> None:
    path = tmp_path / "value.json"
    demo.write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        demo.write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert files_in(tmp_path) == ["value.json"]
