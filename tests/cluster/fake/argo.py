"""An emulated Argo Workflows controller (v4.1): DAGs of container templates run as pods.

`ArgoController` watches Workflows and their pods and, as the real controller's `operate`,
reconciles each Workflow that has not ended: it assesses its pods into `status.nodes`, walks
its DAG, creates the pod of every node attempt whose dependencies hold and writes the status
in the shapes Argo writes (`reference/argo-workflows/testdata/`; the upstream code read for
them is `workflow/controller/operator.go`, `dag.go`, `workflowpod.go`, `exec_control.go`,
`workflow/common/ancestry.go`, `workflow/util/pod_name.go` and `workflow/progress/updater.go`
at v4.1.2):

- node ids `<workflow>-<fnv32a(node name)>`, pod names v2 `<workflow>-<template>-<fnv32a>`;
  pods labelled `workflows.argoproj.io/workflow` and annotated with their node id and name;
- the DAG root, `TaskGroup`s of a `withSequence`/`withItems`/`withParam` task with children
  `<task>(<index>:<item>)`, `Retry` nodes with attempts `(0)`, `(1)`, ... (`nodeFlag.retried`),
  `Pod` nodes with `phase`, `message` (`main: OOMKilled (exit code 137)`, `pod deleted`),
  `outputs.exitCode` as a string, `hostNodeName`, `startedAt`/`finishedAt`, `progress`;
  dependents are children of their dependencies' outbound nodes; `Omitted` nodes for
  dependencies that do not hold (`dependencies` are `depends` of Succeeded/Skipped/Daemoned,
  plus Failed/Errored with `continueOn`); a DAG fails on a failed leaf without `continueOn`;
- `retryStrategy` (`limit`, `retryPolicy`, `expression` over `lastRetry.*`): `No more retries
  left`, `retryStrategy.expression evaluated to false`; `{{retries}}`, `lastRetry.*`,
  `{{inputs.parameters.X}}`, `{{item}}`, `{{workflow.*}}`, `{{pod.name}}` and `{{=expr}}`
  substituted per attempt in the whole template (metadata and `podSpecPatch` included); the
  workflow's and the template's `podSpecPatch` applied as strategic merge patches;
- a pod gone while its node is `Pending` is created again as the same attempt (its
  `lastRetry` is then that attempt itself, as upstream: exit code "0", so a pod created again
  after an exit 137 gets the first memory); one gone while `Running` makes the node `Error`
  `pod deleted` without exit code;
- `shutdown: Stop`/`Terminate` as v4.1.2 does it for pods that are no exit handler's: no new
  pod (`workflow shutdown with strategy: Stop`), pending pods deleted, running ones sent SIGTERM
  and SIGKILL after their grace (through the kubelet, as Argo's exec into the container), their
  nodes `Failed` `workflow shutdown with strategy:  Stop` (two spaces, as upstream), Retry nodes
  `Stopped with strategy 'Stop'`, the DAG and the workflow `Failed`.

Names, expressions (the subset of expr simrun's manifests use), `{{...}}` substitution,
`depends` and fan-out items are in `argo_language.py`.

Refused loudly (the workflow ends in `Error` naming it, the refusal is kept in `errors`):
expressions outside that subset; steps, script, resource, suspend, HTTP, plugin and data
templates; nested DAGs, `dag.target`, `templateRef`, `when`, `onExit` and lifecycle hooks,
`synchronization`, `parallelism`, `templateDefaults`, `memoize`, a template's `timeout` or
`activeDeadlineSeconds`, `retryStrategy.backoff`/`affinity`, `OnTransientError`, input
artifacts, items that are lists or maps.

Not emulated and ignored: the workflow's `activeDeadlineSeconds`, `ttlStrategy` (a finished
workflow stays), `podGC` (pods stay, labelled completed), output parameters and artifacts
(`tasks.X.outputs` cannot be resolved), metrics, the emissary executor (the main container
runs its own command: no init container, no `ARGO_*` variables, a `wait` container only with
`executor_resources`), `taskResultsCompletionStatus`, `resourcesDuration`,
`estimatedDuration`, the 10 seconds Argo waits before it calls a vanished running pod deleted
(`recently_started_s`, 0 by default).

Where the spec 11 findings say a Retry node is `Pending` while its attempt is gated, v4.1.2's
`processNodeRetries` keeps it `Running`; this emulation follows the code.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from .argo_language import (
    Depends,
    Refused,
    Unresolved,
    evaluate_bool,
    expand_items,
    item_text,
    node_id,
    pod_name,
    substitute,
)
from .reconcile import JSON, Reconciler
from .store import ApiError, Store, now, strategic_merge_patch

LABEL_WORKFLOW = "workflows.argoproj.io/workflow"
LABEL_COMPLETED = "workflows.argoproj.io/completed"
LABEL_PHASE = "workflows.argoproj.io/phase"
ANNOTATION_NODE_ID = "workflows.argoproj.io/node-id"
ANNOTATION_NODE_NAME = "workflows.argoproj.io/node-name"
ANNOTATION_POD_NAME_FORMAT = "workflows.argoproj.io/pod-name-format"
ANNOTATION_DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
MAIN = "main"
WAIT = "wait"
EXECUTOR_IMAGE = "quay.io/argoproj/argoexec:v4.1.6"

FULFILLED = ("Succeeded", "Failed", "Error", "Skipped", "Omitted")
COMPLETED = ("Succeeded", "Failed", "Error")
FAILED_OR_ERROR = ("Failed", "Error")
WORKFLOW_ENDED = ("Succeeded", "Failed", "Error")

SignalPod = Callable[[str, str, int], None]
"""`(namespace, pod, signal)`: what Argo's exec of `kill` into a pod's containers does."""


# --- pods into node statuses (`assessNodeStatus`, `inferFailedReason`) ---------------------


def _container_statuses(pod: Mapping[str, Any]) -> list[JSON]:
    return list((pod.get("status") or {}).get("containerStatuses") or [])


def pending_reason(pod: Mapping[str, Any]) -> str:
    """`getPendingReason`: a waiting container's reason, or the Unschedulable condition's."""
    for status in _container_statuses(pod):
        waiting = (status.get("state") or {}).get("waiting")
        if waiting is not None:
            reason = waiting.get("reason") or ""
            return f"{reason}: {waiting['message']}" if waiting.get("message") else reason
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("reason") == "Unschedulable":
            message = condition.get("message")
            return f"Unschedulable: {message}" if message else "Unschedulable"
    return ""


def failed_reason(pod: Mapping[str, Any]) -> tuple[str, str]:
    """`inferFailedReason`: the phase and message of the node of a Failed pod."""
    status = pod.get("status") or {}
    if status.get("message"):
        return "Failed", str(status["message"])

    def order(name: str) -> int:
        return {MAIN: 1, WAIT: 2}.get(name, 3)

    statuses = sorted(_container_statuses(pod), key=lambda s: order(s.get("name", "")))
    statuses = list(status.get("initContainerStatuses") or []) + statuses
    if not statuses:
        namespace = (pod.get("metadata") or {}).get("namespace")
        name = (pod.get("metadata") or {}).get("name")
        return "Failed", f"can't find failed message for pod {name} namespace {namespace}"
    main_ok = wait_ok = False
    for container in statuses:
        name = container.get("name", "")
        state = container.get("state") or {}
        if state.get("waiting") is not None:
            waiting = state["waiting"]
            return "Error", (
                f"Pod failed before {name} container starts due to "
                f"{waiting.get('reason', '')}: {waiting.get('message', '')}"
            )
        terminated = state.get("terminated")
        if terminated is None:
            continue
        code = int(terminated.get("exitCode", 0))
        if code == 0:
            if name == MAIN:
                main_ok = True
            elif name == WAIT:
                wait_ok = True
            continue
        message = f"{terminated.get('reason', '')} (exit code {code})"
        if terminated.get("message"):
            message = f"{message}: {terminated['message']}"
        message = f"{name}: {message}"
        if name == "init" or name == WAIT:
            return "Error", message
        if name == MAIN or code not in (137, 143):
            return "Failed", message
    if main_ok and wait_ok:
        return "Succeeded", ""
    if main_ok:
        return "Failed", "pod failed: wait container did not complete successfully"
    if wait_ok:
        return "Failed", "pod failed: main container did not complete successfully"
    return "Failed", "pod failed: neither main nor wait container completed successfully"


def _exit_code(pod: Mapping[str, Any]) -> int | None:
    for status in _container_statuses(pod):
        terminated = (status.get("state") or {}).get("terminated")
        if status.get("name") == MAIN and terminated is not None:
            return int(terminated.get("exitCode", 0))
    return None


def _latest_finished(pod: Mapping[str, Any], fallback: str) -> str:
    status = pod.get("status") or {}
    latest = ""
    for container in list(status.get("initContainerStatuses") or []) + _container_statuses(pod):
        state = container.get("state") or {}
        if state.get("running") is not None:
            return fallback
        finished = (state.get("terminated") or {}).get("finishedAt") or ""
        latest = max(latest, finished)
    return latest or fallback


def assess(pod: Mapping[str, Any], old: Mapping[str, Any], stamp: str) -> JSON:
    """The node of a pod as Argo's `assessNodeStatus` makes it of the node before."""
    node = copy.deepcopy(dict(old))
    phase = (pod.get("status") or {}).get("phase")
    if phase == "Pending":
        node["phase"] = "Pending"
        node["message"] = pending_reason(pod)
    elif phase == "Succeeded":
        node["phase"] = "Succeeded"
    elif phase == "Failed":
        node["phase"], node["message"] = failed_reason(pod)
    elif phase == "Running":
        node["phase"] = "Running"
    else:
        node["phase"] = "Error"
        node["message"] = f"Unexpected pod phase for {pod['metadata']['name']}: {phase}"
    host = (pod.get("spec") or {}).get("nodeName")
    if host:
        node["hostNodeName"] = host
    node.setdefault("progress", "0/1")
    code = _exit_code(pod)
    if code is not None:
        node.setdefault("outputs", {})["exitCode"] = str(code)
    for container in _container_statuses(pod):
        if container.get("name") != WAIT:
            continue
        running = (container.get("state") or {}).get("running") is not None
        if running and node["phase"] in COMPLETED and phase != "Failed":
            node["phase"] = old.get("phase", "Pending")
    if (
        old.get("phase") == "Pending"
        and node["phase"] not in ("Pending", *FAILED_OR_ERROR)
        and old.get("message") == node.get("message")
    ):
        node.pop("message", None)
    if not node.get("message"):
        node.pop("message", None)
    if node["phase"] in FULFILLED and not node.get("finishedAt"):
        node["finishedAt"] = _latest_finished(pod, stamp)
    return node


