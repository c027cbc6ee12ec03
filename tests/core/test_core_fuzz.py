"""Bad input never escapes as anything but a precise refusal: the loader and the decoder."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simrun_core.errors import WorkflowError
from simrun_core.plugins import load_task_types, validate_workflow
from simrun_core.workflow import Workflow, parse_workflow, workflow_from_data

TYPES = load_task_types()
VALID: dict[str, Any] = {
    "name": "fit",
    "split": "fastest",
    "tasks": [
        {"id": "scan", "type": "demo.squares", "settings": {"n": 10, "sleep_s": 0.1}},
        {
            "id": "report",
            "type": "command",
            "inputs": {"results": "scan.squares"},
            "settings": {"image": "i", "args": ["{input}"], "cores": 1, "memory_gb": 1.0},
        },
    ],
}
FUZZ = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=12)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def load(text: str) -> Workflow | None:
    """The workflow of a text, None when it is refused with a WorkflowError (never else)."""
    try:
        workflow = parse_workflow(text, "fuzz.yaml")
    except WorkflowError as error:
        assert str(error).startswith("fuzz.yaml: "), error
        return None
    validate_workflow(workflow, TYPES)
    return workflow


@FUZZ
@given(st.text(max_size=200))
def test_arbitrary_text_is_a_workflow_or_a_refusal(text: str) -> None:
    load(text)


@FUZZ
@given(values)
def test_arbitrary_yaml_is_a_workflow_or_a_refusal(value: Any) -> None:
    load(yaml.safe_dump(value))


paths = st.lists(
    st.sampled_from(
        [
            "tasks",
            0,
            1,
            "settings",
            "inputs",
            "id",
            "type",
            "n",
            "results",
            "args",
            "split",
            "name",
            "stage",
            "resources",
        ]
    ),
    min_size=1,
    max_size=4,
)


@FUZZ
@given(paths, values)
def test_a_mutated_valid_workflow_is_a_workflow_or_a_refusal(path: list[Any], value: Any) -> None:
    data = copy.deepcopy(VALID)
    target: Any = data
    for step in path[:-1]:
        try:
            target = target[step]
        except (KeyError, IndexError, TypeError):
            return
    try:
        target[path[-1]] = value
    except (IndexError, TypeError):
        return
    try:
        workflow = workflow_from_data(data, "mutated")
    except WorkflowError as error:
        assert str(error).startswith("mutated: ")
        return
    assert isinstance(workflow, Workflow)
    assert all(isinstance(error.text(), str) for error in validate_workflow(workflow, TYPES))


def test_the_valid_workflow_of_the_fuzz_is_valid() -> None:
    workflow = workflow_from_data(VALID)
    assert validate_workflow(workflow, TYPES) == []
