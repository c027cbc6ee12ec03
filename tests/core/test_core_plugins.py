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
    MAX_UNITS,
    ResourceHint,
    TaskType,
    UnknownTaskType,
    checkable_problems,
    load_task_type,
    load_task_types,
    resolve,
    unknown_settings,
    validate_workflow,
)
from simrun_core.task_types import demo
from simrun_core.task_types.command import COMMAND, CommandSettings
from simrun_core.task_types.demo import SQUARES, SquaresSettings
from simrun_core.workflow import ResourceOverride, TaskSpec, Workflow, decode_workflow

COMMAND_SETTINGS = {"image": "tools:1", "args": ["plot"], "cores": 1, "memory_gb": 2.0}


class FitSettings(msgspec.Struct, forbid_unknown_fields=True):
    subset: str = "all"


FIT = TaskType(name="test.fit", settings=FitSettings, inputs=("model", "data"), outputs=("fit",))


def types() -> dict[str, TaskType]:
    return {**load_task_types(), FIT.name: FIT}


def errors_of(*tasks: TaskSpec) -> list[str]:
    return [p.text() for p in validate_workflow(Workflow(name="w", tasks=list(tasks)), types())]


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

    def entry_points(*, name: str | None = None) -> EntryPoints:
        asked.append("*" if name is None else name)
        return found if name is None else found.select(name=name)

    monkeypatch.setattr(plugins, "_entry_points", entry_points)
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
    with pytest.raises(WorkflowError) as info:
        SQUARES.decode_settings({"zz": 1, "nn": 3})
    assert str(info.value).splitlines() == [
        "unknown setting 'nn', 'zz'",
        "n: missing, it is required",
    ]


def test_decode_settings_names_every_wrong_setting_at_once() -> None:
    settings = {"n": "100", "sleep_s": "fast", "fail_at": [1], "memry_mb": 3}
    with pytest.raises(WorkflowError) as info:
        SQUARES.decode_settings(settings)
    assert [problem.text() for problem in info.value.problems] == [
        "unknown setting 'memry_mb'",
        "n: expected `int`, got `str`",
        "sleep_s: expected `float`, got `str`",
        "fail_at: expected `int | null`, got `array`",
    ]


@pytest.mark.parametrize("quoted", [{"n": "100"}, {"n": 3, "sleep_s": "0.5"}])
def test_a_quoted_number_is_no_number(quoted: dict) -> None:
    with pytest.raises(WorkflowError, match=r"expected `(int|float)`, got `str`"):
        SQUARES.decode_settings(quoted)


def test_an_int_is_a_float_setting() -> None:
    assert SQUARES.decode_settings({"n": 3, "sleep_s": 1}).sleep_s == 1.0  # type: ignore[attr-defined]


class Checked(msgspec.Struct):
    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError("low is above high")


def test_a_check_of_the_settings_as_a_whole_is_named() -> None:
    checked = TaskType(name="test.checked", settings=Checked)
    with pytest.raises(WorkflowError, match=r"^low is above high$"):
        checked.decode_settings({"low": 2, "high": 1})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"n": "many"}, "n: expected `int`, got `str`"),
        ({"n": [1]}, "n: expected `int`, got `array`"),
        ({"n": 2.5}, "n: expected `int`, got `float`"),
        ({"n": 3, "sleep_s": "slow"}, "sleep_s: expected `float`, got `str`"),
        ({}, "n: missing, it is required"),
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
    assert errors_of(task) == [
        "task 'a': type: unknown task type 'nope.scan' (known: command, demo.squares, test.fit)"
    ]


def test_misspelled_setting_is_an_error_never_a_default() -> None:
    task = TaskSpec(id="a", type="demo.squares", settings={"n": 3, "sleep": 1})
    assert errors_of(task) == ["task 'a': settings: unknown setting 'sleep'"]
    task = TaskSpec(id="b", type="demo.squares", settings={"nn": 3})
    assert errors_of(task) == [
        "task 'b': settings: unknown setting 'nn'",
        "task 'b': settings.n: missing, it is required",
    ]


def test_invalid_setting_type() -> None:
    assert errors_of(squares("a", fail_at="x")) == [
        "task 'a': settings.fail_at: expected `int | null`, got `str`"
    ]


