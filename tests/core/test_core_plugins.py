"""simrun_core.plugins: discovery, settings, references and the validation of a workflow."""

from __future__ import annotations

import os.path
from importlib.metadata import EntryPoint, EntryPoints

import msgspec
import pytest

from simrun_core import plugins
from simrun_core.errors import WorkflowError
from simrun_core.plugins import (
    ENTRY_POINT_GROUP,
    ResourceHint,
    TaskType,
    UnknownTaskType,
    load_task_type,
    load_task_types,
    resolve,
    unknown_settings,
    validate_workflow,
)
from simrun_core.task_types import demo
from simrun_core.task_types.command import COMMAND, CommandSettings
from simrun_core.task_types.demo import SQUARES, SquaresSettings
from simrun_core.workflow import TaskSpec, Workflow

COMMAND_SETTINGS = {"image": "tools:1", "args": ["plot"], "cores": 1, "memory_gb": 2.0}


class FitSettings(msgspec.Struct, forbid_unknown_fields=True):
    subset: str = "all"


FIT = TaskType(name="test.fit", settings=FitSettings, inputs=("model", "data"), outputs=("fit",))


def types() -> dict[str, TaskType]:
    return {**load_task_types(), FIT.name: FIT}


def errors_of(*tasks: TaskSpec) -> list[str]:
    return validate_workflow(Workflow(name="w", tasks=list(tasks)), types())


def squares(task_id: str = "sq", **settings: object) -> TaskSpec:
    return TaskSpec(id=task_id, type="demo.squares", settings={"n": 3, **settings})


# --- discovery ----------------------------------------------------------------------------------


def test_load_task_types_finds_the_built_in_types() -> None:
    found = load_task_types()
    assert found["command"] is COMMAND
    assert found["demo.squares"] is SQUARES
    assert all(name == task_type.name for name, task_type in found.items())


SQUARES_ENTRY = ("demo.squares", "simrun_core.task_types.demo:SQUARES")
BROKEN_ENTRY = ("broken", "simrun_no_such_plugin_module:TYPE")


def registered(monkeypatch: pytest.MonkeyPatch, *entries: tuple[str, str]) -> list[str]:
    """Make these (name, value) the entry points of the task types; the names asked for by
    `entry_points(..., name=...)` are listed in the returned list."""
    found = EntryPoints(EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in entries)
    asked: list[str] = []

    def entry_points(*, group: str, name: str | None = None) -> EntryPoints:
        assert group == ENTRY_POINT_GROUP
        asked.append("*" if name is None else name)
        return found if name is None else found.select(name=name)

    monkeypatch.setattr(plugins, "entry_points", entry_points)
    return asked


def test_load_task_type_finds_a_built_in_type() -> None:
    assert load_task_type("demo.squares") is SQUARES
    assert load_task_type("command") is COMMAND


def test_load_task_type_imports_only_the_entry_point_of_its_name(monkeypatch) -> None:
    asked = registered(monkeypatch, BROKEN_ENTRY, SQUARES_ENTRY)
    with pytest.raises(ModuleNotFoundError, match="simrun_no_such_plugin_module"):
        load_task_types()  # what a harness loading every entry point would meet
    asked.clear()
    assert load_task_type("demo.squares") is SQUARES
    assert asked == ["demo.squares"]


def test_load_task_type_of_an_unknown_name_knows_the_registered_ones(monkeypatch) -> None:
    with pytest.raises(UnknownTaskType) as info:
        load_task_type("nope")
    assert (info.value.name, info.value.known) == ("nope", sorted(load_task_types()))
    assert "command" in info.value.known and "demo.squares" in info.value.known
    registered(monkeypatch)
    with pytest.raises(UnknownTaskType) as info:
        load_task_type("nope")
    assert info.value.known == []


def test_load_task_type_registered_under_another_name(monkeypatch) -> None:
    """The types are named by their `name`, as `load_task_types` names them, whatever the name
    of their entry point."""
    registered(monkeypatch, ("squares-alias", SQUARES_ENTRY[1]))
    assert load_task_type("demo.squares") is SQUARES
    with pytest.raises(UnknownTaskType) as info:
        load_task_type("squares-alias")
    assert info.value.known == ["demo.squares"]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([SQUARES_ENTRY, SQUARES_ENTRY], "task type 'demo.squares' is registered twice"),
        ([("demo.squares", "os:sep")], "entry point 'demo.squares' (os:sep) is no TaskType"),
    ],
)
def test_load_task_type_refuses_what_load_task_types_refuses(
    monkeypatch, entries: list[tuple[str, str]], message: str
) -> None:
    registered(monkeypatch, *entries)
    for load in (load_task_types, lambda: load_task_type("demo.squares")):
        with pytest.raises(ValueError) as info:
            load()
        assert str(info.value) == message


def test_built_in_types_are_split_or_not() -> None:
    assert SQUARES.splittable is True
    assert COMMAND.splittable is False
    assert SQUARES.units(SquaresSettings(n=7)) == 7
    settings = CommandSettings(image="i", args=[], cores=1, memory_gb=1.0)
    assert COMMAND.units(settings) is None
    assert SQUARES.outputs == ("squares",)
    assert SQUARES.hint == ResourceHint(memory_base_gb=0.125, memory_per_worker_gb=0.25)


# --- references ---------------------------------------------------------------------------------


def test_resolve_imports_the_function() -> None:
    assert resolve("simrun_core.task_types.demo:count_units") is demo.count_units
    assert resolve("os:path.join") is os.path.join


