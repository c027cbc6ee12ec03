"""The Argo Workflow of a run (`simrun_core.argo`): valid against Argo's schema and CRD, and doing
what the spec says on plain values: the DAG, the environment of the launch contract, the retries
the decider would make, the memory after a kill, the labels.

The committed `squares.argo.yaml` beside this file is the Workflow of `examples/squares.yaml`;
after a change of the manifests, review the difference and regenerate it:

    SIMRUN_UPDATE_MANIFESTS=1 python -m pytest tests/core/test_core_argo.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import reference_schemas as schemas
import yaml
from argo_cases import (
    CONFIG,
    GROUP,
    IMAGE,
    NODES,
    RUN_ID,
    TYPES,
    WORKFLOWS,
    command,
    dag_of,
    env_of,
    expected_env,
    legacy_merge_record,
    manifest_of,
    pod_spec,
    pods_of,
    record_of,
    squares,
    template_of,
    worker_of,
)
from argo_expressions import evaluate, substitute
from hypothesis import given
from hypothesis import strategies as st

from simrun_core import exits
from simrun_core import launch as contract
from simrun_core.argo import labels, render_run, workflow_manifest, workflow_name
from simrun_core.argo.render import render_record
from simrun_core.argo.retry import RETRY_EXPRESSION, RETRY_LIMIT
from simrun_core.argo.status import first_attempts
from simrun_core.cluster import ClusterConfig
from simrun_core.decider import STOP_RETRIES, decide_retry
from simrun_core.errors import WorkflowError
from simrun_core.plugins import load_task_types
from simrun_core.provenance import SourceProvenance
from simrun_core.workflow import TaskSpec, Workflow, load_workflow

ROOT = Path(__file__).parents[2]
GOLDEN = Path(__file__).with_name("squares.argo.yaml")


def manifest_of_case(case: str) -> dict[str, Any]:
    """The Workflow of one of `WORKFLOWS`, of the legacy merge node, or of the squares example."""
    if case == "merge-node":
        return manifest_of(legacy_merge_record())
    if case == "rendered-squares":
        return yaml.safe_load(_golden_text())
    return manifest_of(record_of(case))


# -- valid against the schemas ------------------------------------------------------------------


@pytest.fixture(scope="session")
def argo_schema():
    return schemas.argo_schema()


@pytest.fixture(scope="session")
def argo_crd():
    return schemas.argo_crd()


@pytest.fixture(scope="session")
def patch_schema():
    return schemas.pod_spec_patch_schema()


@pytest.mark.parametrize("case", [*WORKFLOWS, "merge-node", "rendered-squares"])
def test_every_workflow_is_valid_against_the_schema_and_the_crd(case, argo_schema, argo_crd):
    manifest = manifest_of_case(case)
    assert manifest["apiVersion"] == "argoproj.io/v1alpha1"
    assert manifest["kind"] == "Workflow"
    assert schemas.errors(argo_schema, manifest) == []
    assert schemas.errors(argo_crd, manifest) == []


def test_the_strict_schemas_refuse_a_misspelt_field(argo_schema, argo_crd):
    manifest = manifest_of(record_of("split"))
    manifest["spec"]["entrypointt"] = manifest["spec"].pop("entrypoint")
    assert any("entrypointt" in error for error in schemas.errors(argo_schema, manifest))
    assert any("entrypointt" in error for error in schemas.errors(argo_crd, manifest))


@pytest.mark.parametrize("case", ["split", "gpu", "unsplit-plugin"])
@pytest.mark.parametrize("last_exit", ["0", "137", "143", "-1"])
def test_every_pod_spec_patch_is_a_valid_part_of_a_pod_spec(case, last_exit, patch_schema):
    manifest = manifest_of(record_of(case))
    for template in manifest["spec"]["templates"]:
        if "podSpecPatch" in template:
            patch = json.loads(
                substitute(template["podSpecPatch"], {"lastRetry.exitCode": last_exit})
            )
            assert schemas.errors(patch_schema, patch) == []


# -- the DAG --------------------------------------------------------------------------------------


def test_a_split_task_is_its_coordinator_and_extra_workers_over_a_sequence():
    record = record_of("split")
    dag = dag_of(manifest_of(record))
    assert record.plans["squares"].pods == 3
    assert list(dag) == ["squares-w0", "squares-extra"]
    coordinator, extra = dag["squares-w0"], dag["squares-extra"]
    assert coordinator["template"] == extra["template"]
    assert "continueOn" not in coordinator and "withSequence" not in coordinator
    assert extra["continueOn"] == {"failed": True, "error": True}
    assert extra["withSequence"] == {"start": "1", "count": "2"}
    arguments = {a["name"]: a["value"] for a in coordinator["arguments"]["parameters"]}
    assert arguments == {
        "worker": "w0",
        "role": "base",
        "merge": "1",
        "priority": "simrun-standard-base",
    }
    arguments = {a["name"]: a["value"] for a in extra["arguments"]["parameters"]}
    assert arguments == {
        "worker": "w{{item}}",
        "role": "extra",
        "merge": "0",
        "priority": "simrun-standard-extra",
    }


def test_a_task_of_one_pod_has_no_extra_workers():
    assert list(dag_of(manifest_of(record_of("single-pod")))) == ["squares-w0"]


def test_the_dependencies_follow_the_inputs_a_split_task_read_at_its_coordinator():
    dag = dag_of(manifest_of(record_of("two-inputs")))
    assert "dependencies" not in dag["first-w0"] and "dependencies" not in dag["second-extra"]
    assert dag["both"]["dependencies"] == ["first-w0", "second-w0"]
    dag = dag_of(manifest_of(record_of("unsplit-plugin")))
    assert dag["report"]["dependencies"] == ["squares-w0"]


def test_extra_workers_wait_for_the_inputs_of_their_task_too():
    workflow = Workflow(
        name="chain", tasks=[squares("a"), squares("b", inputs={"after": "a.squares"})]
    )
    record = render_record(workflow, TYPES, CONFIG, nodes=NODES, run_id=RUN_ID, image=IMAGE)
    dag = dag_of(manifest_of(record))
    assert dag["b-w0"]["dependencies"] == ["a-w0"]
    assert dag["b-extra"]["dependencies"] == ["a-w0"]


def test_a_plan_whose_coordinator_does_not_merge_has_a_merge_node_its_readers_wait_for():
    record = legacy_merge_record()
    manifest = manifest_of(record)
    dag = dag_of(manifest)
    assert dag["first-merge"]["dependencies"] == ["first-w0"]
    assert dag["both"]["dependencies"] == ["first-merge", "second-w0"]
    merge = template_of(manifest, dag["first-merge"]["template"])
    assert merge["container"]["command"] == ["simrun-merge"]
    assert merge["priorityClassName"] == record.plans["first"].base_priority
    assert merge["container"]["resources"]["limits"]["cpu"] == "1"
    coordinator = pod_spec(manifest, "first-w0", None, 0, "0")
    assert env_of(coordinator["containers"][0], "n")[contract.MERGE] == "0"


def test_a_dag_node_named_as_another_tasks_is_refused():
    workflow = Workflow(
        name="clash",
        tasks=[
            squares("a"),
            TaskSpec(id="a-w0", type="command", settings=command(["x"])),
        ],
    )
    record = render_record(workflow, TYPES, CONFIG, nodes=NODES, run_id=RUN_ID, image=IMAGE)
    with pytest.raises(WorkflowError, match="task 'a-w0': id: its DAG node 'a-w0'"):
        manifest_of(record)


# -- the pods ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [*WORKFLOWS, "merge-node"])
def test_every_pod_requests_what_it_limits(case):
    record = legacy_merge_record() if case == "merge-node" else record_of(case)
    manifest = manifest_of(record)
    for node_name, item in pods_of(manifest):
        for last_exit in ("0", "137"):
            resources = pod_spec(manifest, node_name, item, 1, last_exit)["containers"][0][
                "resources"
            ]
            assert resources["requests"] == resources["limits"]


def test_a_pod_requests_its_plans_cores_memory_gpus_and_scratch():
    record = record_of("gpu")
    shape = record.plans["train"].shape
    container = pod_spec(manifest_of(record), "train", None, 0, "0")["containers"][0]
    assert container["resources"]["limits"] == {
        "cpu": str(shape.cores),
        "memory": f"{shape.memory_gb}Gi",
        "nvidia.com/gpu": "1",
        "ephemeral-storage": "20992Mi",
    }
    assert container["image"] == "tools:1"


@pytest.mark.parametrize("case", [*WORKFLOWS, "merge-node"])
def test_the_env_of_every_pod_is_the_launch_env_of_its_worker(case):
    record = legacy_merge_record() if case == "merge-node" else record_of(case)
    manifest = manifest_of(record)
    for node_name, item in pods_of(manifest):
        task_id, worker = worker_of(record, node_name, item)
        for attempt, last_exit, retry_memory in (
            (0, "0", False),
            (2, "143", False),
            (3, "137", True),
        ):
            container = pod_spec(manifest, node_name, item, attempt, last_exit)["containers"][0]
            env = env_of(container, "node-7")
            assert env == expected_env(record, task_id, worker, attempt, "node-7", retry_memory)


MODEL_SNAPSHOT = "snapshots/model/" + "1a2b" * 16
LIBRARY_SNAPSHOT = "snapshots/pkpdsim/" + "3c4d" * 16


def test_the_model_of_the_run_is_first_on_the_python_path():
    record = record_of("split")
    record.image = None  # the default image: nothing installed at the start of a pod
    record.sources = [SourceProvenance(name="model", path="/home/a/model", snapshot=MODEL_SNAPSHOT)]
    container = pod_spec(in_default_image(record), "squares-w0", None, 0, "0")["containers"][0]
    env = env_of(container, "n")
    assert env.pop("PYTHONPATH") == f"/store/{MODEL_SNAPSHOT}"
    assert env == expected_env(record, "squares", "w0", 0, "n", False)
    record.sources = [SourceProvenance(name="model", path="/home/a/model")]  # recorded only
    container = pod_spec(in_default_image(record), "squares-w0", None, 0, "0")["containers"][0]
    assert env_of(container, "n")["PYTHONPATH"] == "/home/a/model"


@pytest.mark.parametrize("case", ["split", "unsplit-plugin", "two-inputs", "merge-node"])
def test_every_pod_in_the_image_of_the_environment_installs_the_snapshots_of_the_run(case):
    record = legacy_merge_record() if case == "merge-node" else record_of(case)
    record.sources = [
        SourceProvenance(name="model", snapshot=MODEL_SNAPSHOT),
        SourceProvenance(name="notes", path="/home/a/notes"),  # recorded, not snapshotted
        SourceProvenance(name="pkpdsim", snapshot=LIBRARY_SNAPSHOT),
    ]
    manifest = manifest_of(record)
    in_image = 0
    for node_name, item in pods_of(manifest):
        task_id, _ = worker_of(record, node_name, item)
        for attempt, last_exit in ((0, "0"), (3, "137")):
            container = pod_spec(manifest, node_name, item, attempt, last_exit)["containers"][0]
            env = env_of(container, "n")
            if record.workflow.task(task_id).type == "command":  # its own image, no harness
                assert container["image"] == "tools:1" and contract.EDITABLE not in env
                continue
            in_image += 1
            assert container["image"] == IMAGE
            assert env[contract.EDITABLE].splitlines() == [
                f"/store/{MODEL_SNAPSHOT}",
                f"/store/{LIBRARY_SNAPSHOT}",
            ]
            assert contract.Launch.from_env(env).editable == (
                f"/store/{MODEL_SNAPSHOT}",
                f"/store/{LIBRARY_SNAPSHOT}",
            )
    assert in_image
    record.image = None  # the service's default image has none of their dependencies
    manifest = in_default_image(record)
    for node_name, item in pods_of(manifest):
        container = pod_spec(manifest, node_name, item, 0, "0")["containers"][0]
        assert contract.EDITABLE not in env_of(container, "n")


def in_default_image(record):
    return workflow_manifest(record, TYPES, CONFIG, default_image="simrun:default")


def test_a_pod_of_a_type_with_an_image_of_its_own_installs_no_snapshot():
    own = dataclasses.replace(TYPES["test.report"], image="report-tools:2")
    record = record_of("unsplit-plugin")
    record.sources = [SourceProvenance(name="model", snapshot=MODEL_SNAPSHOT)]
    manifest = workflow_manifest(record, {**TYPES, "test.report": own}, CONFIG)
    container = pod_spec(manifest, "report", None, 0, "0")["containers"][0]
    assert container["image"] == "report-tools:2"
    assert contract.EDITABLE not in env_of(container, "n")
    split = pod_spec(manifest, "squares-w0", None, 0, "0")["containers"][0]
    assert contract.EDITABLE in env_of(split, "n")


def test_the_commands_are_the_harness_entries_and_a_commands_argv_as_the_pod_sees_it():
    manifest = manifest_of(record_of("two-inputs"))
    assert pod_spec(manifest, "first-w0", None, 0, "0")["containers"][0]["command"] == [
        "simrun-worker"
    ]
    task_dir = f"/store/runs/{RUN_ID}/tasks"
    assert pod_spec(manifest, "both", None, 0, "0")["containers"][0]["command"] == [
        "sum",
        f"--input=a={task_dir}/first/out/squares",
        f"--input=b={task_dir}/second/out/squares",
        f"--out={task_dir}/both/out",
    ]
    manifest = manifest_of(record_of("unsplit-plugin"))
    assert pod_spec(manifest, "report", None, 0, "0")["containers"][0]["command"] == ["simrun-exec"]


def test_a_dollar_of_a_command_reaches_the_process_unexpanded():
    workflow = Workflow(
        name="dollar",
        tasks=[TaskSpec(id="cost", type="command", settings=command(["echo", "$(HOME)$$"]))],
    )
    record = render_record(workflow, TYPES, CONFIG, nodes=NODES, run_id=RUN_ID)
    container = pod_spec(manifest_of(record), "cost", None, 0, "0")["containers"][0]
    assert container["command"] == ["echo", "$$(HOME)$$$$"]  # the kubelet makes $$ a $


def test_the_store_and_the_scratch_are_mounted_as_the_spec_says():
    record = record_of("split")
    manifest = manifest_of(record)
    assert manifest["spec"]["volumes"] == [
        {"name": "store", "persistentVolumeClaim": {"claimName": "simrun-store"}},
        {"name": "scratch", "hostPath": {"path": "/scratch", "type": "DirectoryOrCreate"}},
    ]
    container = pod_spec(manifest, "squares-extra", 2, 0, "0")["containers"][0]
    assert container["volumeMounts"] == [
        {"name": "store", "mountPath": f"/store/runs/{RUN_ID}", "subPath": f"runs/{RUN_ID}"},
        {
            "name": "store",
            "mountPath": "/store/snapshots",
            "subPath": "snapshots",
            "readOnly": True,
        },
        {"name": "scratch", "mountPath": "/scratch", "subPath": f"{RUN_ID}/squares/w2"},
    ]
    plot = pod_spec(manifest_of(record_of("command")), "plot", None, 0, "0")["containers"][0]
    assert plot["volumeMounts"][2]["subPath"] == f"{RUN_ID}/plot"


def test_the_priorities_queue_and_topology_of_coordinator_and_extra_workers():
    manifest = manifest_of(record_of("split"))
    for node_name, item, priority in (
        ("squares-w0", None, "simrun-standard-base"),
        ("squares-extra", 1, "simrun-standard-extra"),
    ):
        pod = pod_spec(manifest, node_name, item, 0, "0")
        assert pod["priorityClassName"] == priority
        assert pod["metadata"]["labels"] == {
            "kueue.x-k8s.io/queue-name": "simrun",
            "kueue.x-k8s.io/priority-class": priority,
            "simrun/task": "squares",
        }
        assert pod["metadata"]["annotations"] == {
            "kueue.x-k8s.io/podset-required-topology": "kubernetes.io/hostname"
        }
        assert pod["terminationGracePeriodSeconds"] == 90


def test_a_reserved_run_selects_and_tolerates_its_node():
    spec = manifest_of(record_of("reservation"))["spec"]
    assert spec["nodeSelector"] == {"simrun/reserved": RUN_ID}
    assert spec["tolerations"] == [{"key": "simrun/reserved", "operator": "Equal", "value": RUN_ID}]
    assert "nodeSelector" not in manifest_of(record_of("split"))["spec"]


def test_the_workflow_is_named_and_labelled_by_its_run_and_kept_for_the_ttl():
    manifest = manifest_of(record_of("group"))
    metadata = manifest["metadata"]
    assert metadata["name"] == f"simrun-{RUN_ID}" == workflow_name(RUN_ID)
    assert metadata["namespace"] == "simrun"
    assert metadata["labels"]["simrun/run"] == RUN_ID
    assert metadata["labels"]["simrun/group"] == labels.label_value(GROUP)
    assert metadata["annotations"] == {"simrun/group": GROUP}
    assert manifest["spec"]["podMetadata"] == {
        "labels": metadata["labels"],
        "annotations": metadata["annotations"],
    }
    assert manifest["spec"]["ttlStrategy"] == {"secondsAfterCompletion": 86400}
    assert manifest["spec"]["serviceAccountName"] == "simrun-workflow"


def test_a_run_id_that_makes_no_name_is_refused():
    with pytest.raises(ValueError, match="no DNS-1123 label"):
        workflow_name("Run_1")


@pytest.mark.parametrize("case", [*WORKFLOWS, "merge-node"])
def test_every_label_of_every_pod_is_valid(case):
    record = legacy_merge_record() if case == "merge-node" else record_of(case)
    manifest = manifest_of(record)
    found = [manifest["metadata"]["labels"], manifest["spec"]["podMetadata"]["labels"]]
    found += [
        pod_spec(manifest, name, item, 0, "0")["metadata"]["labels"]
        for name, item in pods_of(manifest)
    ]
    selector = manifest["spec"].get("nodeSelector", {})
    for values in [*found, selector]:
        for key, value in values.items():
            assert re.fullmatch(r"([a-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", key)
            assert labels.is_label_value(value), (key, value)


def test_a_workflow_without_an_image_is_refused_naming_the_task():
    record = record_of("split")
    record.image = None
    with pytest.raises(WorkflowError, match="task 'squares': no image"):
        manifest_of(record)
    assert workflow_manifest(record, TYPES, CONFIG, default_image="default:1")


# -- the retries --------------------------------------------------------------------------------


def argo_retries(exit_code: str) -> bool:
    decision = evaluate(RETRY_EXPRESSION, {"lastRetry.exitCode": exit_code})
    assert isinstance(decision, bool)
    return decision


@pytest.mark.parametrize(
    ("code", "oom", "retried"),
    [
        (0, False, False),
        (1, False, False),
        (3, False, False),
        (4, False, False),
        (137, True, True),
        (137, False, True),
        (143, False, True),
    ],
)
def test_argo_retries_an_attempt_as_the_decider_does(code, oom, retried):
    decision = decide_retry(code, oom, on_retry_memory=False, stops=0, retry_per_worker_gb=1.5)
    assert decision.retry is retried
    assert argo_retries(str(code)) is retried


def test_argo_retries_every_exit_code_as_the_decider_retries_a_first_failure():
    for code in range(256):
        for oom in (False, True) if code == exits.KILLED else (False,):
            decision = decide_retry(
                code, oom, on_retry_memory=False, stops=0, retry_per_worker_gb=1
            )
            assert argo_retries(str(code)) is decision.retry, code


def test_argo_retries_an_attempt_without_an_exit_code_a_deleted_pod():
    assert argo_retries("-1")


def test_what_needs_the_history_argo_retries_and_the_decider_ends():
    """A second kill for memory and a stop beyond STOP_RETRIES: Argo sees only the last attempt
    and retries, the decider fails the task and stops the workflow (retry.py)."""
    again = decide_retry(137, True, on_retry_memory=True, stops=0, retry_per_worker_gb=1.5)
    too_often = decide_retry(
        143, False, on_retry_memory=False, stops=STOP_RETRIES, retry_per_worker_gb=1
    )
    assert not again.retry and not too_often.retry
    assert argo_retries("137") and argo_retries("143")


def test_the_retry_strategy_of_every_pod():
    manifest = manifest_of(record_of("two-inputs"))
    strategies = [t["retryStrategy"] for t in manifest["spec"]["templates"] if "container" in t]
    assert len(strategies) == 3
    assert all(
        strategy
        == {"limit": str(RETRY_LIMIT), "retryPolicy": "Always", "expression": RETRY_EXPRESSION}
        for strategy in strategies
    )
    assert "'" in RETRY_EXPRESSION  # compared as strings


@pytest.mark.parametrize(
    ("last_exit", "retry_memory"),
    [("0", False), ("137", True), ("143", False), ("-1", False), ("3", False)],
)
def test_the_attempt_after_an_exit_137_gets_the_retry_memory(last_exit, retry_memory):
    record = record_of("split")
    shape = record.plans["squares"].shape
    assert shape.retry_memory_gb > shape.memory_gb
    container = pod_spec(manifest_of(record), "squares-extra", 1, 1, last_exit)["containers"][0]
    memory = f"{shape.retry_memory_gb if retry_memory else shape.memory_gb}Gi"
    assert container["resources"]["requests"]["memory"] == memory
    assert container["resources"]["limits"]["memory"] == memory
    per_worker = env_of(container, "n")[contract.MEMORY_PER_WORKER_GB]
    assert float(per_worker) == (shape.retry_per_worker_gb if retry_memory else shape.per_worker_gb)


# -- a Workflow created again for a run that ran before ------------------------------------------


def test_a_workflow_created_again_leaves_out_the_tasks_done(argo_schema, argo_crd):
    record = record_of("two-inputs")
    manifest = workflow_manifest(record, TYPES, CONFIG, done=frozenset({"first"}))
    dag = dag_of(manifest)
    assert list(dag) == ["second-w0", "second-extra", "both"]
    assert dag["both"]["dependencies"] == ["second-w0"]
    assert [t["name"] for t in manifest["spec"]["templates"]] == [
        "dag",
        "worker-second",
        "run-both",
    ]
    assert schemas.errors(argo_schema, manifest) == []
    assert schemas.errors(argo_crd, manifest) == []
    dag = dag_of(workflow_manifest(record, TYPES, CONFIG, done=frozenset({"first", "second"})))
    assert dag == {"both": {"name": "both", "template": "run-both"}}, "it waits for nothing"
    assert "annotations" not in manifest["metadata"], "every worker starts at 0"


FIRST = {("squares", "w0"): 3, ("squares", "w2"): 1, ("squares", "w1"): 0, ("other", "x"): 4}


def test_a_workflow_created_again_starts_every_worker_after_its_attempts(argo_schema, argo_crd):
    """Argo counts every node's attempts from 0; the harness of a pod adds its worker's first
    attempt, which the Workflow's annotation tells the backend too."""
    record = record_of("split")
    manifest = workflow_manifest(record, TYPES, CONFIG, first_attempts=FIRST)
    assert schemas.errors(argo_schema, manifest) == []
    assert schemas.errors(argo_crd, manifest) == []
    annotation = json.loads(manifest["metadata"]["annotations"][labels.FIRST_ATTEMPTS])
    assert annotation == {"squares": {"w0": 3, "w2": 1}}, "only the tasks it has, not 0"
    assert first_attempts(manifest) == {("squares", "w0"): 3, ("squares", "w2"): 1}
    assert "annotations" not in manifest["spec"]["podMetadata"]
    starts = {"w0": 3, "w1": 0, "w2": 1}
    for node_name, item in pods_of(manifest):
        task_id, worker = worker_of(record, node_name, item)
        for counted in (0, 2):
            container = pod_spec(manifest, node_name, item, counted, "0")["containers"][0]
            env = env_of(container, "node-7")
            assert env[contract.FIRST_ATTEMPTS] == "w0=3\nw2=1"
            launch = contract.Launch.from_env(env)
            attempt = starts[worker] + counted
            assert launch.attempt == attempt
            expected = expected_env(record, task_id, worker, attempt, "node-7", False)
            assert launch == contract.Launch.from_env(expected)


