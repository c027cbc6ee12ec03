"""The nodes and pods of the cluster as the Argo backend reads them: pure functions of the JSON
the Kubernetes API serialises (spec 38).

A node of the planner is a node labelled `simrun/worker=true` without a taint that keeps pods
off (a reservation of simrun aside), with the allocatable cores and memory minus one container
of Argo's executor (the `wait` container beside `main`; the init container runs before them
and needs less) and minus the requests of the pods bound to it that are no pods of runs (the
DaemonSets of the cluster), rounded down to whole cores and GiB, so a pod the planner sizes for
the node fits beside them. Kueue counts the pods of the runs itself.

A reservation is the taint `simrun/reserved=<run>:NoExecute` and the label
`simrun/reserved=<run>`; `reserving` and `releasing` compute the merge patch that adds or
removes the one of a run, guarded by the node's resourceVersion, never touching another run's.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from simrun_api.backends.base import ReservationRefused
from simrun_core import launch as contract
from simrun_core.argo import labels
from simrun_core.argo.pod import GPU, MAIN
from simrun_core.planner import Node

GIB: Final = Decimal(1024**3)
EXECUTOR_CORES: Final = 0.1
"""The cores the `wait` container of Argo's executor requests: `executor.resources` of the
controller config in deploy/cluster (requests equal limits, spec 11 findings)."""
EXECUTOR_MEMORY_GB: Final = 0.25
"""The GiB the `wait` container requests (256Mi, as the init container, spec 11 findings)."""
KEEPS_PODS_OFF: Final = frozenset({"NoSchedule", "NoExecute"})
"""The effects of a taint that keep pods off a node (`PreferNoSchedule` does not)."""
ENDED_POD_PHASES: Final = frozenset({"Succeeded", "Failed"})
WORKFLOW_LABEL: Final = "workflows.argoproj.io/workflow"
"""The label Argo gives every pod of a workflow: the workflow's name."""
NODE_ID_ANNOTATION: Final = "workflows.argoproj.io/node-id"
"""The annotation of a pod with the id of its node in `status.nodes` (else its name is it)."""
NODE_NAME_ANNOTATION: Final = "workflows.argoproj.io/node-name"
"""The annotation of a pod with its node's full name, `<workflow>.<task>(<attempt>)`."""

_SUFFIXES: Final = {
    "Ki": Decimal(1024),
    "Mi": Decimal(1024**2),
    "Gi": Decimal(1024**3),
    "Ti": Decimal(1024**4),
    "Pi": Decimal(1024**5),
    "Ei": Decimal(1024**6),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_QUANTITY: Final = re.compile(
    r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)$"
)


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes quantity (`"100m"`, `"2"`, `"1.5Gi"`, `"1e3"`, a number) as a Decimal;
    ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    found = _QUANTITY.match(str(value).strip())
    if found is None:
        raise ValueError(f"not a quantity: {value!r}")
    try:
        return Decimal(found[1]) * _SUFFIXES[found[2]]
    except InvalidOperation:
        raise ValueError(f"not a quantity: {value!r}") from None


@dataclasses.dataclass(frozen=True)
class Amounts:
    """Cores, GiB of memory and GPUs (requested, or free)."""

    cores: float = 0.0
    memory_gb: float = 0.0
    gpus: float = 0.0

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(
            self.cores + other.cores, self.memory_gb + other.memory_gb, self.gpus + other.gpus
        )

    def most(self, other: Amounts) -> Amounts:
        """The larger of each amount."""
        return Amounts(
            max(self.cores, other.cores),
            max(self.memory_gb, other.memory_gb),
            max(self.gpus, other.gpus),
        )


NOTHING: Final = Amounts()
EXECUTOR: Final = Amounts(EXECUTOR_CORES, EXECUTOR_MEMORY_GB)
"""One container of Argo's executor."""


def amounts(resources: Mapping[str, Any] | None) -> Amounts:
    """The cores, GiB and GPUs of a resource list (`{"cpu": "2", "memory": "4Gi"}`)."""
    values = resources or {}

    def of(key: str) -> Decimal:
        value = values.get(key)
        return Decimal(0) if value is None else parse_quantity(value)

    return Amounts(float(of("cpu")), float(of("memory") / GIB), float(of(GPU)))


def container_requests(container: Mapping[str, Any]) -> Amounts:
    """What a container requests: its requests, a resource it only limits at its limit (as
    the API server defaults a request to the limit)."""
    resources = container.get("resources") or {}
    limits = dict(resources.get("limits") or {})
    return amounts({**limits, **(resources.get("requests") or {})})