def test_invalid_command_settings() -> None:
    task = TaskSpec(id="c", type="command", settings={**COMMAND_SETTINGS, "args": "plot --all"})
    assert errors_of(task) == ["task 'c': settings.args: expected `array`, got `str`"]


def test_input_port_that_is_no_port_of_the_type() -> None:
    fit = TaskSpec(id="fit", type="test.fit", inputs={"modle": "sq.squares"})
    assert errors_of(squares(), fit) == [
        "task 'fit': inputs.modle: no input port of 'test.fit' (its input ports: model, data)"
    ]


def test_reading_an_output_port_the_source_does_not_have() -> None:
    plot = TaskSpec(
        id="plot", type="command", settings=COMMAND_SETTINGS, inputs={"s": "sq.results"}
    )
    assert errors_of(squares(), plot) == [
        "task 'plot': inputs.s: reads 'sq.results', but 'demo.squares' has no output port "
        "'results' (its output ports: squares)"
    ]


def test_a_command_task_cannot_stage() -> None:
    plot = TaskSpec(
        id="plot",
        type="command",
        settings=COMMAND_SETTINGS,
        inputs={"s": "sq.squares"},
        stage=["s"],
    )
    assert errors_of(squares(), plot) == [
        "task 'plot': stage: a 'command' task cannot stage its inputs"
    ]


def test_a_command_task_takes_no_resources() -> None:
    plot = TaskSpec(
        id="plot",
        type="command",
        settings=COMMAND_SETTINGS,
        resources=ResourceOverride(memory_per_worker_gb=4.0),
    )
    assert errors_of(plot) == [
        "task 'plot': resources: a 'command' task has the resources of its settings (cores, "
        "memory_gb, gpus, scratch_gb), not 'resources'"
    ]
    assert errors_of(msgspec.structs.replace(squares(), resources=ResourceOverride(gpus=0))) == []


def test_errors_of_several_tasks_in_task_order() -> None:
    assert errors_of(
        TaskSpec(id="a", type="nope"),
        squares("b", nn=1),
        TaskSpec(id="c", type="command", settings=COMMAND_SETTINGS, inputs={"x": "b.sums"}),
    ) == [
        "task 'a': type: unknown task type 'nope' (known: command, demo.squares, test.fit)",
        "task 'b': settings: unknown setting 'nn'",
        "task 'c': inputs.x: reads 'b.sums', but 'demo.squares' has no output port 'sums' "
        "(its output ports: squares)",
    ]


def test_a_workflow_that_does_not_decode_has_its_settings_checked_too() -> None:
    data = {
        "name": "w",
        "tasks": [
            {
                "id": "sq",
                "type": "demo.squares",
                "settings": {"n": "100", "sleep_s": "fast", "memry_mb": 3},
                "resources": {"workers": "two"},
            },
            {"id": "plot", "type": "command", "settings": {**COMMAND_SETTINGS, "cores": "1"}},
            {"id": "snap", "type": "only.in.a.snapshot", "settings": {"x": 1}},
            {"id": "sq", "type": "demo.squares", "settings": {"n": 1}, "split": "nope"},
        ],
    }
    workflow, fields = decode_workflow(data)
    assert workflow is None
    assert [p.text() for p in fields] == [
        "task 'sq': resources.workers: expected `int | null`, got `str`",
        "task 'sq': split: invalid enum value 'nope'",
    ]
    assert [p.text() for p in checkable_problems(data, types())] == [
        "task 'sq': id: used twice",
        "task 'sq': settings: unknown setting 'memry_mb'",
        "task 'sq': settings.n: expected `int`, got `str`",
        "task 'sq': settings.sleep_s: expected `float`, got `str`",
        "task 'plot': settings.cores: expected `int`, got `str`",
    ]


def test_no_further_problems_of_data_that_is_no_workflow_to_check() -> None:
    data = {"name": "w", "tasks": [{"id": "a", "type": "demo.squares", "settings": [1]}]}
    assert checkable_problems(data, types()) == []


# --- what a task needs to run, checked at submission --------------------------------------------


def test_an_input_on_a_type_without_input_ports_is_refused_like_an_unknown_port() -> None:
    no_ports = TaskType(name="test.plain", settings=FitSettings)
    task = TaskSpec(id="p", type="test.plain", inputs={"x": "sq.squares"})
    found = validate_workflow(
        Workflow(name="w", tasks=[squares(), task]), {**types(), no_ports.name: no_ports}
    )
    assert [p.text() for p in found] == ["task 'p': inputs.x: 'test.plain' has no input ports"]