@pytest.mark.parametrize(
    "ref",
    ["simrun_core.task_types.demo.count_units", ":count_units", "simrun_core.task_types.demo:", ""],
)
def test_resolve_refuses_a_bad_reference(ref: str) -> None:
    with pytest.raises(ValueError) as info:
        resolve(ref)
    assert str(info.value) == f"{ref!r} is no reference of the form 'module:function'"


def test_resolve_of_a_missing_function() -> None:
    with pytest.raises(AttributeError, match="no_such_function"):
        resolve("simrun_core.task_types.demo:no_such_function")


def test_every_reference_of_squares_resolves() -> None:
    for ref in (SQUARES.count_units, SQUARES.setup, SQUARES.compute_unit, SQUARES.merge):
        assert ref is not None
        module, _, name = ref.partition(":")
        assert resolve(ref) is getattr(demo, name)
        assert module == "simrun_core.task_types.demo"


# --- settings -----------------------------------------------------------------------------------


class Renamed(msgspec.Struct, rename={"beta": "b-value"}):
    alpha: int = 0
    beta: int = 0


def test_unknown_settings_by_name_or_encoded_name_sorted() -> None:
    assert unknown_settings(Renamed, {"alpha": 1, "beta": 2, "b-value": 3}) == []
    assert unknown_settings(Renamed, {"zeta": 1, "alpha": 1, "gamma": 2}) == ["gamma", "zeta"]
    assert unknown_settings(SquaresSettings, {"nn": 3, "n": 3}) == ["nn"]


def test_decode_settings_fills_the_defaults() -> None:
    assert SQUARES.decode_settings({"n": 4}) == SquaresSettings(
        n=4, sleep_s=0.0, fail_at=None, memory_mb=0
    )


def test_decode_settings_names_unknown_fields() -> None:
    with pytest.raises(WorkflowError, match=r"^unknown setting 'nn', 'zz'$"):
        SQUARES.decode_settings({"zz": 1, "nn": 3})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"n": "many"}, "Expected `int`, got `str` - at `n`"),
        ({"n": [1]}, "Expected `int`, got `array` - at `n`"),
        ({"n": 2.5}, "Expected `int`, got `float` - at `n`"),
        ({"n": 3, "sleep_s": "slow"}, "Expected `float`, got `str` - at `sleep_s`"),
        ({}, "Object missing required field `n`"),
    ],
)
def test_decode_settings_names_invalid_fields(settings: dict, message: str) -> None:
    with pytest.raises(WorkflowError) as info:
        SQUARES.decode_settings(settings)
    assert str(info.value) == message


# --- validation of a workflow --------------------------------------------------------------------


def test_a_valid_workflow_has_no_errors() -> None:
    plot = TaskSpec(
        id="plot", type="command", settings=COMMAND_SETTINGS, inputs={"s": "sq.squares"}
    )
    fit = TaskSpec(
        id="fit", type="test.fit", inputs={"model": "plot.anything", "data": "sq.squares"}
    )
    assert errors_of(squares(), plot, fit) == []


def test_unknown_task_type() -> None:
    task = TaskSpec(id="a", type="nope.scan", settings={"n": 1})
    assert errors_of(task) == ["task 'a': unknown task type 'nope.scan'"]


def test_misspelled_setting_is_an_error_never_a_default() -> None:
    task = TaskSpec(id="a", type="demo.squares", settings={"n": 3, "sleep": 1})
    assert errors_of(task) == ["task 'a': settings: unknown setting 'sleep'"]
    task = TaskSpec(id="b", type="demo.squares", settings={"nn": 3})
    assert errors_of(task) == ["task 'b': settings: unknown setting 'nn'"]


def test_invalid_setting_type() -> None:
    assert errors_of(squares("a", fail_at="x")) == [
        "task 'a': settings: Expected `int | null`, got `str` - at `fail_at`"
    ]


def test_invalid_command_settings() -> None:
    task = TaskSpec(id="c", type="command", settings={**COMMAND_SETTINGS, "args": "plot --all"})
    assert errors_of(task) == ["task 'c': settings: Expected `array`, got `str` - at `args`"]


def test_input_port_that_is_no_port_of_the_type() -> None:
    fit = TaskSpec(id="fit", type="test.fit", inputs={"modle": "sq.squares"})
    assert errors_of(squares(), fit) == [
        "task 'fit': input 'modle' is no input port of 'test.fit' (model, data)"
    ]


def test_reading_an_output_port_the_source_does_not_have() -> None:
    plot = TaskSpec(
        id="plot", type="command", settings=COMMAND_SETTINGS, inputs={"s": "sq.results"}
    )
    assert errors_of(squares(), plot) == [
        "task 'plot': input 's' reads 'sq.results', but 'demo.squares' has the output ports squares"
    ]


def test_a_command_task_cannot_stage() -> None:
    plot = TaskSpec(
        id="plot",
        type="command",
        settings=COMMAND_SETTINGS,
        inputs={"s": "sq.squares"},
        stage=["s"],
    )
    assert errors_of(squares(), plot) == ["task 'plot': a 'command' task cannot stage its inputs"]


def test_errors_of_several_tasks_in_task_order() -> None:
    assert errors_of(
        TaskSpec(id="a", type="nope"),
        squares("b", nn=1),
        TaskSpec(id="c", type="command", settings=COMMAND_SETTINGS, inputs={"x": "b.sums"}),
    ) == [
        "task 'a': unknown task type 'nope'",
        "task 'b': settings: unknown setting 'nn'",
        "task 'c': input 'x' reads 'b.sums', but 'demo.squares' has the output ports squares",
    ]