def _age_s(stamp: str) -> float:
    started = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (dt.datetime.now(dt.UTC) - started).total_seconds()


# --- the controller ------------------------------------------------------------------------


class ArgoController(Reconciler):
    """The emulated workflow controller: reconciles every Workflow that has not ended.

    `signal_pod` delivers a signal to a pod's running containers (the kubelet's, given by
    `FakeCluster`); `executor_resources` adds Argo's `wait` container with these resources to
    every pod (Kueue and the scheduler count it); `recently_started_s` is how long a pod may be
    missing before its running node is called deleted (Argo: 10 s).
    """

    name = "argo"
    plurals = ("workflows", "pods")

    def __init__(
        self,
        store: Store,
        *,
        signal_pod: SignalPod | None = None,
        executor_resources: Mapping[str, Any] | None = None,
        recently_started_s: float = 0.0,
        resync_s: float = 0.5,
    ) -> None:
        super().__init__(store, resync_s=resync_s)
        self.signal_pod = signal_pod
        self.executor_resources = dict(executor_resources) if executor_resources else None
        self.recently_started_s = recently_started_s
        self.pods_created: list[JSON] = []
        """Every pod manifest the controller created, in order (for tests)."""
        self._kills: list[asyncio.TimerHandle] = []

    async def reconcile(self) -> None:
        workflows, _ = self.store.list("workflows")
        pods, _ = self.store.list("pods", labels=LABEL_WORKFLOW)
        by_workflow: dict[tuple[str, str], list[JSON]] = {}
        for pod in pods:
            meta = pod["metadata"]
            key = (meta.get("namespace", ""), meta["labels"][LABEL_WORKFLOW])
            by_workflow.setdefault(key, []).append(pod)
        for workflow in workflows:
            meta = workflow["metadata"]
            if (workflow.get("status") or {}).get("phase") in WORKFLOW_ENDED:
                continue
            if meta.get("deletionTimestamp"):
                continue
            pods_of = by_workflow.get((meta["namespace"], meta["name"]), [])
            _Operation(self, workflow, pods_of).run()

    def terminate(self, namespace: str, pod: JSON) -> None:
        """`TerminateContainers`: SIGTERM now, SIGKILL after the pod's grace period."""
        if self.signal_pod is None:
            self.refuse("shutdown of a running pod needs the kubelet's signal_pod")
            return
        name = pod["metadata"]["name"]
        self.signal_pod(namespace, name, 15)
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        grace = 30 if grace is None else int(grace)
        loop = asyncio.get_running_loop()
        self._kills.append(loop.call_later(grace, self.signal_pod, namespace, name, 9))

    async def close(self) -> None:
        for handle in self._kills:
            handle.cancel()