def test_a_workflow_created_again_gives_the_workers_killed_for_memory_the_retry_memory():
    """From their first attempt on, and every one after; the others as before: the first
    memory, the retry memory after an exit 137."""
    record = record_of("split")
    shape = record.plans["squares"].shape
    retry_memory = frozenset({("squares", "w1")})
    manifest = workflow_manifest(record, TYPES, CONFIG, retry_memory=retry_memory)
    for node_name, item in pods_of(manifest):
        _, worker = worker_of(record, node_name, item)
        for last_exit in ("0", "143", "-1", "137"):
            container = pod_spec(manifest, node_name, item, 1, last_exit)["containers"][0]
            retried = worker == "w1" or last_exit == "137"
            memory = f"{shape.retry_memory_gb if retried else shape.memory_gb}Gi"
            assert container["resources"]["limits"]["memory"] == memory, (worker, last_exit)
            per_worker = float(env_of(container, "n")[contract.MEMORY_PER_WORKER_GB])
            assert per_worker == (shape.retry_per_worker_gb if retried else shape.per_worker_gb)
    record = record_of("unsplit-plugin")
    shape = record.plans["report"].shape
    assert shape.retry_memory_gb > shape.memory_gb
    manifest = workflow_manifest(
        record, TYPES, CONFIG, retry_memory=frozenset({("report", "report")})
    )
    for last_exit in ("0", "137"):
        container = pod_spec(manifest, "report", None, 0, last_exit)["containers"][0]
        assert container["resources"]["limits"]["memory"] == f"{shape.retry_memory_gb}Gi"
        env = env_of(container, "n")
        assert env == expected_env(record, "report", "report", 0, "n", True)
    assert "{{" not in template_of(manifest, "run-report")["podSpecPatch"], "no condition left"