def pod_requests(pod: Mapping[str, Any]) -> Amounts:
    """What a pod requests as the scheduler counts it: its containers together, or an init
    container alone when it needs more (they run one at a time, before the containers), a
    sidecar (an init container that keeps running) counted with the containers and with the
    init containers after it; plus the pod's overhead."""
    spec = pod.get("spec") or {}
    sidecars = Amounts()
    init = Amounts()
    for container in spec.get("initContainers") or []:
        requested = container_requests(container)
        if container.get("restartPolicy") == "Always":
            sidecars = sidecars + requested
            init = init.most(sidecars)
        else:
            init = init.most(sidecars + requested)
    running = sidecars
    for container in spec.get("containers") or []:
        running = running + container_requests(container)
    return running.most(init) + amounts(spec.get("overhead"))


def pod_node(pod: Mapping[str, Any]) -> str | None:
    """The node a pod is bound to."""
    return (pod.get("spec") or {}).get("nodeName") or None


def pod_labels(pod: Mapping[str, Any]) -> dict[str, str]:
    """The labels of an object."""
    return dict((pod.get("metadata") or {}).get("labels") or {})


def is_pod_of_run(pod: Mapping[str, Any]) -> bool:
    """Whether a pod is one of a run (its workflow's `podMetadata` gives it `simrun/run`)."""
    return labels.RUN in pod_labels(pod)


def pod_ended(pod: Mapping[str, Any]) -> bool:
    """Whether a pod terminated (succeeded or failed)."""
    return (pod.get("status") or {}).get("phase") in ENDED_POD_PHASES


def used_by_others(pods: Iterable[Mapping[str, Any]]) -> dict[str, Amounts]:
    """The requests of the pods that are no pods of runs and have not terminated, per node."""
    used: dict[str, Amounts] = {}
    for pod in pods:
        node = pod_node(pod)
        if node is None or is_pod_of_run(pod) or pod_ended(pod):
            continue
        used[node] = used.get(node, Amounts()) + pod_requests(pod)
    return used


def reservation_of(node: Mapping[str, Any]) -> str | None:
    """The run a node is reserved for: its label `simrun/reserved`, else its taint's value."""
    label = pod_labels(node).get(labels.RESERVED)
    if label:
        return label
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") == labels.RESERVED and taint.get("value"):
            return str(taint["value"])
    return None


def keeps_pods_off(node: Mapping[str, Any]) -> bool:
    """Whether no pod of a run may go to the node: it is cordoned, or a taint other than a
    reservation of simrun keeps pods off it."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return True
    return any(
        taint.get("key") != labels.RESERVED and taint.get("effect") in KEEPS_PODS_OFF
        for taint in spec.get("taints") or []
    )


def node_from(
    node: Mapping[str, Any],
    used: Amounts = NOTHING,
    executor: Amounts = EXECUTOR,
) -> Node | None:
    """The planner's node of a Kubernetes node, None when pods of runs cannot go there.

    `cores`/`memory_gb`: the allocatable ones minus `executor` (one container of Argo's
    executor) and `used` (the pods on it that are no pods of runs), rounded down to whole cores
    and GiB; `allocatable_*`: the allocatable ones minus `used`, as the scheduler counts the
    requests of the pods of runs; its reservation.
    """
    if keeps_pods_off(node):
        return None
    allocatable = amounts((node.get("status") or {}).get("allocatable"))
    cores = allocatable.cores - used.cores
    memory_gb = allocatable.memory_gb - used.memory_gb
    return Node(
        name=str((node.get("metadata") or {}).get("name") or ""),
        cores=max(0, _floor(cores - executor.cores)),
        memory_gb=float(max(0, _floor(memory_gb - executor.memory_gb))),
        gpus=max(0, _floor(allocatable.gpus - used.gpus)),
        reserved_by=reservation_of(node),
        allocatable_cores=max(0.0, cores),
        allocatable_memory_gb=max(0.0, memory_gb),
    )


def _floor(value: float) -> int:
    """Rounded down, forgiving the error of a float sum (`7.999999999` is 8)."""
    return math.floor(value + 1e-9)


# -- reservations -------------------------------------------------------------------------------


class NodeReserved(ReservationRefused):
    """The node is reserved for another run; its reservation is not taken away."""


class UnknownNode(ReservationRefused, KeyError):
    """No node of that name exists."""

    def __str__(self) -> str:
        return f"node {self.args[0]!r} does not exist"


def reservation_taint(run_id: str) -> dict[str, str]:
    """The taint of a reservation: it evicts the pods of other runs from the node."""
    return {"key": labels.RESERVED, "value": run_id, "effect": "NoExecute"}


def reserving(node: Mapping[str, Any], run_id: str) -> dict[str, Any] | None:
    """The merge patch that reserves a node for a run (its taint and label, the node's
    resourceVersion as the guard); None when it is reserved for the run already.

    NodeReserved when another run holds it: its taint would evict that run's pods.
    """
    holder = reservation_of(node)
    if holder is not None and holder != run_id:
        raise NodeReserved(f"node {_name(node)!r} is reserved for run {holder}")
    taints = list((node.get("spec") or {}).get("taints") or [])
    ours = reservation_taint(run_id)
    kept = [t for t in taints if t.get("key") != labels.RESERVED]
    if pod_labels(node).get(labels.RESERVED) == run_id and [
        t for t in taints if t.get("key") == labels.RESERVED
    ] == [ours]:
        return None
    return _guarded(node, {labels.RESERVED: run_id}, [*kept, ours])


def releasing(node: Mapping[str, Any], run_id: str) -> dict[str, Any] | None:
    """The merge patch that removes a run's reservation from a node (the taint and the label
    naming the run, nothing of another run's); None when the node has nothing of it."""
    taints = list((node.get("spec") or {}).get("taints") or [])
    kept = [t for t in taints if not (t.get("key") == labels.RESERVED and t.get("value") == run_id)]
    label_ours = pod_labels(node).get(labels.RESERVED) == run_id
    if not label_ours and len(kept) == len(taints):
        return None
    return _guarded(node, {labels.RESERVED: None} if label_ours else {}, kept)