class _Operation:
    """One `operate` of one Workflow: read its status, act, write the status back."""

    def __init__(self, controller: ArgoController, workflow: JSON, pods: list[JSON]) -> None:
        self.controller = controller
        self.store = controller.store
        self.workflow = workflow
        self.name: str = workflow["metadata"]["name"]
        self.namespace: str = workflow["metadata"]["namespace"]
        self.spec: JSON = workflow.get("spec") or {}
        self.status: JSON = copy.deepcopy(workflow.get("status") or {})
        self.nodes: dict[str, JSON] = self.status.setdefault("nodes", {})
        self.pods = {self._pod_node_id(pod): pod for pod in pods}
        self.templates = {t["name"]: t for t in self.spec.get("templates") or []}
        self.shutdown: str | None = self.spec.get("shutdown") or None
        self.stamp = now()
        self.globals = {
            "workflow.name": self.name,
            "workflow.namespace": self.namespace,
            "workflow.uid": workflow["metadata"].get("uid", ""),
            "workflow.serviceAccountName": self.spec.get("serviceAccountName", ""),
        }
        for parameter in (self.spec.get("arguments") or {}).get("parameters") or []:
            self.globals[f"workflow.parameters.{parameter['name']}"] = str(
                parameter.get("value", "")
            )

    def _pod_node_id(self, pod: JSON) -> str:
        annotations = pod["metadata"].get("annotations") or {}
        if ANNOTATION_NODE_ID in annotations:
            return annotations[ANNOTATION_NODE_ID]
        return node_id(self.name, annotations.get(ANNOTATION_NODE_NAME, ""))

    # -- the whole operation

    def run(self) -> None:
        message = ""
        try:
            self._check_spec()
            first = not self.status.get("phase")
            if first:
                self.status["phase"] = "Running"
                self.status["startedAt"] = self.stamp
            else:
                self._reconcile_pods()
                self._fail_retries_on_shutdown()
            entry = self.spec.get("entrypoint")
            root = self.execute_template(
                self.name, {"template": entry}, self.spec.get("arguments") or {}, ""
            )
            phase = {
                "Succeeded": "Succeeded",
                "Skipped": "Succeeded",
                "Omitted": "Succeeded",
                "Failed": "Failed",
                "Error": "Error",
            }.get(root["phase"])
            if phase is not None:
                message = root.get("message", "")
                if phase in FAILED_OR_ERROR and self.shutdown:
                    message = f"Stopped with strategy '{self.shutdown}'"
                self._end(phase, message)
        except Refused as refused:
            text = f"workflow {self.namespace}/{self.name}: {refused}"
            self.controller.refuse(text)
            self._end("Error", f"the fake Argo controller refuses: {refused}")
        self._progress()
        self._conditions()
        self._write()
        self._label_completed_pods()

    def _check_spec(self) -> None:
        for key in ("onExit", "hooks", "synchronization", "parallelism", "templateDefaults"):
            if self.spec.get(key):
                raise Refused(f"spec.{key} is not emulated")
        if self.spec.get("workflowTemplateRef"):
            raise Refused("spec.workflowTemplateRef is not emulated")
        if self.shutdown not in (None, "Stop", "Terminate"):
            raise Refused(f"spec.shutdown {self.shutdown!r} is not a shutdown strategy")

    def _end(self, phase: str, message: str) -> None:
        self.status["phase"] = phase
        self.status.setdefault("startedAt", self.stamp)
        self.status["finishedAt"] = self.status.get("finishedAt") or self.stamp
        if message:
            self.status["message"] = message
        else:
            self.status.pop("message", None)

    def _conditions(self) -> None:
        running = any(
            n.get("type") == "Pod" and n.get("phase") == "Running" for n in self.nodes.values()
        )
        conditions = [{"type": "PodRunning", "status": "True" if running else "False"}]
        if self.status.get("phase") in WORKFLOW_ENDED:
            conditions.append({"type": "Completed", "status": "True"})
        self.status["conditions"] = conditions

    def _progress(self) -> None:
        """`UpdateProgress`: executable nodes N/M, the others the sum of what they reach."""
        total = [0, 0]
        for node in self.nodes.values():
            if node.get("type") != "Pod":
                continue
            n, m = (int(x) for x in node.setdefault("progress", "0/1").split("/"))
            if node.get("phase") in ("Succeeded", "Skipped", "Omitted"):
                n = m
                node["progress"] = f"{m}/{m}"
            total[0] += n
            total[1] += m
        for node in self.nodes.values():
            if node.get("type") == "Pod":
                continue
            summed = self._sum_progress(node, set())
            if summed[1] > 0:
                node["progress"] = f"{summed[0]}/{summed[1]}"
        if total[1] > 0:
            self.status["progress"] = f"{total[0]}/{total[1]}"

    def _sum_progress(self, node: JSON, visited: set[str]) -> list[int]:
        progress = [0, 0]
        for child_id in node.get("children") or []:
            if child_id in visited or child_id not in self.nodes:
                continue
            visited.add(child_id)
            child = self.nodes[child_id]
            deeper = self._sum_progress(child, visited)
            progress = [progress[0] + deeper[0], progress[1] + deeper[1]]
            if child.get("type") == "Pod":
                n, m = (int(x) for x in child.get("progress", "0/1").split("/"))
                progress = [progress[0] + n, progress[1] + m]
        return progress

    def _write(self) -> None:
        status = self.status
        phase = status.get("phase")

        def mutate(obj: JSON) -> None:
            meta = obj["metadata"]
            annotations = meta.setdefault("annotations", {})
            annotations.setdefault(ANNOTATION_POD_NAME_FORMAT, "v2")
            labels = meta.setdefault("labels", {})
            if phase:
                labels[LABEL_PHASE] = phase
                labels[LABEL_COMPLETED] = "true" if phase in WORKFLOW_ENDED else "false"
            obj["status"] = status

        try:
            self.store.update("workflows", self.name, mutate, self.namespace)
        except ApiError as error:
            if error.code != 404:  # a workflow deleted meanwhile has nothing to write to
                raise

    def _label_completed_pods(self) -> None:
        """`queuePodsForCleanup` without a podGC: the pods of fulfilled nodes labelled
        `workflows.argoproj.io/completed: "true"`."""
        for identifier, pod in self.pods.items():
            node = self.nodes.get(identifier)
            labels = pod["metadata"].get("labels") or {}
            if node is None or node.get("phase") not in FULFILLED:
                continue
            if labels.get(LABEL_COMPLETED) == "true":
                continue
            patch = {"metadata": {"labels": {LABEL_COMPLETED: "true"}}}
            try:
                self.store.patch("pods", pod["metadata"]["name"], patch, namespace=self.namespace)
            except ApiError as error:
                if error.code != 404:
                    raise

    # -- nodes

    def by_name(self, name: str) -> JSON | None:
        return self.nodes.get(node_id(self.name, name))

    def init_node(
        self,
        name: str,
        kind: str,
        template: str,
        boundary: str,
        phase: str,
        *,
        inputs: list[JSON] | None = None,
        flag: JSON | None = None,
        message: str = "",
    ) -> JSON:
        """`initializeNode`: a node of a name, its display name relative to its boundary."""
        identifier = node_id(self.name, name)
        display = name
        boundary_node = self.nodes.get(boundary)
        if boundary_node is not None:
            display = re.sub(r"^(\[(\d+)\])?\.", "", name.removeprefix(boundary_node["name"]))
        node: JSON = {
            "id": identifier,
            "name": name,
            "displayName": display,
            "type": kind,
            "templateName": template,
            "templateScope": f"local/{self.name}",
            "phase": phase,
            "startedAt": self.stamp,
        }
        if boundary:
            node["boundaryID"] = boundary
        if flag is not None:
            node["nodeFlag"] = flag
        if kind == "Pod":
            node["taskResultSynced"] = True
            node["progress"] = "0/1"
        if inputs:
            node["inputs"] = {"parameters": inputs}
        if message:
            node["message"] = message
        if phase in FULFILLED:
            node["finishedAt"] = self.stamp
        self.nodes[identifier] = node
        return node

    def mark(self, node: JSON, phase: str, message: str | None = None) -> JSON:
        """`markNodePhase`: the phase, the message when given, `finishedAt` once fulfilled."""
        node["phase"] = phase
        if message is not None:
            if message:
                node["message"] = message
            else:
                node.pop("message", None)
        if phase in FULFILLED and not node.get("finishedAt"):
            node["finishedAt"] = self.stamp
        return node

    def add_child(self, parent: JSON, child_name: str) -> None:
        child = node_id(self.name, child_name)
        children = parent.setdefault("children", [])
        if child not in children:
            children.append(child)

    def retried_children(self, node: JSON) -> list[JSON]:
        found = []
        for child_id in node.get("children") or []:
            child = self.nodes.get(child_id)
            if child is not None and (child.get("nodeFlag") or {}).get("retried"):
                found.append(child)
        return found

    def outbound(self, node: JSON) -> list[str]:
        """`getOutboundNodes`: where the dependents of a node hang."""
        kind = node.get("type")
        if kind in ("Skipped", "Pod"):
            return [node["id"]]
        if kind == "TaskGroup":
            children = node.get("children") or []
            if not children:
                return [node["id"]]
            found: list[str] = []
            for child in children:
                if child in self.nodes:
                    found += self.outbound(self.nodes[child])
            return found
        if kind == "Retry":
            children = node.get("children") or []
            if children:
                return [children[-1]]
        found = []
        for other in node.get("outboundNodes") or []:
            if other in self.nodes:
                found += self.outbound(self.nodes[other])
        return found

    # -- pods into nodes, and the shutdown of pods

    def _reconcile_pods(self) -> None:
        seen: set[str] = set()
        for identifier, pod in self.pods.items():
            seen.add(identifier)
            node = self.nodes.get(identifier)
            if node is None:
                continue
            self.nodes[identifier] = node = assess(pod, node, self.stamp)
            phase = (pod.get("status") or {}).get("phase")
            if self.shutdown and node["phase"] not in FULFILLED and phase in ("Pending", "Running"):
                if phase == "Pending":
                    self._delete_pod(pod)
                else:
                    self.controller.terminate(self.namespace, pod)
                self.mark(node, "Failed", f"workflow shutdown with strategy:  {self.shutdown}")
        for identifier, node in self.nodes.items():
            if node.get("type") != "Pod" or node.get("phase") in FULFILLED:
                continue
            if identifier in seen or not node.get("startedAt") or node.get("phase") == "Pending":
                continue
            if _age_s(node["startedAt"]) < self.controller.recently_started_s:
                continue  # Argo waits for its informer before it calls a pod deleted
            self.mark(node, "Error", "pod deleted")

    def _fail_retries_on_shutdown(self) -> None:
        """Retry nodes left Running with every attempt fulfilled fail on a shutdown."""
        if not self.shutdown:
            return
        for node in self.nodes.values():
            if node.get("type") != "Retry" or node.get("phase") in FULFILLED:
                continue
            children = [self.nodes.get(c) for c in node.get("children") or []]
            if all(c is not None and c.get("phase") in FULFILLED for c in children):
                self.mark(node, "Failed", f"Stopped with strategy '{self.shutdown}'")

    def _delete_pod(self, pod: JSON) -> None:
        try:
            self.store.delete("pods", pod["metadata"]["name"], self.namespace)
        except ApiError as error:
            if error.code != 404:
                raise

    # -- templates

    def execute_template(
        self, node_name: str, holder: Mapping[str, Any], arguments: Mapping[str, Any], boundary: str
    ) -> JSON:
        """`executeTemplate` of a DAG or a container template under a node name."""
        if holder.get("templateRef"):
            raise Refused(f"node {node_name!r}: templateRef is not emulated")
        template_name = holder.get("template")
        template = self.templates.get(template_name or "")
        if template is None:
            raise Refused(f"node {node_name!r}: template {template_name!r} not found")
        node = self.by_name(node_name)
        if node is not None and node["phase"] in FULFILLED:
            return node
        inputs = self._inputs(template, arguments, node_name)
        if "dag" in template:
            if boundary:
                raise Refused(f"node {node_name!r}: nested DAG templates are not emulated")
            return self.execute_dag(node_name, template, inputs)
        if "container" not in template:
            kinds = sorted(
                k
                for k in ("steps", "script", "resource", "suspend", "http", "plugin", "data")
                if k in template
            )
            raise Refused(
                f"template {template_name!r}: {'/'.join(kinds) or 'its type'} is not emulated"
            )
        for key in ("synchronization", "memoize", "hooks", "timeout", "activeDeadlineSeconds"):
            if template.get(key):
                raise Refused(f"template {template_name!r}: {key} is not emulated")
        strategy = template.get("retryStrategy") or self.spec.get("retryStrategy")
        scope = {**self.globals}
        scope.update({f"inputs.parameters.{p['name']}": p["value"] for p in inputs})
        if strategy is None:
            return self.execute_container(node_name, template, inputs, scope, boundary, None)
        return self._execute_retries(node_name, template, inputs, scope, boundary, strategy)

    def _inputs(
        self, template: Mapping[str, Any], arguments: Mapping[str, Any], node_name: str
    ) -> list[JSON]:
        given = {p["name"]: p for p in arguments.get("parameters") or []}
        values = []
        for parameter in (template.get("inputs") or {}).get("parameters") or []:
            name = parameter["name"]
            argument = given.get(name, {})
            if "value" in argument:
                value = argument["value"]
            elif "value" in parameter:
                value = parameter["value"]
            else:
                raise Refused(f"node {node_name!r}: inputs.parameters.{name} was not supplied")
            values.append({"name": name, "value": item_text(value, node_name)})
        if (template.get("inputs") or {}).get("artifacts"):
            raise Refused(f"template {template['name']!r}: input artifacts are not emulated")
        return values

    def _execute_retries(
        self,
        node_name: str,
        template: JSON,
        inputs: list[JSON],
        scope: dict[str, str],
        boundary: str,
        strategy: Mapping[str, Any],
    ) -> JSON:
        retry = self.by_name(node_name)
        if retry is None:
            retry = self.init_node(
                node_name, "Retry", template["name"], boundary, "Running", inputs=inputs
            )
        self._process_retries(retry, strategy)
        attempts = self.retried_children(retry)
        if retry["phase"] in FULFILLED:
            if attempts and "outputs" in attempts[-1]:
                retry["outputs"] = copy.deepcopy(attempts[-1]["outputs"])
            return retry
        last = attempts[-1] if attempts else None
        if last is not None and last["phase"] not in FULFILLED:
            attempt, attempt_name = len(attempts) - 1, last["name"]
        else:
            attempt = len(attempts)
            attempt_name = f"{node_name}({attempt})"
            self.add_child(retry, attempt_name)
        scope = {**scope, "retries": str(attempt)}
        scope["lastRetry.exitCode"] = "0"
        scope["lastRetry.status"] = ""
        scope["lastRetry.duration"] = "0"
        scope["lastRetry.message"] = ""
        if last is not None:  # as upstream: the unfinished attempt itself when it is the last
            scope["lastRetry.exitCode"] = (last.get("outputs") or {}).get("exitCode", "0")
            scope["lastRetry.status"] = last.get("phase", "")
            scope["lastRetry.message"] = last.get("message", "")
        self.execute_container(attempt_name, template, inputs, scope, boundary, {"retried": True})
        return retry

    def _process_retries(self, retry: JSON, strategy: Mapping[str, Any]) -> None:
        """`processNodeRetries`: end the Retry node, or leave it for a next attempt."""
        attempts = self.retried_children(retry)
        if not attempts:
            return
        last = attempts[-1]
        if last["phase"] not in FULFILLED:
            return
        if last["phase"] not in FAILED_OR_ERROR:
            self.mark(retry, "Succeeded")
            return
        if self.shutdown:
            self.mark(retry, last["phase"], f"Stopped with strategy '{self.shutdown}'")
            return
        if strategy.get("backoff"):
            raise Refused("retryStrategy.backoff is not emulated")
        if strategy.get("affinity"):
            raise Refused("retryStrategy.affinity is not emulated")
        policy = strategy.get("retryPolicy") or (
            "OnFailure" if not strategy.get("expression") else "Always"
        )
        if policy == "OnTransientError":
            raise Refused("retryPolicy OnTransientError is not emulated")
        on_failed = policy in ("Always", "OnFailure")
        on_error = policy in ("Always", "OnError")
        if policy not in ("Always", "OnFailure", "OnError"):
            raise Refused(f"{policy} is not a valid RetryPolicy")
        if (last["phase"] == "Failed" and not on_failed) or (
            last["phase"] == "Error" and not on_error
        ):
            self.mark(retry, last["phase"], last.get("message", ""))
            return
        limit = strategy.get("limit")
        if limit is not None and len(attempts) > int(str(limit)):
            self.mark(retry, last["phase"], "No more retries left")
            return
        expression = strategy.get("expression")
        if expression:
            local = {
                **self.globals,
                "retries": str(len(attempts) - 1),
                "lastRetry.exitCode": (last.get("outputs") or {}).get("exitCode", "-1"),
                "lastRetry.status": last.get("phase", ""),
                "lastRetry.duration": "0",
                "lastRetry.message": last.get("message", ""),
            }
            if not evaluate_bool(str(expression), local):
                self.mark(retry, last["phase"], "retryStrategy.expression evaluated to false")

    def execute_container(
        self,
        node_name: str,
        template: JSON,
        inputs: list[JSON],
        scope: dict[str, str],
        boundary: str,
        flag: JSON | None,
    ) -> JSON:
        """`executeContainer`: the Pod node and its pod (created when it has none)."""
        node = self.by_name(node_name)
        if node is None:
            node = self.init_node(
                node_name, "Pod", template["name"], boundary, "Pending", inputs=inputs, flag=flag
            )
        if node["phase"] in FULFILLED or node["id"] in self.pods:
            return node
        if self.shutdown:
            return self.mark(node, "Failed", f"workflow shutdown with strategy: {self.shutdown}")
        name = pod_name(self.name, node_name, template["name"])
        try:
            manifest = self._pod(node, template, {**scope, "pod.name": name}, name)
        except Unresolved as error:
            return self.mark(node, "Error", str(error))
        try:
            created = self.store.create("pods", manifest, self.namespace)
        except ApiError as error:
            if error.code == 409:
                return node
            return self.mark(node, "Error", error.message)
        self.pods[node["id"]] = created
        self.controller.pods_created.append(created)
        return node

    def _pod(self, node: JSON, template: JSON, scope: dict[str, str], name: str) -> JSON:
        """`createWorkflowPod`: the pod of an attempt, before Kueue's admission hook."""
        spec = self.spec
        template = substitute(template, scope)
        main = copy.deepcopy(template["container"])
        main["name"] = MAIN
        containers = [main]
        if self.controller.executor_resources is not None:
            resources = copy.deepcopy(self.controller.executor_resources)
            wait = {
                "name": WAIT,
                "image": EXECUTOR_IMAGE,
                "command": ["argoexec"],
                "args": ["wait", "--loglevel", "info"],
                "resources": resources,
            }
            containers.insert(0, wait)
        labels = {LABEL_WORKFLOW: self.name, LABEL_COMPLETED: "false"}
        annotations = {
            ANNOTATION_NODE_NAME: node["name"],
            ANNOTATION_NODE_ID: node["id"],
            ANNOTATION_DEFAULT_CONTAINER: MAIN,
        }
        pod_metadata = substitute(spec.get("podMetadata") or {}, self.globals)
        for source in (pod_metadata, template.get("metadata") or {}):
            labels.update(source.get("labels") or {})
            annotations.update(source.get("annotations") or {})
        pod_spec: JSON = {"restartPolicy": "Never", "containers": containers}
        volumes = list(spec.get("volumes") or []) + list(template.get("volumes") or [])
        if volumes:
            pod_spec["volumes"] = copy.deepcopy(volumes)
        account = template.get("serviceAccountName") or spec.get("serviceAccountName")
        if account:
            pod_spec["serviceAccountName"] = account
        for key in ("nodeSelector", "tolerations", "affinity", "schedulerName", "securityContext"):
            value = template.get(key) or spec.get(key)
            if value:
                pod_spec[key] = copy.deepcopy(value)
        priority = template.get("priorityClassName") or spec.get("podPriorityClassName")
        if priority:
            pod_spec["priorityClassName"] = priority
        for patch in (spec.get("podSpecPatch"), template.get("podSpecPatch")):
            if patch:
                pod_spec = self._patched(pod_spec, substitute(patch, scope))
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "argoproj.io/v1alpha1",
                        "kind": "Workflow",
                        "name": self.name,
                        "uid": self.workflow["metadata"].get("uid", ""),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": pod_spec,
        }

    def _patched(self, pod_spec: JSON, patch_text: str) -> JSON:
        """`ApplyPodSpecPatch`: a YAML or JSON patch, strategically merged."""
        try:
            patch = yaml.safe_load(patch_text)
        except yaml.YAMLError as error:
            raise Refused(f"podSpecPatch is neither JSON nor YAML: {error}") from None
        if not isinstance(patch, dict):
            raise Refused(f"invalid podSpecPatch {patch_text!r}: not an object")
        merged = strategic_merge_patch(pod_spec, patch)
        assert isinstance(merged, dict)
        return merged

    # -- the DAG

    def execute_dag(self, node_name: str, template: JSON, inputs: list[JSON]) -> JSON:
        """`executeDAG`: run every task whose dependencies hold, then assess the DAG."""
        dag = template["dag"] or {}
        if dag.get("target"):
            raise Refused(f"template {template['name']!r}: dag.target is not emulated")
        node = self.by_name(node_name)
        if node is None:
            node = self.init_node(node_name, "DAG", template["name"], "", "Running", inputs=inputs)
        tasks = {task["name"]: task for task in dag.get("tasks") or []}
        context = _Dag(self, node, tasks, dag.get("failFast") is not False)
        for name in tasks:
            context.execute(name)
        phase = context.assess(bool(self.shutdown))
        if phase in ("Failed", "Error", "Succeeded"):
            outbound: list[str] = []
            for target in context.targets():
                target_node = context.task_node(target)
                if target_node is not None:
                    outbound += self.outbound(target_node)
            node["outboundNodes"] = outbound
            self.mark(node, phase)
        return node