# -- label values -------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["demo", "study-1", "a.b_c", "", "x" * 63])
def test_a_label_value_is_kept(text):
    assert labels.label_value(text) == text


@pytest.mark.parametrize("text", ["Study 1", "-edge-", "ü", "x" * 64, GROUP, "a/b", "__"])
def test_text_that_is_no_label_value_is_made_one_ending_in_its_hash(text):
    value = labels.label_value(text)
    assert labels.is_label_value(value) and len(value) <= 63
    assert re.search(r"[0-9a-f]{8}$", value)


def test_different_texts_keep_different_label_values():
    assert labels.label_value("Study 1") != labels.label_value("study-1")
    assert labels.label_value("x" * 70) != labels.label_value("x" * 71)


@given(st.text(max_size=100))
def test_every_text_makes_a_valid_label_value(text):
    value = labels.label_value(text)
    assert labels.is_label_value(value)
    assert labels.label_value(value) == value


# -- rendering without a cluster, and the cluster configuration ----------------------------------


def test_render_run_is_the_workflow_of_the_record_a_submission_would_fold_to():
    workflow = WORKFLOWS["two-inputs"]
    manifest = render_run(workflow, TYPES, CONFIG, nodes=NODES, run_id=RUN_ID, image=IMAGE)
    record = render_record(workflow, TYPES, CONFIG, nodes=NODES, run_id=RUN_ID, image=IMAGE)
    assert manifest == workflow_manifest(record, TYPES, CONFIG)
    assert record.priority == "standard" and record.image == IMAGE
    assert set(record.plans) == {"first", "second", "both"}