def _guarded(
    node: Mapping[str, Any], new_labels: dict[str, str | None], taints: list[Any]
) -> dict[str, Any]:
    """A merge patch of the labels and the whole list of taints (a list is replaced by a merge
    patch), refused with a 409 when the node changed since `node` was read."""
    metadata: dict[str, Any] = {"resourceVersion": (node.get("metadata") or {})["resourceVersion"]}
    if new_labels:
        metadata["labels"] = new_labels
    return {"metadata": metadata, "spec": {"taints": taints or None}}


def _name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name") or "")


# -- the pods of a workflow ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PodFacts:
    """What the backend reads of the pod of an attempt: its name, whether Kueue still gates it,
    the memory per process its harness got (`SIMRUN_MEMORY_PER_WORKER_GB` of `main`), its
    worker and attempt from the launch contract, its phase."""

    name: str
    node_id: str
    gated: bool
    per_worker_gb: float | None
    worker: str | None
    attempt: int | None
    phase: str
    created: str = ""


def main_container(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container `main` of a pod (the only one of a pod that is not Argo's)."""
    containers: list[Mapping[str, Any]] = (pod.get("spec") or {}).get("containers") or []
    for container in containers:
        if container.get("name") == MAIN:
            return container
    return containers[0] if len(containers) == 1 else None


def main_env(pod: Mapping[str, Any]) -> dict[str, str]:
    """The literal variables of a pod's main container (those Argo substituted)."""
    container = main_container(pod) or {}
    return {
        str(entry["name"]): str(entry["value"])
        for entry in container.get("env") or []
        if "value" in entry and "{{" not in str(entry["value"])
    }


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """The facts of a pod of a workflow."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    env = main_env(pod)
    per_worker: float | None
    try:
        per_worker = float(env[contract.MEMORY_PER_WORKER_GB])
    except (KeyError, ValueError):
        per_worker = None
    try:
        attempt: int | None = contract.LaunchEnv(env).attempt if contract.ATTEMPT in env else None
    except contract.LaunchError:
        attempt = None
    return PodFacts(
        name=str(metadata.get("name") or ""),
        node_id=str(annotations.get(NODE_ID_ANNOTATION) or metadata.get("name") or ""),
        gated=bool((pod.get("spec") or {}).get("schedulingGates")),
        per_worker_gb=per_worker,
        worker=env.get(contract.WORKER),
        attempt=attempt,
        phase=str((pod.get("status") or {}).get("phase") or "Pending"),
        created=str(metadata.get("creationTimestamp") or ""),
    )


def pod_name(facts: PodFacts) -> str:
    """The name the backends give a pod, `<worker>-<attempt>`; its own name without them."""
    if facts.worker is None or facts.attempt is None:
        return facts.name
    return f"{facts.worker}-{facts.attempt}"
