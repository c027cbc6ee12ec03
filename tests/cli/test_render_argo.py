"""`simrun render WORKFLOW --argo`: the Workflow a submission would create, with no service and
no cluster, valid against Argo's schema, planned against given nodes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_simrun, write_squares

ROOT = Path(__file__).parents[2]


def reference_schemas():
    """tests/core/reference_schemas.py, the validators of the reference schemas."""
    path = ROOT / "tests" / "core" / "reference_schemas.py"
    spec = importlib.util.spec_from_file_location("reference_schemas_for_cli", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_squares_example_renders_a_workflow_valid_against_argos_schema(tmp_path):
    done = run_simrun(
        "render", str(ROOT / "examples/squares.yaml"), "--argo", "--json", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    assert manifest["kind"] == "Workflow" and manifest["apiVersion"] == "argoproj.io/v1alpha1"
    schemas = reference_schemas()
    assert schemas.errors(schemas.argo_schema(), manifest) == []
    assert schemas.errors(schemas.argo_crd(), manifest) == []
    names = [task["name"] for task in manifest["spec"]["templates"][0]["dag"]["tasks"]]
    assert names == ["squares-w0", "squares-extra"]  # three default nodes: extra workers
    assert not (tmp_path / ".simrun").exists(), "render needs no service"


def test_yaml_by_default_the_same_workflow(tmp_path):
    example = str(ROOT / "examples/squares.yaml")
    as_json = json.loads(run_simrun("render", example, "--argo", "--json", cwd=tmp_path).stdout)
    as_yaml = yaml.safe_load(run_simrun("render", example, "--argo", cwd=tmp_path).stdout)
    assert as_yaml == as_json


def test_the_nodes_of_a_file_are_planned_on_and_a_reservation_selects_its_node(tmp_path):
    workflow = write_squares(tmp_path, n=50)
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("- {name: small-1, cores: 2, memory_gb: 4}\n")
    args = ("render", str(workflow), "--argo", "--json", "--nodes", str(nodes))
    done = run_simrun(*args, "--reserve", "small-1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    tasks = manifest["spec"]["templates"][0]["dag"]["tasks"]
    assert [task["name"] for task in tasks] == ["squares-w0"]  # one node: no extra workers
    worker = next(t for t in manifest["spec"]["templates"] if t["name"] != "dag")
    run_id = manifest["metadata"]["labels"]["simrun/run"]
    assert manifest["spec"]["nodeSelector"] == {"simrun/reserved": run_id}
    assert worker["container"]["resources"]["limits"]["cpu"] == "2"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--json",), "render needs what to render: --argo"),
        (("--argo", "--nodes", "missing.yaml"), "missing.yaml: cannot be read"),
        (("--argo", "--nodes", "nodes.yaml"), "nodes.yaml: not a list of nodes"),
        (("--argo", "--reserve", "nowhere"), "reserve"),
    ],
)
def test_what_cannot_be_rendered_is_refused_naming_it(tmp_path, args, message):
    workflow = write_squares(tmp_path)
    (tmp_path / "nodes.yaml").write_text("- {name: n1}\n")
    done = run_simrun("render", str(workflow), *args, cwd=tmp_path)
    assert done.returncode == 1
    assert message in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_workflow_that_cannot_be_submitted_cannot_be_rendered(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntasks:\n  - id: a\n    type: demo.squares\n    settings: {n: -1}\n")
    done = run_simrun("render", str(bad), "--argo", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: {bad}: task 'a'"), done.stderr


def write_gpu_task(directory: Path, gpus: int) -> Path:
    """A workflow file of one `command` task asking for `gpus` GPUs."""
    path = directory / "gpu.yaml"
    settings = {"image": "tools:1", "args": ["train"], "cores": 2, "memory_gb": 4, "gpus": gpus}
    task = {"id": "train", "type": "command", "settings": settings}
    path.write_text(yaml.safe_dump({"name": "gpu", "tasks": [task]}))
    return path


def test_a_task_asking_more_gpus_than_the_nodes_have_is_refused(tmp_path):
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        "- {name: g1, cores: 8, memory_gb: 32, gpus: 2}\n- {name: c1, cores: 8, memory_gb: 32}\n"
    )
    workflow = write_gpu_task(tmp_path, 4)
    done = run_simrun("render", str(workflow), "--argo", "--nodes", str(nodes), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == (
        f"error: {workflow}: task 'train': settings.gpus: a pod of 4 GPUs fits on no node: "
        "the most a node has is 2 GPUs\n"
    )
    assert done.stdout == ""


def test_the_workflow_of_a_gpu_task_requests_what_it_limits_and_is_valid(tmp_path):
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("- {name: g1, cores: 8, memory_gb: 32, gpus: 2}\n")
    workflow = write_gpu_task(tmp_path, 2)
    args = ("render", str(workflow), "--argo", "--json", "--nodes", str(nodes))
    done = run_simrun(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    schemas = reference_schemas()
    assert schemas.errors(schemas.argo_schema(), manifest) == []
    assert schemas.errors(schemas.argo_crd(), manifest) == []
    worker = next(t for t in manifest["spec"]["templates"] if t["name"] != "dag")
    resources = worker["container"]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == "2"
    assert resources["requests"] == resources["limits"]