def test_render_run_reserves_a_node_of_the_given_ones():
    manifest = render_run(
        WORKFLOWS["split"], TYPES, CONFIG, nodes=NODES, run_id=RUN_ID, reserve="node-3"
    )
    assert manifest["spec"]["nodeSelector"] == {"simrun/reserved": RUN_ID}
    with pytest.raises(WorkflowError, match="reserve: node 'node-9' to reserve does not exist"):
        render_run(WORKFLOWS["split"], TYPES, CONFIG, nodes=NODES, reserve="node-9")


def test_render_run_refuses_a_workflow_with_every_problem():
    workflow = Workflow(
        name="bad",
        tasks=[
            TaskSpec(id="a", type="demo.squares", settings={"n": 3, "m": 1}),
            TaskSpec(id="b", type="nothing"),
        ],
    )
    with pytest.raises(WorkflowError) as refused:
        render_run(workflow, TYPES, CONFIG)
    assert [(p.task, p.field) for p in refused.value.problems] == [("a", "settings"), ("b", "type")]
    huge = Workflow(
        name="huge",
        tasks=[TaskSpec(id="c", type="command", settings=command(["x"], memory_gb=500.0))],
    )
    with pytest.raises(WorkflowError, match=r"task 'c': settings\.memory_gb: .* fits on no node"):
        render_run(huge, TYPES, CONFIG, nodes=NODES)


