"""simrun_core.workflow: parsing, refusals, the compact YAML and the order of tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from simrun_core.errors import WorkflowError
from simrun_core.workflow import (
    MAX_NESTING,
    MAX_VALUES,
    ResourceOverride,
    SplitMode,
    TaskSpec,
    Workflow,
    checkable_workflow,
    decode_workflow,
    dump_workflow,
    load_workflow,
    load_workflow_data,
    parse_workflow,
    workflow_from_data,
    workflow_yaml,
)

DOCS_EXAMPLE = """\
name: hctz-fit
split: fastest
reserve: null
tasks:
  - id: scan
    type: sbmlsim.scan
    settings:
      n: 1000
    resources:
      memory_per_worker_gb: 4.0
      scratch_gb: 10
      gpus: 0
  - id: report
    type: sbmlsim.report
    inputs:
      results: scan.results
    stage: [results]
    split: single-server
  - id: plot
    type: command
    settings:
      image: registry.cluster.internal:5000/tools:1
      args: [plot, --all]
      cores: 2
      memory_gb: 4.0
"""


def refusal(text: str) -> str:
    """The message of the WorkflowError that parsing `text` as `f.yaml` raises."""
    with pytest.raises(WorkflowError) as info:
        parse_workflow(text, "f.yaml")
    return str(info.value)


def two_tasks(first: str, second: str) -> str:
    """A workflow text with two tasks whose bodies (indented 4) are given."""
    return f"name: w\ntasks:\n  - {first}\n  - {second}\n"


# --- parsing ------------------------------------------------------------------------------------


def test_parse_docs_example() -> None:
    workflow = parse_workflow(DOCS_EXAMPLE)
    assert workflow == Workflow(
        name="hctz-fit",
        split=SplitMode.FASTEST,
        reserve=None,
        tasks=[
            TaskSpec(
                id="scan",
                type="sbmlsim.scan",
                settings={"n": 1000},
                resources=ResourceOverride(memory_per_worker_gb=4.0, scratch_gb=10.0, gpus=0),
            ),
            TaskSpec(
                id="report",
                type="sbmlsim.report",
                inputs={"results": "scan.results"},
                stage=["results"],
                split=SplitMode.SINGLE_SERVER,
            ),
            TaskSpec(
                id="plot",
                type="command",
                settings={
                    "image": "registry.cluster.internal:5000/tools:1",
                    "args": ["plot", "--all"],
                    "cores": 2,
                    "memory_gb": 4.0,
                },
            ),
        ],
    )


def test_workflow_from_data_takes_decoded_json() -> None:
    data = {"name": "w", "tasks": [{"id": "a", "type": "command", "split": "single-server"}]}
    workflow = workflow_from_data(data)
    assert workflow.tasks == [TaskSpec(id="a", type="command", split=SplitMode.SINGLE_SERVER)]
    assert workflow.split is SplitMode.FASTEST
    assert workflow.reserve is None


# --- compact YAML and the round trip -------------------------------------------------------------


def test_workflow_yaml_is_compact_and_indents_sequences() -> None:
    workflow = Workflow(
        name="w",
        tasks=[
            TaskSpec(id="a", type="demo.squares", settings={"n": 3}),
            TaskSpec(
                id="b",
                type="command",
                settings={"args": ["plot", "--all"]},
                inputs={"squares": "a.squares"},
            ),
        ],
    )
    assert workflow_yaml(workflow) == (
        "name: w\n"
        "tasks:\n"
        "  - id: a\n"
        "    type: demo.squares\n"
        "    settings:\n"
        "      n: 3\n"
        "  - id: b\n"
        "    type: command\n"
        "    settings:\n"
        "      args:\n"
        "        - plot\n"
        "        - --all\n"
        "    inputs:\n"
        "      squares: a.squares\n"
    )


def test_workflow_yaml_writes_non_defaults() -> None:
    workflow = Workflow(
        name="w",
        split=SplitMode.SINGLE_SERVER,
        reserve="node-3",
        tasks=[
            TaskSpec(
                id="a",
                type="t",
                split=SplitMode.FASTEST,
                resources=ResourceOverride(workers=2),
                inputs={"x": "b.out"},
                stage=["x"],
            ),
            TaskSpec(id="b", type="t"),
        ],
    )
    assert workflow_yaml(workflow) == (
        "name: w\n"
        "tasks:\n"
        "  - id: a\n"
        "    type: t\n"
        "    inputs:\n"
        "      x: b.out\n"
        "    split: fastest\n"
        "    resources:\n"
        "      workers: 2\n"
        "    stage:\n"
        "      - x\n"
        "  - id: b\n"
        "    type: t\n"
        "split: single-server\n"
        "reserve: node-3\n"
    )


def test_workflow_yaml_always_writes_name_and_tasks() -> None:
    assert workflow_yaml(Workflow(name="", tasks=[])) == "name: ''\ntasks: []\n"


def test_dump_and_load_round_trip(tmp_path: Path) -> None:
    workflow = parse_workflow(DOCS_EXAMPLE)
    path = tmp_path / "fit.yaml"
    dump_workflow(workflow, path)
    assert path.read_text() == workflow_yaml(workflow)
    assert load_workflow(path) == workflow
    assert "reserve" not in path.read_text()
    assert "split: fastest" not in path.read_text()


def test_round_trip_keeps_strings_that_look_like_other_types() -> None:
    workflow = Workflow(
        name="yes",
        tasks=[TaskSpec(id="a", type="t", settings={"flag": "no", "version": "1.10", "n": "3"})],
    )
    assert parse_workflow(workflow_yaml(workflow)) == workflow


# --- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("task_id", ["Scan", "1scan", "scan_1", "-scan", "scan.x", ""])
def test_refuses_an_id_outside_the_pattern(task_id: str) -> None:
    message = refusal(f"name: w\ntasks:\n  - id: '{task_id}'\n    type: t\n")
    assert message == f"f.yaml: task {task_id!r}: id: must match [a-z][a-z0-9-]*"


def test_accepts_ids_of_the_pattern() -> None:
    workflow = parse_workflow(two_tasks("id: a\n    type: t", "id: fit-2b\n    type: t"))
    assert [task.id for task in workflow.tasks] == ["a", "fit-2b"]


def test_refuses_an_id_with_a_trailing_newline() -> None:
    message = refusal('name: w\ntasks:\n  - id: "scan\\n"\n    type: t\n')
    assert message == "f.yaml: task 'scan\\n': id: must match [a-z][a-z0-9-]*"


def test_refuses_a_duplicate_id() -> None:
    message = refusal(two_tasks("id: a\n    type: t", "id: a\n    type: u"))
    assert message == "f.yaml: task 'a': id: used twice"


def test_refuses_a_cycle_naming_its_tasks() -> None:
    text = (
        "name: w\ntasks:\n"
        "  - id: free\n    type: t\n"
        "  - id: a\n    type: t\n    inputs: {x: b.out}\n"
        "  - id: b\n    type: t\n    inputs: {y: a.out}\n"
    )
    assert refusal(text) == "f.yaml: the inputs of tasks 'a', 'b' form a cycle"


def test_cycle_message_names_only_the_tasks_of_the_cycle() -> None:
    text = (
        "name: w\ntasks:\n"
        "  - id: a\n    type: t\n    inputs: {x: b.out}\n"
        "  - id: b\n    type: t\n    inputs: {y: a.out}\n"
        "  - id: after\n    type: t\n    inputs: {z: a.out}\n"
    )
    assert refusal(text) == "f.yaml: the inputs of tasks 'a', 'b' form a cycle"


def test_refuses_an_input_naming_an_unknown_task() -> None:
    message = refusal(two_tasks("id: a\n    type: t", "id: b\n    type: t\n    inputs: {x: c.out}"))
    assert message == "f.yaml: task 'b': inputs.x: names unknown task 'c'"


@pytest.mark.parametrize("ref", ["a", "a.", ".out"])
def test_refuses_an_input_not_of_the_form_task_port(ref: str) -> None:
    text = two_tasks("id: a\n    type: t", f"id: b\n    type: t\n    inputs: {{x: '{ref}'}}")
    assert (
        refusal(text) == f"f.yaml: task 'b': inputs.x: {ref!r} is not of the form '<task>.<port>'"
    )


def test_refuses_an_input_reading_the_task_itself() -> None:
    message = refusal("name: w\ntasks:\n  - id: a\n    type: t\n    inputs: {x: a.out}\n")
    assert message == "f.yaml: task 'a': inputs.x: reads the task itself"


def test_refuses_a_stage_naming_no_input() -> None:
    text = two_tasks(
        "id: a\n    type: t", "id: b\n    type: t\n    inputs: {x: a.out}\n    stage: [x, y]"
    )
    assert refusal(text) == "f.yaml: task 'b': stage: names 'y', which is no input"


def test_reports_every_structural_error() -> None:
    text = (
        "name: w\ntasks:\n  - id: A\n    type: t\n  - id: b\n    type: t\n    inputs: {x: zz.out}\n"
    )
    assert refusal(text) == (
        "f.yaml: task 'A': id: must match [a-z][a-z0-9-]*\n"
        "f.yaml: task 'b': inputs.x: names unknown task 'zz'"
    )


def test_refuses_no_tasks() -> None:
    assert refusal("name: w\ntasks: []\n") == "f.yaml: tasks: a workflow needs at least one task"


def test_refuses_an_unknown_task_field_naming_field_and_task() -> None:
    message = refusal(two_tasks("id: a\n    type: t", "id: b\n    type: t\n    setings: {n: 1}"))
    assert message == "f.yaml: task 'b': setings: unknown field"


def test_refuses_an_unknown_top_level_field() -> None:
    message = refusal("name: w\nsplits: fastest\ntasks:\n  - id: a\n    type: t\n")
    assert message == "f.yaml: splits: unknown field"


def test_refuses_an_unknown_resource_field() -> None:
    message = refusal("name: w\ntasks:\n  - id: a\n    type: t\n    resources: {memory: 4}\n")
    assert message == "f.yaml: task 'a': resources.memory: unknown field"


def test_refuses_an_unknown_split_mode() -> None:
    message = refusal("name: w\nsplit: slowest\ntasks:\n  - id: a\n    type: t\n")
    assert message == "f.yaml: split: invalid enum value 'slowest'"


def test_refuses_a_missing_name() -> None:
    message = refusal("tasks:\n  - id: a\n    type: t\n")
    assert message == "f.yaml: name: missing, it is required"


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "", "42\n"])
def test_refuses_what_is_not_a_mapping(text: str) -> None:
    assert refusal(text) == "f.yaml: a workflow is a mapping with 'name' and 'tasks'"


def test_refuses_invalid_yaml_at_its_line_and_column() -> None:
    assert refusal("name: [w\ntasks: x\n") == (
        "f.yaml: line 2, column 6: not valid YAML: expected ',' or ']', but got ':' "
        "(while parsing a flow sequence)"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: w\x00\n", "f.yaml: line 1, column 8: not valid YAML: the character #x0000 is "),
        ("a: b: c\n", "f.yaml: line 1, column 5: not valid YAML: mapping values are not allowed"),
        ("a: !!foo x\n", "f.yaml: line 1, column 4: not valid YAML: could not determine a "),
    ],
)
def test_a_yaml_error_never_names_the_stream_of_the_parser(text: str, message: str) -> None:
    found = refusal(text)
    assert found.startswith(message) and "<unicode string>" not in found, found


def test_refuses_bytes_that_are_not_utf8_naming_the_byte() -> None:
    with pytest.raises(WorkflowError) as info:
        parse_workflow(b"name: w\ntasks: [\xff]\n", "f.yaml")
    assert str(info.value) == "f.yaml: not UTF-8 text: byte 0xff at offset 16"


def test_load_workflow_refuses_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    assert str(info.value) == f"{path}: not UTF-8 text: byte 0xe9 at offset 9"


@pytest.mark.parametrize(
    "text",
    [
        "[" * 5000 + "]" * 5000,
        "a: " + "{a: " * 3000 + "1" + "}" * 3000,
        "x:\n" + "".join("  " * i + "- \n" for i in range(1, 200)),
    ],
    ids=["flow-sequences", "flow-mappings", "block-sequences"],
)
def test_refuses_a_document_nested_thousands_of_levels_deep(text: str) -> None:
    message = refusal(text)
    assert message.startswith("f.yaml: line 1, column ") or message.startswith("f.yaml: line ")
    assert message.endswith(f"not a workflow: nested deeper than {MAX_NESTING} levels")


def test_refuses_aliases_that_expand_beyond_any_workflow() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    message = refusal("\n".join(lines) + "\n")
    assert message == (
        f"f.yaml: not a workflow: more than {MAX_VALUES:,} values "
        "(an alias of YAML counts as the values it repeats)"
    )


def test_refuses_a_recursive_alias() -> None:
    message = refusal("name: w\ntasks: &t [*t]\n")
    assert message == "f.yaml: not a workflow: a value contains itself (a recursive alias)"


def test_refuses_json_data_nested_deeper_than_the_limit() -> None:
    data: object = 1
    for _ in range(MAX_NESTING + 1):
        data = [data]
    workflow, problems = decode_workflow({"name": "w", "tasks": data})
    assert workflow is None
    assert [p.text() for p in problems] == [
        f"not a workflow: nested deeper than {MAX_NESTING} levels"
    ]


def test_lists_the_wrong_fields_of_every_task_at_once() -> None:
    text = (
        "name: w\nsplit: slowest\ntasks:\n"
        "  - {id: a, type: t, inputs: {x: 1}, stage: x}\n"
        "  - {type: 7, settings: []}\n"
        "  - just text\n"
        "  - {id: d, type: t, resources: {gpus: many, memory: 1}}\n"
    )
    assert refusal(text).splitlines() == [
        "f.yaml: split: invalid enum value 'slowest'",
        "f.yaml: task 'a': inputs.x: expected `str`, got `int`",
        "f.yaml: task 'a': stage: expected `array`, got `str`",
        "f.yaml: tasks[1]: id: missing, it is required",
        "f.yaml: tasks[1]: type: expected `str`, got `int`",
        "f.yaml: tasks[1]: settings: expected `object`, got `array`",
        "f.yaml: tasks[2]: a task is a mapping with 'id' and 'type', got str 'just text'",
        "f.yaml: task 'd': resources.memory: unknown field",
        "f.yaml: task 'd': resources.gpus: expected `int | null`, got `str`",
    ]


def test_a_checkable_workflow_leaves_out_the_wrong_fields() -> None:
    data = {
        "name": 5,
        "split": "slowest",
        "colour": "red",
        "tasks": [
            {"id": "a", "type": "t", "settings": {"n": "1"}, "resources": {"gpus": "many"}},
            {"id": "b", "type": "t", "inputs": {"x": "a.out"}, "stage": "x", "speed": 1},
        ],
    }
    assert decode_workflow(data)[0] is None
    assert checkable_workflow(data) == Workflow(
        name="",
        tasks=[
            TaskSpec(id="a", type="t", settings={"n": "1"}),
            TaskSpec(id="b", type="t", inputs={"x": "a.out"}),
        ],
    )


@pytest.mark.parametrize(
    "task",
    [
        {"type": "t"},
        {"id": 1, "type": "t"},
        {"id": "a", "type": ["t"]},
        {"id": "a", "type": "t", "settings": [1]},
        {"id": "a", "type": "t", "inputs": {"x": 1}},
        "text",
    ],
)
def test_no_checkable_workflow_without_a_tasks_id_type_settings_or_inputs(task: object) -> None:
    data = {"name": "w", "tasks": [{"id": "ok", "type": "t"}, task]}
    assert checkable_workflow(data) is None


@pytest.mark.parametrize("data", [None, [1], {"name": "w"}, {"name": "w", "tasks": {}}])
def test_no_checkable_workflow_of_data_of_the_wrong_shape(data: object) -> None:
    assert checkable_workflow(data) is None


def test_load_workflow_data_is_the_yaml_unchecked(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("name: w\ntasks: 3\n")
    assert load_workflow_data(path) == {"name": "w", "tasks": 3}
    path.write_text("name: [\n")
    with pytest.raises(WorkflowError, match=rf"^{path}: line 2, column 1: not valid YAML"):
        load_workflow_data(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: w\n", "f.yaml: tasks: missing, it is required"),
        ("name: w\ntasks: {a: 1}\n", "f.yaml: tasks: expected a sequence of tasks, got a mapping"),
        ("name: w\ntasks:\n", "f.yaml: tasks: expected a sequence of tasks, got nothing (null)"),
    ],
)
def test_refuses_tasks_that_are_no_sequence(text: str, message: str) -> None:
    assert refusal(text) == message


def test_load_workflow_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: w\ntasks:\n  - id: a\n    type: t\n  - id: a\n    type: t\n")
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    assert str(info.value) == f"{path}: task 'a': id: used twice"


def test_load_workflow_of_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(WorkflowError) as info:
        load_workflow(path)
    assert str(info.value) == f"{path}: cannot be read: No such file or directory"


# --- order, dependencies and lookup --------------------------------------------------------------


def ids(tasks: list[TaskSpec]) -> list[str]:
    return [task.id for task in tasks]


def test_order_keeps_file_order_of_independent_tasks() -> None:
    workflow = Workflow(name="w", tasks=[TaskSpec(id=i, type="t") for i in ("c", "a", "b")])
    assert ids(workflow.order()) == ["c", "a", "b"]


def test_order_puts_a_dependency_first() -> None:
    workflow = Workflow(
        name="w",
        tasks=[
            TaskSpec(id="report", type="t", inputs={"r": "scan.results"}),
            TaskSpec(id="scan", type="t"),
            TaskSpec(id="other", type="t"),
        ],
    )
    assert ids(workflow.order()) == ["scan", "report", "other"]


def test_order_of_a_diamond_is_stable() -> None:
    workflow = Workflow(
        name="w",
        tasks=[
            TaskSpec(id="join", type="t", inputs={"l": "left.out", "r": "right.out"}),
            TaskSpec(id="right", type="t", inputs={"x": "root.out"}),
            TaskSpec(id="left", type="t", inputs={"x": "root.out"}),
            TaskSpec(id="root", type="t"),
        ],
    )
    assert ids(workflow.order()) == ["root", "right", "left", "join"]


def test_order_raises_on_a_cycle() -> None:
    workflow = Workflow(
        name="w",
        tasks=[
            TaskSpec(id="a", type="t", inputs={"x": "b.out"}),
            TaskSpec(id="b", type="t", inputs={"x": "a.out"}),
        ],
    )
    with pytest.raises(WorkflowError, match=r"^the inputs of tasks 'a', 'b' form a cycle$"):
        workflow.order()


def test_dependencies_in_input_order_without_repeats() -> None:
    task = TaskSpec(
        id="c", type="t", inputs={"x": "b.out", "y": "a.results", "z": "b.other", "w": "a.out"}
    )
    assert task.dependencies() == ["b", "a"]
    assert TaskSpec(id="d", type="t").dependencies() == []


def test_task_lookup() -> None:
    workflow = Workflow(name="w", tasks=[TaskSpec(id="a", type="t"), TaskSpec(id="b", type="u")])
    assert workflow.task("b") == TaskSpec(id="b", type="u")
    with pytest.raises(WorkflowError, match=r"^workflow 'w' has no task 'zz'$"):
        workflow.task("zz")
