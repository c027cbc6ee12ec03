"""The runs the Argo tests build their Workflows of, and how Argo reads a Workflow: the pod it
makes of an attempt of a DAG node (parameters, `{{retries}}`, `lastRetry` and the `podSpecPatch`
applied) and the environment its process gets."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from argo_expressions import substitute

from simrun_core import launch as contract
from simrun_core.argo import workflow_manifest
from simrun_core.argo.render import render_record
from simrun_core.cluster import ClusterConfig
from simrun_core.fold import RunRecord
from simrun_core.planner import Node
from simrun_core.plugins import ResourceHint, TaskType, load_task_types
from simrun_core.workflow import TaskSpec, Workflow

RUN_ID = "20240506-070809-a1b2c3"
CONFIG = ClusterConfig()
NODES = [
    Node(name=f"node-{index}", cores=8, memory_gb=32.0, gpus=2 if index == 3 else 0)
    for index in (1, 2, 3)
]
"""Three nodes, the last with two GPUs (a GPU task is planned there)."""
IMAGE = "registry.cluster.internal:5000/simrun-env:abc123"
GROUP = "Study #1: Ünïcode / and a name far longer than the sixty-three characters of a label"


class ReportSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Settings of the test's unsplit plugin type."""

    title: str = "report"


REPORT = TaskType(
    name="test.report",
    settings=ReportSettings,
    inputs=("data",),
    command=("report", "--settings={settings}", "--out={out}", "{input}"),
    hint=ResourceHint(memory_base_gb=0.5, memory_per_worker_gb=1.5),
)
TYPES = {**load_task_types(), REPORT.name: REPORT}


def squares(task_id: str, n: int = 100, **fields: Any) -> TaskSpec:
    return TaskSpec(id=task_id, type="demo.squares", settings={"n": n}, **fields)


def command(args: list[str], **settings: Any) -> dict[str, Any]:
    return {"image": "tools:1", "args": args, "cores": 1, "memory_gb": 2.0, **settings}


WORKFLOWS = {
    "split": Workflow(name="split", tasks=[squares("squares")]),
    "single-pod": Workflow(name="one", tasks=[squares("squares", n=1)]),
    "unsplit-plugin": Workflow(
        name="report",
        tasks=[
            squares("squares"),
            TaskSpec(id="report", type="test.report", inputs={"data": "squares.squares"}),
        ],
    ),
    "command": Workflow(
        name="command",
        tasks=[TaskSpec(id="plot", type="command", settings=command(["plot", "--out={out}"]))],
    ),
    "reservation": Workflow(name="reserved", tasks=[squares("squares")], reserve="node-2"),
    "group": Workflow(name="grouped", tasks=[squares("squares")]),
    "gpu": Workflow(
        name="gpu",
        tasks=[
            TaskSpec(
                id="train",
                type="command",
                settings=command(["train", "{out}"], gpus=1, scratch_gb=20.5),
            )
        ],
    ),
    "two-inputs": Workflow(
        name="two-inputs",
        tasks=[
            squares("first"),
            squares("second", n=50),
            TaskSpec(
                id="both",
                type="command",
                settings=command(["sum", "--input={input}", "--out={out}"]),
                inputs={"a": "first.squares", "b": "second.squares"},
            ),
        ],
    ),
}


def record_of(case: str) -> RunRecord:
    """The folded record of a run of one of `WORKFLOWS`, planned on `NODES`."""
    return render_record(
        WORKFLOWS[case],
        TYPES,
        CONFIG,
        nodes=NODES,
        run_id=RUN_ID,
        group=GROUP if case == "group" else None,
        image=IMAGE,
    )


def manifest_of(record: RunRecord) -> dict[str, Any]:
    return workflow_manifest(record, TYPES, CONFIG)


def legacy_merge_record() -> RunRecord:
    """A run whose split task's plan has a merge node of its own (recorded before the
    coordinator merged), read by a command task."""
    record = record_of("two-inputs")
    plan = record.plans["first"]
    record.plans["first"] = msgspec.structs.replace(plan, coordinator_merges=False)
    return record


# -- reading a workflow as Argo does ------------------------------------------------------------


