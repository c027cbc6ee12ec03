"""The Kueue objects of the deployment (`simrun_core.kueue`): each valid against its CRD (Kueue's
storage version v1beta2, strict), with the priorities of spec 03 and a queue that preempts only
lower priorities and covers everything a pod of a run requests."""

from __future__ import annotations

import pytest
import reference_schemas as schemas
from argo_cases import manifest_of, pod_spec, pods_of, record_of

from simrun_core.cluster import ClusterConfig
from simrun_core.kueue import (
    KUEUE_API,
    Quota,
    cluster_queue,
    kueue_objects,
    local_queue,
    priority_objects,
    resource_flavor,
    topology,
)
from simrun_core.planner import priority_classes
from simrun_core.workflow import Priority

QUOTA = Quota(cores=48, memory_gb=188.5, gpus=2, ephemeral_storage_gb=900)
CONFIG = ClusterConfig()
SPEC_PRIORITIES = {
    "simrun-owner-base": 1000,
    "simrun-owner-extra": 900,
    "simrun-standard-base": 500,
    "simrun-standard-extra": 400,
    "simrun-agent-base": 200,
    "simrun-agent-extra": 100,
}
"""Spec 03, "Priorities and preemption"."""


@pytest.fixture(scope="session")
def crds():
    return {kind: schemas.kueue_crd(kind) for kind in schemas.KUEUE_CRDS}


def test_every_kueue_object_is_valid_against_its_crd(crds):
    objects = [item for item in kueue_objects(QUOTA, CONFIG) if item["apiVersion"] == KUEUE_API]
    assert {item["kind"] for item in objects} == set(schemas.KUEUE_CRDS)
    for item in objects:
        assert schemas.errors(crds[item["kind"]], item) == [], item["kind"]
        assert item["metadata"]["name"]


def test_the_strict_crds_refuse_a_misspelt_field(crds):
    queue = cluster_queue(QUOTA)
    queue["spec"]["preemptoin"] = queue["spec"].pop("preemption")
    assert any("preemptoin" in error for error in schemas.errors(crds["ClusterQueue"], queue))


def test_the_six_priority_classes_have_the_values_of_the_spec():
    objects = priority_objects()
    workload = {
        o["metadata"]["name"]: o["value"] for o in objects if o["kind"] == "WorkloadPriorityClass"
    }
    kube = {o["metadata"]["name"]: o["value"] for o in objects if o["kind"] == "PriorityClass"}
    assert workload == kube == SPEC_PRIORITIES
    for priority in Priority:
        base, extra = priority_classes(priority)
        assert workload[extra] < workload[base]


def test_the_scheduler_never_preempts_kueue_does():
    for item in priority_objects():
        if item["kind"] == "PriorityClass":
            assert item["apiVersion"] == "scheduling.k8s.io/v1"
            assert item["preemptionPolicy"] == "Never"
            assert item["globalDefault"] is False


def test_a_priority_class_has_the_fields_of_the_kubernetes_api():
    models = pytest.importorskip("kubernetes_asyncio.client")
    fields = set(models.V1PriorityClass.attribute_map.values())
    for item in priority_objects():
        if item["kind"] == "PriorityClass":
            assert set(item) <= fields
            assert isinstance(item["value"], int) and -(2**31) <= item["value"] < 2**31


def test_the_cluster_queue_preempts_lower_priorities_only():
    preemption = cluster_queue(QUOTA)["spec"]["preemption"]
    # not LowerOrNewerEqualPriority: equal priorities never preempt each other (spec 03)
    assert preemption == {
        "withinClusterQueue": "LowerPriority",
        "reclaimWithinCohort": "LowerPriority",
    }


def test_the_quota_is_the_argument_in_one_flavor_of_the_worker_nodes():
    spec = cluster_queue(QUOTA)["spec"]
    (group,) = spec["resourceGroups"]
    (flavor,) = group["flavors"]
    assert flavor["name"] == resource_flavor()["metadata"]["name"]
    assert {r["name"]: r["nominalQuota"] for r in flavor["resources"]} == {
        "cpu": "48",
        "memory": "193024Mi",
        "nvidia.com/gpu": "2",
        "ephemeral-storage": "900Gi",
    }
    assert group["coveredResources"] == [r["name"] for r in flavor["resources"]]


def test_the_queue_covers_every_resource_a_pod_of_a_run_requests():
    covered = set(cluster_queue(QUOTA)["spec"]["resourceGroups"][0]["coveredResources"])
    for case in ("gpu", "two-inputs"):
        manifest = manifest_of(record_of(case))
        for node, item in pods_of(manifest):
            requests = pod_spec(manifest, node, item, 0, "0")["containers"][0]["resources"]
            assert set(requests["requests"]) <= covered


def test_the_flavor_selects_the_worker_nodes_by_host_topology():
    flavor, hosts = resource_flavor(), topology()
    assert flavor["spec"] == {
        "nodeLabels": {"simrun/worker": "true"},
        "topologyName": "simrun-hosts",
    }
    assert hosts["metadata"]["name"] == "simrun-hosts"
    assert hosts["spec"]["levels"] == [{"nodeLabel": "kubernetes.io/hostname"}]


def test_the_local_queue_of_the_pods_feeds_the_cluster_queue():
    queue = local_queue(ClusterConfig(namespace="runs", local_queue="simrun"))
    assert queue["metadata"] == {"name": "simrun", "namespace": "runs"}
    assert queue["spec"] == {"clusterQueue": cluster_queue(QUOTA)["metadata"]["name"]}
    pod = pod_spec(manifest_of(record_of("split")), "squares-w0", None, 0, "0")
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "simrun"


def test_the_pods_of_a_run_name_classes_that_exist():
    names = {item["metadata"]["name"] for item in priority_objects()}
    manifest = manifest_of(record_of("split"))
    for node, item in pods_of(manifest):
        pod = pod_spec(manifest, node, item, 0, "0")
        assert pod["priorityClassName"] in names
        assert (
            pod["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == pod["priorityClassName"]
        )
