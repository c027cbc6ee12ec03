"""simrun_core.plugins: the `plan` hook of a task type (`plan_workflow`), which a client calls
before it submits: the planned settings are the fields given or set by the plan."""

from __future__ import annotations

from importlib.metadata import EntryPoint, EntryPoints
from pathlib import Path

import msgspec
import pytest

from simrun_core import plugins
from simrun_core.errors import WorkflowError
from simrun_core.plugins import (
    PlanError,
    TaskType,
    installed_task_types,
    plan_workflow,
    planned_settings,
)
from simrun_core.task_types.demo import SQUARES
from simrun_core.workflow import TaskSpec, Workflow


class ScanSettings(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    units: int | None = None
    sleep_s: float = 0.0
    label: str = "scan"


def plan_units(settings: ScanSettings) -> ScanSettings:
    """The units are the lines of the model file (given units are kept)."""
    if settings.units is None:
        lines = Path(settings.model).read_text().splitlines()
        return msgspec.structs.replace(settings, units=len(lines))
    return settings


def plan_in_place(settings: ScanSettings) -> ScanSettings:
    settings.units = 7  # a plan may change the settings it was given and return them
    return settings


def plan_raises(settings: ScanSettings) -> ScanSettings:
    raise FileNotFoundError(f"no model {settings.model}")


def plan_returns_a_dict(settings: ScanSettings) -> dict[str, object]:
    return {"model": settings.model, "units": 3}


def plan_sets_garbage(settings: ScanSettings) -> ScanSettings:
    return msgspec.structs.replace(settings, units="many")  # type: ignore[arg-type]


def scan_type(plan: str = "plan_units") -> TaskType:
    return TaskType(
        name="test.scan",
        settings=ScanSettings,
        count_units="simrun_core.task_types.demo:count_units",
        compute_unit="simrun_core.task_types.demo:compute_unit",
        merge="simrun_core.task_types.demo:merge",
        plan=f"{__name__}:{plan}",
    )


def workflow(*tasks: TaskSpec) -> Workflow:
    return Workflow(name="w", tasks=list(tasks))


def test_the_plan_fills_the_units_from_the_model_and_keeps_the_given_fields(tmp_path) -> None:
    model = tmp_path / "model.txt"
    model.write_text("a\nb\nc\nd\n")
    task = TaskSpec(id="scan", type="test.scan", settings={"model": str(model), "sleep_s": 0.0})
    planned = plan_workflow(workflow(task), {"test.scan": scan_type()})
    # given (`sleep_s` at its default too) or set by the plan; `label` stays with the plugin
    assert planned.tasks[0].settings == {"model": str(model), "units": 4, "sleep_s": 0.0}
    assert task.settings == {"model": str(model), "sleep_s": 0.0}, "the workflow is not changed"
    given = TaskSpec(id="scan", type="test.scan", settings={"model": str(model), "units": 2})
    assert plan_workflow(workflow(given), {"test.scan": scan_type()}).tasks[0].settings == {
        "model": str(model),
        "units": 2,
    }


def test_a_plan_that_changes_its_settings_in_place_is_seen() -> None:
    task_type = scan_type("plan_in_place")
    assert planned_settings(task_type, {"model": "m"}) == {"model": "m", "units": 7}


def test_a_task_without_a_plan_or_of_a_type_not_installed_is_kept_as_written() -> None:
    squares = TaskSpec(id="sq", type="demo.squares", settings={"n": "not even checked"})
    elsewhere = TaskSpec(id="far", type="only.on.the.service", settings={"x": 1})
    found = workflow(squares, elsewhere)
    assert plan_workflow(found, {"demo.squares": SQUARES}) == found


def test_a_plan_that_raises_refuses_the_workflow_naming_the_task_and_the_error() -> None:
    tasks = [
        TaskSpec(id="one", type="test.scan", settings={"model": "/nowhere/model.txt"}),
        TaskSpec(id="two", type="test.scan", settings={"units": 3}),
    ]
    with pytest.raises(PlanError) as refused:
        plan_workflow(workflow(*tasks), {"test.scan": scan_type("plan_raises")})
    assert isinstance(refused.value, WorkflowError)
    assert [problem.text() for problem in refused.value.problems] == [
        "task 'one': settings: the plan of 'test.scan' (test_core_plan:plan_raises) failed: "
        "FileNotFoundError: no model /nowhere/model.txt",
        "task 'two': settings.model: missing, it is required",
    ]


def test_a_plan_must_return_valid_settings_of_its_type() -> None:
    task = TaskSpec(id="scan", type="test.scan", settings={"model": "m"})
    with pytest.raises(PlanError, match="returned a dict, not the settings"):
        plan_workflow(workflow(task), {"test.scan": scan_type("plan_returns_a_dict")})
    with pytest.raises(PlanError) as refused:
        plan_workflow(workflow(task), {"test.scan": scan_type("plan_sets_garbage")})
    [problem] = refused.value.problems
    assert (problem.task, problem.field) == ("scan", "settings.units")
    assert "(test_core_plan:plan_sets_garbage) set: expected `int | null`" in problem.message


def test_installed_task_types_imports_only_the_entry_points_asked_for(monkeypatch) -> None:
    loaded: list[str] = []
    good = EntryPoint("test.scan", f"{__name__}:SCAN", plugins.ENTRY_POINT_GROUP)
    broken = EntryPoint("test.broken", "no_such_module_anywhere:X", plugins.ENTRY_POINT_GROUP)
    other = EntryPoint("test.other", f"{__name__}:SCAN", plugins.ENTRY_POINT_GROUP)

    unasked = EntryPoint("test.unasked", "no_such_module_either:X", plugins.ENTRY_POINT_GROUP)

    def entry_points(name: str | None = None) -> EntryPoints:
        loaded.append(str(name))
        return EntryPoints([good, broken, other, unasked])

    imported: list[str] = []
    load = plugins._loaded

    def recorded(entry: EntryPoint) -> TaskType:
        imported.append(entry.name)
        return load(entry)

    monkeypatch.setattr(plugins, "_entry_points", entry_points)
    monkeypatch.setattr(plugins, "_loaded", recorded)
    found = installed_task_types(["test.scan", "test.broken", "test.other", "nope", "test.scan"])
    # a broken entry point, one naming another type, and a name without one are left out; an
    # entry point not asked for is not imported
    assert found == {"test.scan": SCAN}
    assert loaded == ["None"], "the entry points are read once"
    assert imported == ["test.broken", "test.other", "test.scan"]


SCAN = scan_type()