def dag_of(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    entry = manifest["spec"]["entrypoint"]
    template = next(t for t in manifest["spec"]["templates"] if t["name"] == entry)
    return {node["name"]: node for node in template["dag"]["tasks"]}


def template_of(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in manifest["spec"]["templates"] if t["name"] == name)


def pods_of(manifest: dict[str, Any]) -> list[tuple[str, int | None]]:
    """Every (DAG node, item) a pod is made of: the items of a `withSequence`."""
    pods: list[tuple[str, int | None]] = []
    for name, node in dag_of(manifest).items():
        sequence = node.get("withSequence")
        if sequence is None:
            pods.append((name, None))
        else:
            start = int(sequence["start"])
            pods += [(name, item) for item in range(start, start + int(sequence["count"]))]
    return pods


def pod_spec(
    manifest: dict[str, Any], node_name: str, item: int | None, attempt: int, last_exit: str
) -> dict[str, Any]:
    """The pod Argo makes of an attempt of a DAG node (`attempt`: Argo's count, `{{retries}}`):
    the template with its parameters, the attempt and `lastRetry` substituted (in expressions
    too), its `podSpecPatch` merged (strategically: containers and
    env by name), the workflow's node selector and tolerations."""
    node = dag_of(manifest)[node_name]
    text = json.dumps(template_of(manifest, node["template"]))
    variables = {"lastRetry.exitCode": last_exit}
    for argument in node.get("arguments", {}).get("parameters", []):
        value = argument["value"].replace("{{item}}", str(item))
        text = text.replace(f"{{{{inputs.parameters.{argument['name']}}}}}", value)
        variables[f"inputs.parameters.{argument['name']}"] = value
    text = text.replace("{{retries}}", str(attempt))
    template = json.loads(substitute(text, variables))
    assert "{{" not in json.dumps(template), "a placeholder left in the pod"
    container = template["container"]
    spec: dict[str, Any] = {"containers": [container]}
    patch = json.loads(template["podSpecPatch"])
    for changed in patch.pop("containers"):
        assert changed["name"] == container["name"]
        for kind, amounts in changed.get("resources", {}).items():
            container["resources"][kind].update(amounts)
        values = {entry["name"]: entry for entry in changed.get("env", [])}
        container["env"] = [values.get(entry["name"], entry) for entry in container["env"]]
    spec.update(patch)
    spec["priorityClassName"] = template["priorityClassName"]
    for key in ("nodeSelector", "tolerations"):
        if key in manifest["spec"]:
            spec[key] = manifest["spec"][key]
    spec["metadata"] = template["metadata"]
    return spec


def env_of(container: dict[str, Any], node: str) -> dict[str, str]:
    """The environment a container's process gets on `node` (the kubelet's `$$` is a `$`)."""
    env = {}
    for entry in container["env"]:
        if "valueFrom" in entry:
            assert entry["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
            env[entry["name"]] = node
        else:
            env[entry["name"]] = entry["value"].replace("$$", "$")
    return env


def worker_of(record: RunRecord, node_name: str, item: int | None) -> tuple[str, str]:
    """The task and worker of a pod of a DAG node."""
    for task_id, plan in record.plans.items():
        if plan.units is None and node_name == task_id:
            return task_id, task_id
        if node_name == f"{task_id}-w0":
            return task_id, "w0"
        if node_name == f"{task_id}-extra":
            return task_id, f"w{item}"
        if node_name == f"{task_id}-merge":
            return task_id, "merge"
    raise AssertionError(f"no task has the DAG node {node_name!r}")


def expected_env(
    record: RunRecord, task_id: str, worker: str, attempt: int, node: str, retry_memory: bool
) -> dict[str, str]:
    """`Launch.to_env()` of `launch_for`, as the local backend gives a process of its own."""
    task_type = TYPES[record.workflow.task(task_id).type]
    cores = 1 if worker == "merge" else record.plans[task_id].shape.cores
    launch = contract.launch_for(
        record,
        task_id,
        worker,
        attempt,
        task_type=task_type,
        store=CONFIG.store_mount,
        scratch=CONFIG.scratch_path,
        node=node,
        cores=cores,
        grace_s=CONFIG.grace_s,
        memory_source="cgroup",
        memory_enforced=True,
        retry_memory=retry_memory,
    )
    return launch.to_env()
