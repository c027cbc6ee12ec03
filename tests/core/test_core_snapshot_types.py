"""The task types of a run's snapshots as the service knows them (`simrun_core.snapshot_types`)
and the probe that answers about them (`simrun_harness.types_probe`): the service checks,
plans and learns with a type built of the probe's answer alone, and the `submitted` event
carries it to the fold."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import msgspec
import pytest

from simrun_core import events as ev
from simrun_core.fold import fold
from simrun_core.plugins import TaskType, check_workflow, load_task_types
from simrun_core.resources import resource_key
from simrun_core.snapshot_types import (
    ProbeAnswer,
    ProbedType,
    ProbeTask,
    recorded,
    task_type_of,
    types_of_run,
)
from simrun_core.workflow import TaskSpec, Workflow
from simrun_harness.types_probe import probe

TASKS = [
    ProbeTask(task="ok", type="demo.squares", settings={"n": 3, "sleep_s": 1}),
    ProbeTask(task="same", type="demo.squares", settings={"sleep_s": 1, "n": 3}),
    ProbeTask(task="bad", type="demo.squares", settings={"n": "x"}),
    ProbeTask(task="zero", type="demo.squares", settings={"n": 0}),
    ProbeTask(task="extra", type="demo.squares", settings={"n": 1, "colour": "red"}),
    ProbeTask(task="nope", type="no.such", settings={}),
]


def probed() -> ProbedType:
    return probe(TASKS).types["demo.squares"]


def workflow(*tasks: ProbeTask) -> Workflow:
    specs = [TaskSpec(id=task.task, type=task.type, settings=task.settings) for task in tasks]
    return Workflow(name="w", tasks=specs)


def test_the_probe_answers_the_types_metadata_and_each_settings_once() -> None:
    answer = probe(TASKS)
    assert answer.unknown == ["no.such"] and answer.errors == {}
    found = answer.types["demo.squares"]
    real = load_task_types()["demo.squares"]
    assert found.settings_model == "SquaresSettings"
    assert found.fields == ["n", "sleep_s", "fail_at", "memory_mb"]
    assert (found.inputs, found.outputs, found.hint) == (real.inputs, real.outputs, real.hint)
    assert found.count_units == real.count_units and found.merge == real.merge
    assert len(found.answers) == 4, "the same settings (in another order) are asked once"
    ok = found.answers[0]
    assert ok.decoded == {"n": 3, "sleep_s": 1.0, "fail_at": None, "memory_mb": 0}
    assert ok.units == 3


def test_a_probed_type_checks_as_the_plugin_does_without_its_code() -> None:
    task_type = task_type_of(probed())
    assert task_type.splittable and task_type.name == "demo.squares"
    types: dict[str, TaskType] = {"demo.squares": task_type}
    checked, problems = check_workflow(workflow(*TASKS[:5]), types)
    assert [check.spec.id for check in checked] == ["ok", "same"]
    assert checked[0].units == 3 and checked[0].settings.sleep_s == 1.0  # type: ignore[attr-defined]
    assert [problem.text() for problem in problems] == [
        "task 'bad': settings.n: expected `int`, got `str`",
        "task 'zero': settings: 0 units, at least 1 needed",
        "task 'extra': settings: unknown setting 'colour'",
    ]
    # The same as the plugin itself refuses them.
    real = check_workflow(workflow(*TASKS[:5]), load_task_types())[1]
    assert problems == real


def test_settings_the_probe_was_not_asked_about_are_refused() -> None:
    task_type = task_type_of(probed())
    unasked = ProbeTask(task="new", type="demo.squares", settings={"n": 9})
    [problem] = check_workflow(workflow(unasked), {"demo.squares": task_type})[1]
    assert "was not asked about these settings" in problem.text()


def test_units_a_plugin_failed_to_count_are_its_error() -> None:
    found = dataclasses.replace(
        probed(),
        answers=[msgspec.structs.replace(probed().answers[0], units=None, units_error="E: x")],
    )
    [problem] = check_workflow(workflow(TASKS[0]), {"demo.squares": task_type_of(found)})[1]
    assert problem.text() == "task 'ok': settings: counting its units failed: E: x"


def test_the_resource_key_is_the_plugins_with_its_decoded_cost_setting() -> None:
    real = load_task_types()["demo.squares"]
    real = dataclasses.replace(real, cost_setting="sleep_s")
    found = dataclasses.replace(probed(), cost_setting="sleep_s")
    proxy = task_type_of(found)
    settings = TASKS[0].settings
    expected = resource_key(real, settings, "model")
    assert expected.variant == "1.0", "the plugin decodes 1 to a float"
    assert resource_key(proxy, proxy.decode_settings(settings), "model") == expected


def test_the_submitted_event_carries_the_types_to_the_fold_and_the_run() -> None:
    types = recorded(probe(TASKS[:2]).types)
    submitted = ev.Submitted(
        seq=1,
        run="r",
        workflow=workflow(TASKS[0]),
        submitted_by="me",
        owner="me",
        snapshot_types=types,
    )
    line = ev.encode_event(submitted)
    record = fold([ev.decode_event(line)])
    assert record.snapshot_types == types
    service = load_task_types()
    del service["demo.squares"]
    of_run = types_of_run(service, record)
    assert isinstance(of_run["demo.squares"], type(task_type_of(types["demo.squares"])))
    assert of_run["command"] is service["command"], "the service's types stay the service's"
    plain = ev.Submitted(seq=1, run="r", workflow=workflow(), submitted_by="me", owner="me")
    assert b"snapshot_types" not in ev.encode_event(plain), "an optional field, left out"


def test_the_probe_reads_tasks_on_stdin_and_prints_its_answer() -> None:
    tasks = msgspec.json.encode([TASKS[0], TASKS[-1]])
    done = subprocess.run(
        [sys.executable, "-m", "simrun_harness.types_probe"],
        input=tasks,
        capture_output=True,
        check=True,
    )
    answer = msgspec.json.decode(done.stdout, type=ProbeAnswer)
    assert list(answer.types) == ["demo.squares"] and answer.unknown == ["no.such"]
    refused = subprocess.run(
        [sys.executable, "-m", "simrun_harness.types_probe"], input=b"{", capture_output=True
    )
    assert refused.returncode == 2 and b"the tasks on stdin" in refused.stderr


@pytest.mark.parametrize("error", [RuntimeError("boom"), ValueError("no TaskType")])
def test_a_type_that_cannot_be_loaded_is_named_with_its_error(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    import simrun_harness.types_probe as module

    def load(name: str) -> TaskType:
        raise error

    monkeypatch.setattr(module, "load_task_type", load)
    answer = module.probe([TASKS[0], TASKS[1]])
    assert answer.types == {}
    assert answer.errors == {"demo.squares": f"{type(error).__name__}: {error}"}
