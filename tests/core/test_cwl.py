"""The CWL workflow of a run (`simrun_core.cwl`, spec 33): valid for cwl-utils, and doing what the
spec says on plain values: the steps of a split task (the coordinator, the scattered extra
workers that never fail the workflow, a merge of its own), one step of an unsplit task, the order
of the tasks, the store and the scratch as string inputs, the environment of the launch contract
and the image as a hint only. cwltool and Toil run the export in tests/cli/test_export.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from simrun_core import events as ev
from simrun_core import launch as contract
from simrun_core.cwl import (
    _REFERENCES,
    EVERY_EXIT_CODE,
    ToolTexts,
    export_cwl,
    planned_submission,
    to_cwl,
)
from simrun_core.errors import WorkflowError
from simrun_core.fold import RunRecord, fold
from simrun_core.planner import Node
from simrun_core.plugins import ResourceHint, TaskType
from simrun_core.provenance import SourceProvenance
from simrun_core.task_types.command import COMMAND
from simrun_core.task_types.demo import SQUARES
from simrun_core.workflow import TaskSpec, Workflow

cwl_parser = pytest.importorskip("cwl_utils.parser", reason="the optional extra cwl")
cwl_expression = pytest.importorskip("cwl_utils.expression", reason="the optional extra cwl")

RUN_ID = "20260102-030405-abcdef"
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
NODES = [Node(name=f"n{i}", cores=2, memory_gb=4.0) for i in (1, 2, 3)]
STORE = "/shared/store"


class ExecSettings(msgspec.Struct, forbid_unknown_fields=True):
    steps: int = 1


EXEC = TaskType(
    name="toy.exec",
    settings=ExecSettings,
    command=("python", "-m", "toy", "{settings}", "{out}"),
    hint=ResourceHint(memory_base_gb=0.5, memory_per_worker_gb=0.5),
    image="registry.example.org/toy:1",
)
TYPES = {SQUARES.name: SQUARES, COMMAND.name: COMMAND, EXEC.name: EXEC}


def squares(task_id: str, n: int, **inputs: str) -> TaskSpec:
    return TaskSpec(id=task_id, type="demo.squares", settings={"n": n}, inputs=inputs)


def reader(args: list[str] | None = None) -> TaskSpec:
    """A `command` task reading the squares of `left` and `right`."""
    return TaskSpec(
        id="both",
        type="command",
        inputs={"left": "left.squares", "right": "right.squares"},
        settings={
            "image": "python:3.11-slim",
            "args": args or ["python3", "sum.py", "{settings}", "{out}", "{input}"],
            "cores": 1,
            "memory_gb": 0.5,
        },
    )


WORKFLOWS = {
    "squares": Workflow(name="squares", tasks=[squares("squares", 100)]),
    "two-split-and-a-reader": Workflow(
        name="three", tasks=[squares("left", 40), squares("right", 25), reader()]
    ),
    "unsplit-plugin": Workflow(
        name="plugin", tasks=[squares("first", 10), TaskSpec(id="toy", type="toy.exec")]
    ),
}


def record_of(workflow: Workflow, nodes: list[Node] = NODES, **options: Any) -> RunRecord:
    submitted, _ = planned_submission(
        workflow, TYPES, nodes, run_id=RUN_ID, time=T0, submitted_by="mk", **options
    )
    return fold([submitted])


def steps_of(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["id"]: step for step in document["steps"]}


def env_of(step: dict[str, Any]) -> dict[str, str]:
    [requirement] = step["run"]["requirements"]
    assert requirement["class"] == "EnvVarRequirement"
    return {item["envName"]: item["envValue"] for item in requirement["envDef"]}


def after_of(step: dict[str, Any]) -> list[str]:
    link = step["in"].get("after")
    return [] if link is None else link["source"]


# -- valid CWL ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(WORKFLOWS))
def test_the_export_validates_with_cwl_utils(case: str, tmp_path: Path) -> None:
    document = to_cwl(record_of(WORKFLOWS[case]), TYPES, store=STORE)
    path = export_cwl(tmp_path / "run.cwl", document)
    loaded = cwl_parser.load_document_by_uri(path)
    assert loaded.class_ == "Workflow"
    assert [Path(step.id).name.split("#")[-1] for step in loaded.steps] == [
        step["id"] for step in document["steps"]
    ]
    assert yaml.safe_load(path.read_text()) == document
    cwltool = shutil.which("cwltool", path=str(Path(sys.executable).parent)) or shutil.which(
        "cwltool"
    )
    if cwltool is not None:  # and cwltool, which checks the links of the steps too
        checked = subprocess.run(
            [cwltool, "--validate", str(path)], capture_output=True, text=True, timeout=120
        )
        assert checked.returncode == 0, checked.stderr
        assert "is valid CWL" in checked.stdout + checked.stderr


def test_an_invalid_document_is_refused_and_not_left_behind(tmp_path: Path) -> None:
    document = to_cwl(record_of(WORKFLOWS["squares"]), TYPES)
    document["steps"][0]["run"]["class"] = "NoSuchTool"
    with pytest.raises(ValueError, match=r"no valid CWL v1\.2"):
        export_cwl(tmp_path / "run.cwl", document)
    assert not (tmp_path / "run.cwl").exists()


# -- the steps of a split task --------------------------------------------------------------------


def test_a_split_task_is_a_coordinator_and_scattered_extra_workers() -> None:
    record = record_of(WORKFLOWS["squares"])
    plan = record.plans["squares"]
    assert plan.pods == 3
    document = to_cwl(record, TYPES, store=STORE)
    steps = steps_of(document)
    assert list(steps) == ["squares-w0", "squares-extra"]
    w0, extra = steps["squares-w0"], steps["squares-extra"]
    assert w0["run"]["arguments"] == ["simrun-worker"] == extra["run"]["arguments"]
    assert "scatter" not in w0 and "successCodes" not in w0["run"]
    assert extra["scatter"] == "index"
    assert extra["in"]["index"] == {"default": [1, 2]}
    assert {"class": "ScatterFeatureRequirement"} in document["requirements"]
    # a failed extra worker, whatever its exit or signal, never fails the workflow
    codes = extra["run"]["successCodes"]
    assert codes == list(EVERY_EXIT_CODE)
    assert {0, 1, 3, 4, 137, 143, -9, -15} <= set(codes)
    assert env_of(w0)[contract.ROLE] == "base" and env_of(w0)[contract.MERGE] == "1"
    assert env_of(extra)[contract.ROLE] == "extra" and env_of(extra)[contract.MERGE] == "0"
    assert env_of(extra)[contract.WORKER] == "w$(inputs.index)"
    assert env_of(extra)[contract.SCRATCH] == f"$(inputs.scratch)/{RUN_ID}/squares/w$(inputs.index)"


def test_one_pod_has_no_extra_step() -> None:
    record = record_of(WORKFLOWS["squares"], nodes=NODES[:1])
    assert record.plans["squares"].pods == 1
    document = to_cwl(record, TYPES)
    assert list(steps_of(document)) == ["squares-w0"]
    assert {"class": "ScatterFeatureRequirement"} not in document["requirements"]


def test_a_plan_whose_coordinator_does_not_merge_has_a_merge_step_after_it() -> None:
    record = record_of(WORKFLOWS["two-split-and-a-reader"])
    record.plans["left"] = msgspec.structs.replace(record.plans["left"], coordinator_merges=False)
    steps = steps_of(to_cwl(record, TYPES))
    assert list(steps) == [
        "left-w0",
        "left-extra",
        "left-merge",
        "right-w0",
        "right-extra",
        "both",
    ]
    merge = steps["left-merge"]
    assert merge["run"]["arguments"] == ["simrun-merge"]
    assert after_of(merge) == ["left-w0/log"]
    assert env_of(steps["left-w0"])[contract.MERGE] == "0"
    assert env_of(merge)[contract.WORKER] == "merge"
    assert env_of(merge)[contract.SCRATCH] == f"$(inputs.scratch)/{RUN_ID}/left/merge"
    assert merge["run"]["hints"][-1]["coresMin"] == 1
    # the reader waits for the merge of left, for the coordinator of right (which merges)
    assert after_of(steps["both"]) == ["left-merge/log", "right-w0/log"]


# -- tasks, their order and their commands ---------------------------------------------------------


def test_a_task_waits_for_the_merges_of_the_tasks_it_reads() -> None:
    steps = steps_of(to_cwl(record_of(WORKFLOWS["two-split-and-a-reader"]), TYPES))
    assert after_of(steps["left-w0"]) == [] == after_of(steps["left-extra"])
    both = steps["both"]
    assert after_of(both) == ["left-w0/log", "right-w0/log"]
    assert both["in"]["after"]["linkMerge"] == "merge_flattened"
    for step in steps.values():
        assert step["out"] == ["log"]
        assert step["run"]["outputs"] == {"log": "stdout"}


def test_a_command_task_runs_its_argv_with_paths_below_the_store() -> None:
    steps = steps_of(to_cwl(record_of(WORKFLOWS["two-split-and-a-reader"]), TYPES))
    task_dir = f"$(inputs.store)/runs/{RUN_ID}/tasks/both"
    assert steps["both"]["run"]["arguments"] == [
        "python3",
        "sum.py",
        f"{task_dir}/settings.json",
        f"{task_dir}/out",
        f"left=$(inputs.store)/runs/{RUN_ID}/tasks/left/out/squares",
        f"right=$(inputs.store)/runs/{RUN_ID}/tasks/right/out/squares",
    ]
    assert steps["both"]["run"]["baseCommand"][:2] == ["sh", "-c"]
    assert env_of(steps["both"])[contract.SCRATCH] == f"$(inputs.scratch)/{RUN_ID}/both"


def evaluated(field: str, inputs: dict[str, Any]) -> Any:
    """A field of a tool as cwltool evaluates it (cwl-utils' `do_eval`, CWL v1.2)."""
    return cwl_expression.do_eval(field, inputs, [], None, None, {}, cwlVersion="v1.2")


def test_literal_text_of_a_command_reaches_it_unchanged() -> None:
    args = ["echo", "$(inputs.store) ${{x}} \\$( a\\b", "{out}", "a\\b", " {out} $x "]
    workflow = Workflow(name="w", tasks=[squares("left", 2), squares("right", 2), reader(args)])
    tool = steps_of(to_cwl(record_of(workflow), TYPES))["both"]["run"]
    out = f"$(inputs.store)/runs/{RUN_ID}/tasks/both/out"
    assert tool["arguments"] == [
        "echo",
        "$(inputs.text1)",
        out,
        "a\\b",  # not interpolated: taken as it is
        "$(inputs.text2)$(inputs.store)$(inputs.text3)",
    ]
    defaults = {name: tool["inputs"][name]["default"] for name in ("text1", "text2", "text3")}
    assert defaults == {
        "text1": "$(inputs.store) ${x} \\$( a\\b",
        "text2": " ",
        "text3": f"/runs/{RUN_ID}/tasks/both/out $x ",
    }
    values = [evaluated(field, {"store": "/s", **defaults}) for field in tool["arguments"]]
    task_dir = f"/s/runs/{RUN_ID}/tasks/both"
    assert values == [
        "echo",
        "$(inputs.store) ${x} \\$( a\\b",
        f"{task_dir}/out",
        "a\\b",
        f" {task_dir}/out $x ",
    ]


@given(
    st.lists(
        st.one_of(
            st.sampled_from(sorted(_REFERENCES)), st.text(st.characters(exclude_characters="\x00"))
        ),
        max_size=6,
    )
)
def test_every_text_reads_back_as_it_was(pieces: list[str]) -> None:
    texts = ToolTexts()
    field = texts.field("".join(pieces))
    values = {"store": "/shared/store", "scratch": "/tmp/s", "index": 3}
    inputs = {**values, **{name: spec["default"] for name, spec in texts.inputs.items()}}
    names = dict(zip(_REFERENCES, values, strict=True))
    expected = "".join(str(values[names[p]]) if p in names else p for p in pieces)
    assert str(evaluated(field, inputs)) == expected


def test_an_unsplit_plugin_task_runs_simrun_exec() -> None:
    steps = steps_of(to_cwl(record_of(WORKFLOWS["unsplit-plugin"]), TYPES))
    toy = steps["toy"]
    assert toy["run"]["arguments"] == ["simrun-exec"]
    env = env_of(toy)
    assert env[contract.ENTRY] == "exec" and env[contract.WORKER] == "toy"
    assert env[contract.ROLE] == "base"
    assert env[contract.SCRATCH] == f"$(inputs.scratch)/{RUN_ID}/toy"
    assert "scatter" not in toy and "successCodes" not in toy["run"]


# -- the inputs, the environment, the hints --------------------------------------------------------


def test_store_and_scratch_are_string_inputs_written_in_place() -> None:
    document = to_cwl(record_of(WORKFLOWS["squares"]), TYPES, store=STORE, scratch="/local")
    inputs = document["inputs"]
    assert inputs["store"]["type"] == "string" and inputs["store"]["default"] == STORE
    assert inputs["scratch"] == {**inputs["scratch"], "type": "string", "default": "/local"}
    assert "default" not in to_cwl(record_of(WORKFLOWS["squares"]), TYPES)["inputs"]["store"]
    assert document["outputs"] == {}
    assert {"class": "WorkReuse", "enableReuse": False} in document["hints"]
    for step in document["steps"]:
        assert step["in"]["store"] == "store" and step["in"]["scratch"] == "scratch"
        assert step["run"]["inputs"]["store"] == "string"
        assert not any(
            r["class"] == "InitialWorkDirRequirement" for r in step["run"]["requirements"]
        )


def test_the_environment_is_the_launch_contract_of_the_step() -> None:
    """With the references replaced by a store and a scratch, a step's variables are those of
    `launch_for`, as a local process and a pod have them (but the node: the host's name)."""
    record = record_of(WORKFLOWS["squares"])
    steps = steps_of(to_cwl(record, TYPES, grace_s=30))
    for step, worker in (("squares-w0", "w0"), ("squares-extra", "w2")):
        env = {
            key: value.replace("$(inputs.store)", STORE)
            .replace("$(inputs.scratch)", "/local")
            .replace("$(inputs.index)", "2")
            for key, value in env_of(steps[step]).items()
        }
        expected = contract.launch_for(
            record,
            "squares",
            worker,
            0,
            task_type=SQUARES,
            store=STORE,
            scratch=f"/local/{RUN_ID}/squares/{worker}",
            node="ignored",
            cores=record.plans["squares"].shape.cores,
            grace_s=30,
            memory_source="process",
            memory_enforced=True,
            retry_memory=False,
        ).to_env()
        del expected[contract.NODE]
        assert env == expected
        assert env[contract.MEMORY_ENFORCED] == "1"  # a Slurm job's memory is one to keep
        launch = contract.Launch.from_env(env)
        assert launch.task_dir == f"{STORE}/runs/{RUN_ID}/tasks/squares"
        assert launch.worker == worker


def test_the_model_root_is_on_the_python_path() -> None:
    snapshot = SourceProvenance(name="model", snapshot="snapshots/model/abc123")
    record = record_of(WORKFLOWS["squares"], sources=[snapshot])
    [w0, _] = to_cwl(record, TYPES)["steps"]
    assert env_of(w0)["PYTHONPATH"] == "$(inputs.store)/snapshots/model/abc123"
    tree = SourceProvenance(name="model", path="/home/mk/model $(x)")
    [w0, _] = to_cwl(record_of(WORKFLOWS["squares"], sources=[tree]), TYPES)["steps"]
    assert env_of(w0)["PYTHONPATH"] == "$(inputs.text1)"
    assert w0["run"]["inputs"]["text1"] == {"type": "string", "default": "/home/mk/model $(x)"}
    assert contract.EDITABLE not in env_of(w0)


def test_the_image_is_only_a_hint_and_the_plan_a_resource_hint() -> None:
    record = record_of(WORKFLOWS["unsplit-plugin"])
    steps = steps_of(to_cwl(record, TYPES))
    first = steps["first-w0"]["run"]
    assert [hint["class"] for hint in first["hints"]] == ["ResourceRequirement"]
    toy = steps["toy"]["run"]
    docker, resources = toy["hints"]
    assert docker == {"class": "DockerRequirement", "dockerPull": "registry.example.org/toy:1"}
    shape = record.plans["toy"].shape
    assert resources == {
        "class": "ResourceRequirement",
        "coresMin": shape.cores,
        "ramMin": shape.memory_gb * 1024,
    }
    for step in steps.values():
        assert all(r["class"] != "DockerRequirement" for r in step["run"]["requirements"])
    both = steps_of(to_cwl(record_of(WORKFLOWS["two-split-and-a-reader"]), TYPES))["both"]
    assert both["run"]["hints"][0] == {
        "class": "DockerRequirement",
        "dockerPull": "python:3.11-slim",
    }


# -- refusals -----------------------------------------------------------------------------------


def test_a_task_without_a_plan_or_type_is_refused_naming_it() -> None:
    record = record_of(WORKFLOWS["squares"])
    with pytest.raises(WorkflowError, match=r"task 'squares'.*unknown task type"):
        to_cwl(record, {})
    del record.plans["squares"]
    with pytest.raises(WorkflowError, match="task 'squares': the run has no plan"):
        to_cwl(record, TYPES)


def test_a_step_id_of_two_tasks_is_refused() -> None:
    workflow = Workflow(name="w", tasks=[squares("a", 10), TaskSpec(id="a-w0", type="toy.exec")])
    with pytest.raises(WorkflowError, match="CWL step 'a-w0' is also one of task 'a'"):
        to_cwl(record_of(workflow), TYPES)


def test_staging_a_port_which_is_no_input_is_refused() -> None:
    record = record_of(WORKFLOWS["squares"])
    task = msgspec.structs.replace(record.workflow.tasks[0], stage=["after"])
    record.workflow = msgspec.structs.replace(record.workflow, tasks=[task])
    with pytest.raises(WorkflowError, match="stages the port 'after', which is no input"):
        to_cwl(record, TYPES)


def test_planning_refuses_a_reservation_and_what_fits_nowhere() -> None:
    reserving = msgspec.structs.replace(WORKFLOWS["squares"], reserve="n1")
    with pytest.raises(WorkflowError, match="cannot reserve a node"):
        record_of(reserving)
    with pytest.raises(WorkflowError, match="task 'both'"):
        record_of(
            WORKFLOWS["two-split-and-a-reader"], nodes=[Node(name="t", cores=1, memory_gb=0.2)]
        )


def test_the_submission_has_the_settings_as_written() -> None:
    submitted, settings = planned_submission(
        WORKFLOWS["two-split-and-a-reader"],
        TYPES,
        NODES,
        run_id=RUN_ID,
        time=T0,
        submitted_by="mk",
        group="study",
    )
    assert submitted.backend == "cwl" and submitted.group == "study" and submitted.seq == 1
    assert submitted.writer is ev.Writer.EXPORT, "the export writes its log, no service"
    assert fold([submitted]).writer is ev.Writer.EXPORT
    assert settings["left"] == {"n": 40}
    assert settings["both"]["image"] == "python:3.11-slim"
    assert set(submitted.plans) == {"left", "right", "both"}
