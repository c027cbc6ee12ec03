"""An emulated Kueue (v0.20, its pod integration) and the scheduler's binding of pods.

`Kueue` does what Kueue and the kube-scheduler do together to simrun's plain pods (spec 11
findings; upstream `pkg/controller/jobs/pod/pod_webhook.go` and `pod_controller.go` at
ff69552e):

- its admission hook (`Store.add_admission("pods", ...)`) gives a created pod labelled
  `kueue.x-k8s.io/queue-name` the scheduling gate `kueue.x-k8s.io/admission` and the label
  `kueue.x-k8s.io/managed: "true"`, as the webhook's `Default` does;
- its loop admits gated pods by the nominal quota of the ClusterQueue their LocalQueue names
  (the objects in the store; every resource the pod requests must be covered), highest
  priority first (the `value` of the WorkloadPriorityClass of `kueue.x-k8s.io/priority-class`,
  else of the PriorityClass of `priorityClassName`, else 0), equal priorities in the order they
  were created, onto a node with room (labelled as the flavor's `nodeLabels`, matching the
  pod's node selector, tolerating the node's `NoSchedule`/`NoExecute` taints, its allocatable
  resources less the requests of the live pods bound to it): the gate removed, the host and
  the flavor's labels added to the node selector (topology aware scheduling), `spec.nodeName`
  set (the scheduler's binding);
- when a higher priority does not fit and the ClusterQueue's `withinClusterQueue` is
  `LowerPriority`, it preempts pods of strictly lower priority (lowest first, the most recently
  admitted first among equals), as few as make the quota and one node fit: each gets the
  condition `TerminationTarget` (reason `WorkloadEvicted`) and is deleted with its grace
  period; the preemptor waits until they are gone. Equal priorities never preempt each other.
- pods without a queue label and without gates are bound to the first node with room (the
  scheduler alone).

Not emulated: `Workload` objects and their conditions (admission is read from the pods' gates),
cohorts and borrowing, fair sharing, several flavors in a resource group, `StrictFIFO` (every
queue is `BestEffortFIFO`), `LowerOrNewerEqualPriority`, admission checks, pod groups, the
finalizer `kueue.x-k8s.io/managed` (the fake store's finalizers and graceful deletion do not
combine as the real ones do), the topology gate `kueue.x-k8s.io/topology`, node affinity,
`tolerationSeconds`, PodDisruptionBudgets, the scheduler's scoring (the first node by name
that fits).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from .reconcile import (
    JSON,
    Reconciler,
    add,
    fits,
    is_terminal,
    node_free,
    pod_requests,
    quantity,
    schedulable_on,
)
from .store import ApiError, Store, now

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
TERMINATION_TARGET = "TerminationTarget"
HOSTNAME = "kubernetes.io/hostname"
DEFAULT_NODE_LABELS = {"simrun/worker": "true"}


def gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod still waits for Kueue's admission."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(gate.get("name") == ADMISSION_GATE for gate in gates)


def managed(pod: Mapping[str, Any]) -> bool:
    return QUEUE_LABEL in ((pod.get("metadata") or {}).get("labels") or {})


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod["metadata"]
    return meta.get("namespace", ""), meta["name"]


class _Queue:
    """A ClusterQueue as admission needs it: its quota, flavor labels and preemption."""

    def __init__(self, name: str, quota: dict[str, Decimal], labels: dict[str, str], preempt: bool):
        self.name = name
        self.quota = quota
        self.node_labels = labels
        self.preempt_lower = preempt
        self.used: dict[str, Decimal] = {}


class Kueue(Reconciler):
    """Admission of gated pods by quota and priority, preemption of lower priorities."""

    name = "kueue"
    plurals = ("pods", "nodes", "clusterqueues", "localqueues", "workloadpriorityclasses")

    def __init__(self, store: Store, *, resync_s: float = 0.5) -> None:
        super().__init__(store, resync_s=resync_s)
        self._counter = itertools.count()
        self._created: dict[tuple[str, str], int] = {}
        self._admitted: dict[str, int] = {}
        self._preempting: dict[str, set[str]] = {}
        self.admissions: list[tuple[str, str]] = []
        """`(pod, node)` of every admission, in order (for tests)."""
        self.preemptions: list[tuple[str, str]] = []
        """`(preempted pod, preemptor)` of every preemption, in order (for tests)."""
        store.add_admission("pods", self._admit_hook)

    # -- the webhook

    def _admit_hook(self, operation: str, obj: JSON, _old: JSON | None) -> None:
        if operation != "CREATE":
            return
        meta = obj.setdefault("metadata", {})
        self._created[(meta.get("namespace", ""), meta.get("name", ""))] = next(self._counter)
        if not managed(obj):
            return
        meta.setdefault("labels", {})[MANAGED_LABEL] = "true"
        spec = obj.setdefault("spec", {})
        gates = spec.setdefault("schedulingGates", [])
        if not any(gate.get("name") == ADMISSION_GATE for gate in gates):
            gates.append({"name": ADMISSION_GATE})

    def _order(self, pod: Mapping[str, Any]) -> int:
        return self._created.get(_key(pod), -1)

    # -- the loop

    async def reconcile(self) -> None:
        pods, _ = self.store.list("pods")
        nodes, _ = self.store.list("nodes")
        live = [p for p in pods if not is_terminal(p)]
        uids = {p["metadata"]["uid"] for p in live}
        self._preempting = {
            uid: victims & uids for uid, victims in self._preempting.items() if uid in uids
        }
        queues = self._queues()
        for pod in live:
            if managed(pod) and not gated(pod) and (pod.get("spec") or {}).get("nodeName"):
                queue = queues.get(self._queue_of(pod) or "")
                if queue is not None:
                    add(queue.used, pod_requests(pod))
        waiting = [p for p in live if gated(p) and not p["metadata"].get("deletionTimestamp")]
        priorities = {p["metadata"]["uid"]: self._priority(p) for p in live}
        waiting.sort(key=lambda p: (-(priorities[p["metadata"]["uid"]] or 0), self._order(p)))
        for pod in waiting:
            priority = priorities[pod["metadata"]["uid"]]
            queue = queues.get(self._queue_of(pod) or "")
            if queue is None or priority is None:
                continue  # no LocalQueue/ClusterQueue or no priority class: Kueue waits
            demand = pod_requests(pod)
            if any(amount > 0 and name not in queue.quota for name, amount in demand.items()):
                continue  # a resource the ClusterQueue does not cover: inadmissible
            if not fits(demand, queue.quota):
                continue  # more than the whole quota: never admitted
            free_quota = dict(queue.quota)
            add(free_quota, queue.used, -1)
            node = (
                self._node_for(pod, demand, nodes, live, queue)
                if fits(demand, free_quota)
                else None
            )
            if node is not None:
                admitted = self._admit(pod, node, queue)
                if admitted is not None:
                    add(queue.used, demand)
                    live = [p for p in live if p["metadata"]["uid"] != pod["metadata"]["uid"]]
                    live.append(admitted)
                continue
            if not queue.preempt_lower or self._preempting.get(pod["metadata"]["uid"]):
                continue
            victims = self._victims(pod, priority, demand, queue, queues, nodes, live, priorities)
            if victims:
                self._preempt(pod, victims)
        self._bind_unmanaged(pods, nodes)

    def _queues(self) -> dict[str, _Queue]:
        """The ClusterQueues of the store, by the `namespace/name` of their LocalQueues."""
        flavors = {f["metadata"]["name"]: f for f in self.store.list("resourceflavors")[0]}
        cluster_queues: dict[str, _Queue] = {}
        for queue in self.store.list("clusterqueues")[0]:
            spec = queue.get("spec") or {}
            quota: dict[str, Decimal] = {}
            labels: dict[str, str] = {}
            broken = False
            for group in spec.get("resourceGroups") or []:
                if len(group.get("flavors") or []) != 1:
                    self.refuse(
                        f"ClusterQueue {queue['metadata']['name']}: a resource group of other "
                        "than one flavor is not emulated"
                    )
                    broken = True
                    break
                flavor = group["flavors"][0]
                flavor_object = flavors.get(flavor["name"])
                if flavor_object is None:
                    broken = True  # Kueue: the flavor is not found, nothing is admitted
                    break
                labels.update((flavor_object.get("spec") or {}).get("nodeLabels") or {})
                for resource in flavor.get("resources") or []:
                    quota[resource["name"]] = quantity(resource["nominalQuota"])
            if broken:
                continue
            policy = (spec.get("preemption") or {}).get("withinClusterQueue") or "Never"
            if policy not in ("Never", "LowerPriority"):
                self.refuse(
                    f"ClusterQueue {queue['metadata']['name']}: withinClusterQueue {policy} "
                    "is not emulated"
                )
                continue
            cluster_queues[queue["metadata"]["name"]] = _Queue(
                queue["metadata"]["name"],
                quota,
                labels or dict(DEFAULT_NODE_LABELS),
                policy == "LowerPriority",
            )
        found: dict[str, _Queue] = {}
        for local in self.store.list("localqueues")[0]:
            target = (local.get("spec") or {}).get("clusterQueue", "")
            if target in cluster_queues:
                meta = local["metadata"]
                found[f"{meta['namespace']}/{meta['name']}"] = cluster_queues[target]
        return found

    def _queue_of(self, pod: Mapping[str, Any]) -> str | None:
        meta = pod["metadata"]
        name = (meta.get("labels") or {}).get(QUEUE_LABEL)
        return f"{meta.get('namespace', '')}/{name}" if name else None

    def _priority(self, pod: Mapping[str, Any]) -> int | None:
        """The priority Kueue gives the pod's workload; None when its class does not exist."""
        labels = pod["metadata"].get("labels") or {}
        name = labels.get(PRIORITY_LABEL)
        if name:
            try:
                return int(self.store.get("workloadpriorityclasses", name)["value"])
            except ApiError:
                return None
        class_name = (pod.get("spec") or {}).get("priorityClassName")
        if class_name:
            try:
                return int(self.store.get("priorityclasses", class_name)["value"])
            except ApiError:
                return None
        return 0

    def _node_for(
        self,
        pod: JSON,
        demand: Mapping[str, Decimal],
        nodes: list[JSON],
        live: list[JSON],
        queue: _Queue | None,
        gone: frozenset[str] = frozenset(),
    ) -> JSON | None:
        """The first node (by name) the pod may go to and that has room for it."""
        remaining = [p for p in live if p["metadata"]["uid"] not in gone]
        for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
            labels = node["metadata"].get("labels") or {}
            if queue is not None and any(labels.get(k) != v for k, v in queue.node_labels.items()):
                continue
            if not schedulable_on(pod, node):
                continue
            if fits(demand, node_free(node, remaining)):
                return node
        return None

    def _admit(self, pod: JSON, node: JSON, queue: _Queue) -> JSON | None:
        """Remove the gate, add the topology's node selector, bind the pod to the node."""
        node_name = node["metadata"]["name"]
        uid = pod["metadata"]["uid"]

        def mutate(obj: JSON) -> None:
            if obj["metadata"].get("uid") != uid or obj["metadata"].get("deletionTimestamp"):
                return
            spec = obj["spec"]
            gates = [
                g for g in spec.get("schedulingGates") or [] if g.get("name") != ADMISSION_GATE
            ]
            if gates:
                spec["schedulingGates"] = gates
            else:
                spec.pop("schedulingGates", None)
            selector = spec.setdefault("nodeSelector", {})
            selector.update(queue.node_labels)
            selector[HOSTNAME] = node_name
            spec["nodeName"] = node_name

        namespace, name = _key(pod)
        try:
            admitted = self.store.update("pods", name, mutate, namespace)
        except ApiError as error:
            if error.code == 404:
                return None
            raise
        if admitted["spec"].get("nodeName") != node_name:
            return None
        self._admitted[uid] = next(self._counter)
        self.admissions.append((name, node_name))
        return admitted

    def _victims(
        self,
        pod: JSON,
        priority: int,
        demand: Mapping[str, Decimal],
        queue: _Queue,
        queues: Mapping[str, _Queue],
        nodes: list[JSON],
        live: list[JSON],
        priorities: Mapping[str, int | None],
    ) -> list[JSON]:
        """As few admitted pods of lower priority as make the quota and a node fit."""
        doomed = set().union(*self._preempting.values())  # victims of other preemptors
        candidates = [
            p
            for p in live
            if p["metadata"]["uid"] not in doomed
            and managed(p)
            and not gated(p)
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("spec") or {}).get("nodeName")
            and queues.get(self._queue_of(p) or "") is queue
            and (priorities.get(p["metadata"]["uid"]) or 0) < priority
        ]
        candidates.sort(
            key=lambda p: (
                priorities.get(p["metadata"]["uid"]) or 0,
                -self._admitted.get(p["metadata"]["uid"], -1),
            )
        )

        def enough(chosen: list[JSON]) -> bool:
            free = dict(queue.quota)
            add(free, queue.used, -1)
            for victim in chosen:
                add(free, pod_requests(victim))
            if not fits(demand, free):
                return False
            gone = frozenset(v["metadata"]["uid"] for v in chosen)
            return self._node_for(pod, demand, nodes, live, queue, gone) is not None

        chosen: list[JSON] = []
        for candidate in candidates:
            chosen.append(candidate)
            if enough(chosen):
                break
        else:
            return []
        for victim in list(reversed(chosen)):  # keep only the victims that are needed
            trial = [v for v in chosen if v is not victim]
            if enough(trial):
                chosen = trial
        return chosen

    def _preempt(self, preemptor: JSON, victims: list[JSON]) -> None:
        """`Stop`: the TerminationTarget condition, then a delete within the grace period."""
        uid = preemptor["metadata"]["uid"]
        message = (
            f"Preempted to accommodate a workload (UID: {uid}, JobUID: {uid}) due to "
            "prioritization in the ClusterQueue"
        )
        self._preempting[uid] = {v["metadata"]["uid"] for v in victims}
        for victim in victims:
            namespace, name = _key(victim)

            def condition(obj: JSON) -> None:
                conditions = obj.setdefault("status", {}).setdefault("conditions", [])
                conditions[:] = [c for c in conditions if c.get("type") != TERMINATION_TARGET]
                conditions.append(
                    {
                        "type": TERMINATION_TARGET,
                        "status": "True",
                        "reason": "WorkloadEvicted",
                        "message": message,
                        "lastTransitionTime": now(),
                    }
                )

            try:
                self.store.update("pods", name, condition, namespace, subresource="status")
                self.store.delete("pods", name, namespace)
            except ApiError as error:
                if error.code != 404:
                    raise
            self.preemptions.append((name, preemptor["metadata"]["name"]))

    def _bind_unmanaged(self, pods: list[JSON], nodes: list[JSON]) -> None:
        """The scheduler alone: bind ungated pods without a node that Kueue does not manage."""
        live = [p for p in pods if not is_terminal(p)]
        for pod in sorted(pods, key=self._order):
            spec = pod.get("spec") or {}
            if managed(pod) or spec.get("nodeName") or spec.get("schedulingGates"):
                continue
            if is_terminal(pod) or pod["metadata"].get("deletionTimestamp"):
                continue
            demand = pod_requests(pod)
            node = self._node_for(pod, demand, nodes, live, None)
            if node is None:
                continue
            node_name = node["metadata"]["name"]
            uid = pod["metadata"]["uid"]

            def bind(obj: JSON, node_name: str = node_name, uid: str = uid) -> None:
                if obj["metadata"].get("uid") == uid and not obj["spec"].get("nodeName"):
                    obj["spec"]["nodeName"] = node_name

            namespace, name = _key(pod)
            try:
                bound = self.store.update("pods", name, bind, namespace)
            except ApiError as error:
                if error.code == 404:
                    continue
                raise
            live.append(bound)
