"""The pod templates of a workflow: container, resources, environment, mounts and Kueue metadata.

Every pod of a run carries the Kueue label of the LocalQueue, the WorkloadPriorityClass label and
the Kubernetes `priorityClassName` of its priority, the annotation that requires one node per pod
(topology aware scheduling), requests equal to limits, the run's directory of the store mounted
read-write and the snapshots read-only, a scratch directory on the node's disk, and the
environment of the launch contract (`simrun_core.launch`), with Argo's values for what only an
attempt knows: its number (`{{retries}}`, counted from its worker's first attempt in
`SIMRUN_FIRST_ATTEMPTS` where the Workflow has one) and its node (`spec.nodeName`). Spec 32.

Quantities are strings (`"2"`, `"3Gi"`): Argo's `schema.json` types them as strings, its CRD as
an integer or a string (tests/upstream/README.md), so a string is valid in both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any, Final

from simrun_core import launch as contract
from simrun_core.argo import labels
from simrun_core.argo.retry import retry_strategy
from simrun_core.cluster import ClusterConfig
from simrun_core.planner import PodShape

MAIN: Final = "main"
"""The container of a template, as Argo names it in a pod."""
STORE_VOLUME: Final = "store"
SCRATCH_VOLUME: Final = "scratch"
GPU: Final = "nvidia.com/gpu"
SCRATCH_TYPE: Final = "DirectoryOrCreate"
ATTEMPT: Final = "{{retries}}"
"""The attempt of a pod: Argo's retries of its node so far, 0 at first (spec 32), plus its
worker's first attempt of `SIMRUN_FIRST_ATTEMPTS` (`Launch.from_env` adds it)."""
NODE_FIELD: Final = "spec.nodeName"
MEBI: Final = 1024


def parameter(name: str) -> str:
    """The reference to an input parameter of a template, which Argo substitutes anywhere in
    the template, its metadata and `priorityClassName` included (spec 32)."""
    return f"{{{{inputs.parameters.{name}}}}}"


def gib(value: float) -> str:
    """A quantity of GiB: `3Gi` when whole, else whole MiB rounded up (`0.5` is `512Mi`)."""
    exact = Fraction(str(value))
    if exact.denominator == 1:
        return f"{exact.numerator}Gi"
    return f"{math.ceil(exact * MEBI)}Mi"


def resources(shape: PodShape) -> dict[str, Any]:
    """Requests equal to limits: cores, memory, GPUs and the scratch as ephemeral storage (the
    last two when the shape has them), so Kueue and the scheduler count what the pod may use."""
    amounts = {"cpu": str(shape.cores), "memory": gib(shape.memory_gb)}
    if shape.gpus > 0:
        amounts[GPU] = str(shape.gpus)
    if shape.scratch_gb > 0:
        amounts["ephemeral-storage"] = gib(shape.scratch_gb)
    return {"requests": amounts, "limits": dict(amounts)}


def volumes(config: ClusterConfig) -> list[dict[str, Any]]:
    """The volumes of every pod: the store's claim and the scratch hostPath of the node."""
    return [
        {"name": STORE_VOLUME, "persistentVolumeClaim": {"claimName": config.store_claim}},
        {"name": SCRATCH_VOLUME, "hostPath": {"path": config.scratch_path, "type": SCRATCH_TYPE}},
    ]


def mounts(run_id: str, scratch: str, config: ClusterConfig) -> list[dict[str, Any]]:
    """The mounts of a pod: the run's directory of the store read-write, the snapshots
    read-only, each at its path below `store_mount`, and its own directory `scratch` of the
    node's scratch at `scratch_path`."""
    run = f"runs/{run_id}"
    return [
        {"name": STORE_VOLUME, "mountPath": f"{config.store_mount}/{run}", "subPath": run},
        {
            "name": STORE_VOLUME,
            "mountPath": f"{config.store_mount}/snapshots",
            "subPath": "snapshots",
            "readOnly": True,
        },
        {"name": SCRATCH_VOLUME, "mountPath": config.scratch_path, "subPath": scratch},
    ]


def literal(text: str) -> str:
    """`text` as Kubernetes passes it through a container's command or env: the kubelet expands
    `$(VAR)` there and makes `$$` a `$`, so every `$` is doubled."""
    return text.replace("$", "$$")


def environment(
    env: Mapping[str, str], parameters: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The container env of a launch's variables (`Launch.to_env()`), in their order: the
    attempt is Argo's `{{retries}}`, the node the pod's `spec.nodeName`, and each variable of
    `parameters` the input parameter it names; the other values `literal`."""
    chosen = parameters or {}
    entries: list[dict[str, Any]] = []
    for name, value in env.items():
        if name == contract.NODE:
            entries.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": NODE_FIELD}}})
        elif name == contract.ATTEMPT:
            entries.append({"name": name, "value": ATTEMPT})
        elif name in chosen:
            entries.append({"name": name, "value": parameter(chosen[name])})
        else:
            entries.append({"name": name, "value": literal(value)})
    return entries


def pod_template(
    *,
    name: str,
    task: str,
    image: str,
    command: Sequence[str],
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    shape: PodShape,
    priority: str,
    patch: str,
    config: ClusterConfig,
    inputs: Sequence[str] = (),
) -> dict[str, Any]:
    """A container template of one pod with its Kueue metadata, resources, retries and patch.

    `priority` names both the WorkloadPriorityClass and the PriorityClass (they share names,
    spec 03); `command` is the argv, passed `literal`; `inputs` are the template's input
    parameters.
    """
    template: dict[str, Any] = {"name": name}
    if inputs:
        template["inputs"] = {"parameters": [{"name": item} for item in inputs]}
    template["metadata"] = {
        "labels": {
            labels.QUEUE_NAME: config.local_queue,
            labels.PRIORITY_CLASS: priority,
            labels.TASK: task,
        },
        "annotations": {labels.REQUIRED_TOPOLOGY: labels.HOSTNAME},
    }
    template["priorityClassName"] = priority
    template["container"] = {
        "name": MAIN,
        "image": image,
        "command": [literal(part) for part in command],
        "env": env,
        "resources": resources(shape),
        "volumeMounts": mounts,
    }
    template["retryStrategy"] = retry_strategy()
    template["podSpecPatch"] = patch
    return template