class _Dag:
    """The tasks of one DAG and the walk over them (`dagContext`)."""

    def __init__(
        self, operation: _Operation, node: JSON, tasks: dict[str, JSON], fail_fast: bool
    ) -> None:
        self.op = operation
        self.fail_fast = fail_fast
        self.node = node
        self.tasks = tasks
        self.visited: set[str] = set()
        self.depends = {name: Depends.of_task(task, tasks) for name, task in tasks.items()}
        for name, depends in self.depends.items():
            for other in depends.tasks():
                if other not in tasks:
                    raise Refused(f"task {name!r} depends on {other!r}, which is no task")
        for name, task in tasks.items():
            for key in ("when", "onExit", "hooks", "templateRef", "inline"):
                if task.get(key):
                    raise Refused(f"task {name!r}: {key} is not emulated")

    def task_name(self, task: str) -> str:
        return f"{self.node['name']}.{task}"

    def task_node(self, task: str) -> JSON | None:
        return self.op.by_name(self.task_name(task))

    def targets(self) -> list[str]:
        """`findLeafTaskNames`: the tasks no task depends on, sorted."""
        depended = {other for depends in self.depends.values() for other in depends.tasks()}
        return sorted(name for name in self.tasks if name not in depended)

    def connect(self, child_name: str, group: JSON | None, dependencies: list[str]) -> None:
        """`connectDependencies`: hang a node below its group, the DAG or its dependencies."""
        if not dependencies or group is not None:
            self.op.add_child(group if group is not None else self.node, child_name)
            return
        for dependency in dependencies:
            dependency_node = self.task_node(dependency)
            if dependency_node is None:
                continue
            for outbound in self.op.outbound(dependency_node):
                parent = self.op.nodes.get(outbound)
                if parent is not None:
                    self.op.add_child(parent, child_name)

    def results(self, task: str) -> dict[str, bool] | None:
        node = self.task_node(task)
        if node is None or node["phase"] not in FULFILLED:
            return None
        phase = node["phase"]
        any_succeeded = all_failed = False
        if node.get("type") == "TaskGroup":
            phases = [
                self.op.nodes[c]["phase"] for c in node.get("children") or [] if c in self.op.nodes
            ]
            any_succeeded = "Succeeded" in phases
            all_failed = bool(phases) and all(p == "Failed" for p in phases)
        return {
            "Succeeded": phase == "Succeeded",
            "Failed": phase == "Failed",
            "Errored": phase == "Error",
            "Skipped": phase == "Skipped",
            "Omitted": phase == "Omitted",
            "Daemoned": False,
            "AnySucceeded": any_succeeded,
            "AllFailed": all_failed,
        }

    def execute(self, task_name: str) -> None:
        """`executeDAGTask`: a task's dependencies first, then its node(s)."""
        if task_name in self.visited:
            return
        self.visited.add(task_name)
        task = self.tasks[task_name]
        node = self.task_node(task_name)
        if node is not None and node["phase"] in FULFILLED:
            return
        depends = self.depends[task_name]
        dependencies = depends.tasks()
        node_name = self.task_name(task_name)
        group = node if node is not None and node.get("type") == "TaskGroup" else None
        if dependencies:
            for dependency in dependencies:
                self.execute(dependency)
            results = {d: self.results(d) for d in dependencies}
            if any(r is None for r in results.values()):
                return
            if not depends.holds({k: v for k, v in results.items() if v is not None}):
                self.op.init_node(
                    node_name,
                    "Skipped",
                    task["template"],
                    self.node["id"],
                    "Omitted",
                    flag={},
                    message="omitted: depends condition not met",
                )
                self.connect(node_name, None, dependencies)
                return
        expanded: list[tuple[str, JSON]] = []
        try:
            items = expand_items(task, self.op.globals)
            if items is None:
                arguments = substitute(task.get("arguments") or {}, self.op.globals)
                expanded.append((task_name, arguments))
            else:
                for index, item in enumerate(items):
                    scope = {**self.op.globals, "item": item}
                    arguments = substitute(task.get("arguments") or {}, scope)
                    expanded.append((f"{task_name}({index}:{item})", arguments))
        except Unresolved as error:  # e.g. `tasks.X.outputs`: outputs are not emulated
            raise Refused(f"task {task_name!r}: {error}") from None
        if items is not None:
            if not expanded:
                if node is None:
                    self.op.init_node(
                        node_name,
                        "Skipped",
                        task["template"],
                        self.node["id"],
                        "Skipped",
                        flag={},
                        message="Skipped, empty params",
                    )
                    self.connect(node_name, None, dependencies)
                return
            if group is None:
                self.connect(node_name, None, dependencies)
                group = self.op.init_node(
                    node_name, "TaskGroup", task["template"], self.node["id"], "Running", flag={}
                )
        for name, arguments in expanded:
            child_name = self.task_name(name)
            if self.op.by_name(child_name) is None:
                self.connect(child_name, group, dependencies)
            self.op.execute_template(child_name, task, arguments, self.node["id"])
        if group is not None:
            phase = "Succeeded"
            for name, _ in expanded:
                child = self.op.by_name(self.task_name(name))
                if child is None or child["phase"] not in FULFILLED:
                    return
                if child["phase"] in FAILED_OR_ERROR:
                    phase = child["phase"]
            self.op.mark(group, phase)

    def assess(self, shutdown: bool) -> str:
        """`assessDAGPhase`: Running while a node it reaches runs, else by its leaves."""
        if shutdown:
            return "Failed"
        nodes = self.op.nodes
        target_ids = {node_id(self.op.name, self.task_name(t)): t for t in self.targets()}
        target_phases = dict.fromkeys(target_ids, "")
        queue: list[tuple[str, str]] = [(c, "Succeeded") for c in self.node.get("children") or []]
        seen: set[tuple[str, str]] = set()
        while queue:
            current, branch = queue.pop(0)
            if (current, branch) in seen:
                continue
            seen.add((current, branch))
            node = nodes.get(current)
            if node is None:
                return "Running"
            if node["phase"] not in FULFILLED:
                return "Running"
            if node["phase"] in COMPLETED:
                branch = node["phase"]
            if current in target_phases and target_phases[current] not in FAILED_OR_ERROR:
                target_phases[current] = branch
            if node.get("type") == "Retry":
                attempts = [nodes[c] for c in node.get("children") or [] if c in nodes]
                following = [c for a in reversed(attempts) for c in a.get("children") or []]
                queue += [(c, branch) for c in following]
            else:
                queue += [(c, branch) for c in node.get("children") or []]
        fail_fast = self.fail_fast
        result = "Succeeded"
        for identifier, task in sorted(target_ids.items(), key=lambda item: item[1]):
            branch = target_phases[identifier]
            if branch == "":
                result = "Running"
                if not fail_fast:
                    break
            elif branch in FAILED_OR_ERROR:
                continue_on = self.tasks[task].get("continueOn") or {}
                if continue_on.get("failed" if branch == "Failed" else "error"):
                    continue
                result = branch
                if fail_fast:
                    break
        return result
