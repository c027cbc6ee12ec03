"""The Kueue objects of the deployment and the priority classes of the runs (spec 03, spec 11).

Kueue admits the pods of the runs (plain pods with a queue label) by the quota of one
ClusterQueue and preempts workloads of lower priority; the scheduler itself never preempts, so
every Kubernetes `PriorityClass` has `preemptionPolicy: Never`. Each priority of a run is two
classes of one name and value as a `WorkloadPriorityClass` and a `PriorityClass`: the base one of
its coordinators and unsplit pods, and the extra one of its extra workers, lower than the base of
its own level, so a new run takes the extra workers of the running ones back. Plain dicts, built
by pure functions; `kueue_objects` lists them in the order they apply.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from simrun_core.argo import labels
from simrun_core.argo.pod import GPU, gib
from simrun_core.cluster import ClusterConfig
from simrun_core.planner import PRIORITY_VALUES, priority_class_values, priority_classes

KUEUE_API: Final = "kueue.x-k8s.io/v1beta2"
"""The version Kueue v0.20 stores its objects in (the reference CRDs' storage version)."""
SCHEDULING_API: Final = "scheduling.k8s.io/v1"
CLUSTER_QUEUE: Final = "simrun"
FLAVOR: Final = "simrun-worker"
TOPOLOGY: Final = "simrun-hosts"
LOWER_PRIORITY: Final = "LowerPriority"
"""Preempt only workloads of a lower priority: equal priorities never preempt each other."""
COVERED_RESOURCES: Final = ("cpu", "memory", GPU, "ephemeral-storage")
"""Every resource a pod of a run may request: Kueue refuses a pod requesting one not covered."""


class Quota(msgspec.Struct, frozen=True, kw_only=True):
    """The nominal quota of the ClusterQueue: the allocatable resources of the worker nodes
    (spec 11, "The values a setup fills in")."""

    cores: int
    memory_gb: float
    gpus: int = 0
    ephemeral_storage_gb: float = 0.0


def _metadata(name: str, namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    return metadata


def _description(name: str) -> str:
    for priority in PRIORITY_VALUES:
        base, extra = priority_classes(priority)
        if name == base:
            return f"simrun: the coordinators and unsplit pods of {priority} runs"
        if name == extra:
            return f"simrun: the extra workers of {priority} runs"
    return "simrun"


def workload_priority_class(name: str, value: int) -> dict[str, Any]:
    """A Kueue `WorkloadPriorityClass`: its `value` at the top level, it has no spec."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "WorkloadPriorityClass",
        "metadata": _metadata(name),
        "value": value,
        "description": _description(name),
    }


def priority_class(name: str, value: int) -> dict[str, Any]:
    """A Kubernetes `PriorityClass` that orders pods but never preempts (Kueue does)."""
    return {
        "apiVersion": SCHEDULING_API,
        "kind": "PriorityClass",
        "metadata": _metadata(name),
        "value": value,
        "globalDefault": False,
        "preemptionPolicy": "Never",
        "description": _description(name),
    }


def priority_objects() -> list[dict[str, Any]]:
    """The six priority classes of the runs, each as a WorkloadPriorityClass and a
    PriorityClass of the same name and value (`simrun_core.planner.priority_class_values`)."""
    objects: list[dict[str, Any]] = []
    for name, value in priority_class_values().items():
        objects += [workload_priority_class(name, value), priority_class(name, value)]
    return objects


def topology() -> dict[str, Any]:
    """The `Topology` of one level, the host: a pod's podset fits on one node."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "Topology",
        "metadata": _metadata(TOPOLOGY),
        "spec": {"levels": [{"nodeLabel": labels.HOSTNAME}]},
    }


def resource_flavor() -> dict[str, Any]:
    """The `ResourceFlavor` of the nodes labelled `simrun/worker=true`, with the topology (a
    flavor with a topology needs node labels, spec 11 findings)."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": _metadata(FLAVOR),
        "spec": {"nodeLabels": {labels.WORKER_NODE: "true"}, "topologyName": TOPOLOGY},
    }


def cluster_queue(quota: Quota) -> dict[str, Any]:
    """The `ClusterQueue` `simrun`: the quota of the worker nodes in one flavor, open to every
    namespace, preempting workloads of lower priority only (in the queue, and when reclaiming
    its quota in a cohort, should it join one)."""
    amounts = {
        "cpu": str(quota.cores),
        "memory": gib(quota.memory_gb),
        GPU: str(quota.gpus),
        "ephemeral-storage": gib(quota.ephemeral_storage_gb),
    }
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": _metadata(CLUSTER_QUEUE),
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {
                "withinClusterQueue": LOWER_PRIORITY,
                "reclaimWithinCohort": LOWER_PRIORITY,
            },
            "resourceGroups": [
                {
                    "coveredResources": list(COVERED_RESOURCES),
                    "flavors": [
                        {
                            "name": FLAVOR,
                            "resources": [
                                {"name": name, "nominalQuota": amounts[name]}
                                for name in COVERED_RESOURCES
                            ],
                        }
                    ],
                }
            ],
        },
    }


def local_queue(config: ClusterConfig) -> dict[str, Any]:
    """The `LocalQueue` of the pods, in the namespace of the runs, onto the ClusterQueue."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": _metadata(config.local_queue, config.namespace),
        "spec": {"clusterQueue": CLUSTER_QUEUE},
    }


def kueue_objects(quota: Quota, config: ClusterConfig) -> list[dict[str, Any]]:
    """Every object of the queue and the priorities, in the order they apply: the priority
    classes, the Topology, the ResourceFlavor, the ClusterQueue and the LocalQueue."""
    return [
        *priority_objects(),
        topology(),
        resource_flavor(),
        cluster_queue(quota),
        local_queue(config),
    ]