def test_the_cluster_configuration_has_the_defaults_of_the_spec_and_refuses_unknown_fields():
    config = msgspec.convert({"namespace": "runs", "grace_s": 30}, ClusterConfig)
    assert (config.namespace, config.grace_s, config.local_queue) == ("runs", 30, "simrun")
    assert (CONFIG.store_claim, CONFIG.store_mount, CONFIG.scratch_path) == (
        "simrun-store",
        "/store",
        "/scratch",
    )
    assert (CONFIG.service_account, CONFIG.ttl_after_finished_s) == ("simrun-workflow", 86400)
    with pytest.raises(msgspec.ValidationError, match="unknown field `queue`"):
        msgspec.convert({"queue": "x"}, ClusterConfig)
    manifest = workflow_manifest(record_of("split"), TYPES, config)
    assert manifest["metadata"]["namespace"] == "runs"
    assert pod_spec(manifest, "squares-w0", None, 0, "0")["terminationGracePeriodSeconds"] == 60


# -- the Workflow of examples/squares.yaml ------------------------------------------------------


def _golden_text() -> str:
    workflow = load_workflow(ROOT / "examples" / "squares.yaml")
    manifest = render_run(workflow, load_task_types(), ClusterConfig())
    return yaml.safe_dump(manifest, sort_keys=False, width=100)


def test_the_workflow_of_the_squares_example_is_the_committed_one():
    text = _golden_text()
    if os.environ.get("SIMRUN_UPDATE_MANIFESTS") == "1":
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), "no tests/core/squares.argo.yaml: run with SIMRUN_UPDATE_MANIFESTS=1"
    assert yaml.safe_load(GOLDEN.read_text()) == yaml.safe_load(text), (
        "the manifests changed: review, then regenerate with SIMRUN_UPDATE_MANIFESTS=1"
    )