def test_demo_squares_takes_only_its_input_port_after() -> None:
    after = TaskSpec(id="b", type="demo.squares", settings={"n": 2}, inputs={"after": "a.squares"})
    assert errors_of(squares("a"), after) == []
    wrong = TaskSpec(id="b", type="demo.squares", settings={"n": 2}, inputs={"x": "a.squares"})
    assert errors_of(squares("a"), wrong) == [
        "task 'b': inputs.x: no input port of 'demo.squares' (its input ports: after)"
    ]


def command(args: list[str], **inputs: str) -> TaskSpec:
    return TaskSpec(
        id="c", type="command", settings={**COMMAND_SETTINGS, "args": args}, inputs=inputs
    )


@pytest.mark.parametrize(
    ("args", "inputs", "message"),
    [
        ([], {}, "settings.args: empty: a command needs at least the program to run"),
        (
            ["--in={input}"],
            {},
            "settings.args: every part holds {input} and the task has no inputs: nothing to run",
        ),
        (["", "x"], {}, "settings.args[0]: the program to run is empty"),
        (["tr\0ue"], {}, "settings.args[0]: holds a NUL character, which no argument can"),
    ],
)
def test_a_command_that_cannot_start_a_process_is_refused(
    args: list[str], inputs: dict[str, str], message: str
) -> None:
    assert errors_of(squares(), command(args, **inputs)) == [f"task 'c': {message}"]


@pytest.mark.parametrize(
    ("part", "reason"),
    [
        ("--out={output}", "unknown placeholder {output}, expected {settings}, {out} or {input}"),
        ("${1#*=}", "unknown placeholder {1#*=}, expected {settings}, {out} or {input}"),
        ("x={out", "'{' at 2 is not closed"),
        ("a}", "'}' at 1 has no '{'"),
    ],
)
def test_the_placeholders_of_a_command_are_checked_at_submission(part: str, reason: str) -> None:
    assert errors_of(command(["sh", "-c", part])) == [
        f"task 'c': settings.args[2]: {reason}; write {{{{ and }}}} for a literal brace, "
        "e.g. ${{HOME}} for ${HOME}"
    ]


def test_escaped_braces_and_known_placeholders_pass() -> None:
    args = ["sh", "-c", "echo ${{1#*=}} {out} {settings}", "--in={input}"]
    assert errors_of(squares(), command(args, data="sq.squares")) == []


@pytest.mark.parametrize(
    ("n", "message"),
    [
        (0, "settings: 0 units, at least 1 needed"),
        (
            10**29,
            "settings: 100,000,000,000,000,000,000,000,000,000 units, more than the "
            "10,000,000 a task may have (MAX_UNITS)",
        ),
    ],
)
def test_a_count_of_units_no_machine_can_run_is_refused(n: int, message: str) -> None:
    assert errors_of(squares("a", n=n)) == [f"task 'a': {message}"]
    assert errors_of(squares("a", n=MAX_UNITS)) == []


def test_a_count_of_units_that_fails_is_refused() -> None:
    broken = TaskType(
        name="test.broken",
        settings=FitSettings,
        count_units="os.path:join",
        compute_unit="os.path:join",
        merge="os.path:join",
    )
    found = validate_workflow(
        Workflow(name="w", tasks=[TaskSpec(id="b", type="test.broken")]), {broken.name: broken}
    )
    assert [p.text() for p in found] == [
        "task 'b': settings: counting its units failed: TypeError: expected str, bytes or "
        "os.PathLike object, not FitSettings"
    ]


def test_load_task_type_after_a_scan_looks_up_only_a_name_the_scan_did_not_find(
    monkeypatch,
) -> None:
    """A spare harness scans the entry points while it waits (`scan_task_types`): its task's
    type then loads without reading the installed distributions again."""
    monkeypatch.setattr(plugins, "_scanned", None)
    asked = registered(monkeypatch, SQUARES_ENTRY)
    plugins.scan_task_types()
    assert asked == ["*"]
    asked.clear()
    assert load_task_type("demo.squares") is SQUARES
    assert asked == []
    with pytest.raises(UnknownTaskType):
        load_task_type("command")  # not registered here: looked up anew, then all loaded
    assert asked == ["command", "*"]
