"""The Argo `Workflow` of a run: one DAG, a scatter of workers per split task (spec 32).

A split task of `pods` pods is DAG tasks of one worker template running `simrun-worker`:
`<task>-w0`, the coordinator (worker `w0`, role `base`, the base priority), which returns once
the ledger is complete and merges (`SIMRUN_MERGE=1`, `TaskPlan.coordinator_merges`), and
`<task>-extra` over `withSequence: {start: 1, count: pods - 1}` (workers `w<item>`, role
`extra`, the extra priority; left out for one pod), which continues on failure and error, so an
extra worker that fails never fails the run. A plan whose coordinator does not merge (recorded
before it did) has a node `<task>-merge` running `simrun-merge` after `<task>-w0` only. An
unsplit task is one pod `<task>` running `simrun-exec` (a plugin type) or its argv (`command`).
A task waits for the tasks it reads from: a split one for its merge (`<task>-w0` when that
merges, else `<task>-merge`).

The environment of every pod is `Launch.to_env()` of `launch_for` (spec 31's `env_values`),
computed once per template: what differs between the coordinator and the extra workers (the
worker, the role, the merge) are the template's input parameters, and what differs after a kill
for memory is in its `podSpecPatch` (`simrun_core.argo.retry`). The workflow's name is fixed by
its run (`workflow_name`), so a submission that is repeated creates it once.

A run whose environment has an image (`record.image`, from `environment-resolved`) runs its
pods in it, and each of them installs the snapshots of the run's sources at its start
(`SIMRUN_EDITABLE`, the snapshots below the store's mount in the order of the sources): the
image has their dependencies and build backends, not their code (`simrun_core.environment`).

A Workflow made for a run that ran before (its Workflow was deleted, or expired while the
service was down) leaves out the tasks done, so their readers wait for nothing of them; starts
each worker at the attempt after those the run had (`first_attempts`: Argo counts the retries of
every node from 0 again, so the pods add their worker's first attempt, `SIMRUN_FIRST_ATTEMPTS`,
and the Workflow's annotation `simrun/first-attempts` tells the backend); and gives the workers
killed for memory before (`retry_memory`) the retry memory from their first attempt on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Set
from pathlib import PurePosixPath
from typing import Any, Final

from simrun_core import launch as contract
from simrun_core.argo import labels
from simrun_core.argo.pod import MAIN, gib, mounts, parameter, pod_template, volumes
from simrun_core.argo.pod import environment as pod_environment
from simrun_core.argo.retry import GRACE_MARGIN_S, pod_spec_patch, retry_condition
from simrun_core.cluster import ClusterConfig
from simrun_core.errors import Problem, WorkflowError
from simrun_core.fold import RunRecord
from simrun_core.naming import workflow_name
from simrun_core.planner import Node, PodShape, TaskPlan, shape
from simrun_core.plugins import TaskType
from simrun_core.pod_command import COMMAND_TYPE, pod_command
from simrun_core.resources import ResolvedResources
from simrun_core.workflow import TaskSpec

API_VERSION: Final = "argoproj.io/v1alpha1"
ENTRYPOINT: Final = "dag"
MERGE_WORKER: Final = "merge"
"""The worker id of a `<task>-merge` node (`simrun-merge`'s default)."""
PRIORITY_PARAMETER: Final = "priority"
_PLACEHOLDER_NODE: Final = "node"
"""The node given to `launch_for`; a pod's env reads its node from `spec.nodeName` instead."""
_SAMPLE_EXTRA: Final = "w1"
"""An extra worker whose launch tells what the extra workers' env has of its own."""


def workflow_manifest(
    record: RunRecord,
    types: Mapping[str, TaskType],
    config: ClusterConfig,
    *,
    default_image: str | None = None,
    done: Set[str] = frozenset(),
    first_attempts: Mapping[tuple[str, str], int] | None = None,
    retry_memory: Set[tuple[str, str]] = frozenset(),
) -> dict[str, Any]:
    """The Argo Workflow of a run, from its record (its workflow, plans, resources, priority,
    group, reservation and image) on the cluster of `config`.

    The image of a `command` task is the one of its settings, of another task its type's, else
    the run's (`record.image`), else `default_image` (the service's). The settings of every task
    are in `<task dir>/settings.json` before the workflow is submitted; the manifest does not
    carry them. Pure.

    For a run that ran before (see the module): the tasks of `done` are left out, the first
    attempt of each (task, worker) is its value of `first_attempts` (0 when none), and the
    (task, worker) pairs of `retry_memory` have the retry memory from their first attempt on.

    Raises WorkflowError naming the task: one without a plan, of an unknown type, without an
    image or a command, or whose DAG node names another task's.
    """
    builder = _Builder(record, types, config, default_image, first_attempts or {}, retry_memory)
    for task in record.workflow.order():
        if task.id not in done:
            builder.add(task, [dep for dep in task.dependencies() if dep not in done])
    return builder.manifest()


class _Builder:
    """The templates and DAG tasks of a workflow, added task by task in topological order."""

    def __init__(
        self,
        record: RunRecord,
        types: Mapping[str, TaskType],
        config: ClusterConfig,
        default_image: str | None,
        first_attempts: Mapping[tuple[str, str], int],
        retry_memory: Set[tuple[str, str]],
    ) -> None:
        self.record = record
        self.types = types
        self.config = config
        self.default_image = default_image
        self.first_attempts: dict[str, dict[str, int]] = {}
        """The first attempt of each worker of a task, where it is not 0."""
        for (task_id, worker), attempt in sorted(first_attempts.items()):
            if attempt:
                self.first_attempts.setdefault(task_id, {})[worker] = attempt
        self.retry_memory = retry_memory
        self.added: dict[str, dict[str, int]] = {}
        """The first attempts of the tasks added, for the Workflow's annotation."""
        self.templates: list[dict[str, Any]] = []
        self.dag: list[dict[str, Any]] = []
        self.nodes: dict[str, str] = {}
        """Every DAG node's name, with the task it is of."""
        self.store = PurePosixPath(config.store_mount)
        self.grace_period_s = math.ceil(config.grace_s) + GRACE_MARGIN_S

    # -- the parts of a task --------------------------------------------------------------------

    def add(self, task: TaskSpec, dependencies_left: list[str]) -> None:
        """The templates and DAG nodes of one task, waiting for the tasks it depends on that
        are in the Workflow (`dependencies_left`)."""
        task_type = self.types.get(task.type)
        if task_type is None:
            raise WorkflowError(Problem(f"unknown task type {task.type!r}", task.id, field="type"))
        plan = self.record.plans.get(task.id)
        if plan is None:
            raise WorkflowError(Problem("the run has no plan of it", task.id))
        dependencies = [self._final_node(dep) for dep in dependencies_left]
        if task.id in self.first_attempts:
            self.added[task.id] = self.first_attempts[task.id]
        if plan.units is None:
            self._unsplit(task, task_type, plan, dependencies)
        else:
            self._split(task, task_type, plan, dependencies)

    def _unsplit(
        self, task: TaskSpec, task_type: TaskType, plan: TaskPlan, dependencies: list[str]
    ) -> None:
        """One pod running `simrun-exec` or the argv of a `command` task."""
        launch = self._launch(task, task_type, task.id, plan.shape)
        env = self._env(task, task_type, task.id, plan.shape)
        name = f"run-{task.id}"
        self.templates.append(
            pod_template(
                name=name,
                task=task.id,
                image=self._image(task, task_type),
                command=self._command(task, task_type, launch),
                env=pod_environment(env),
                mounts=mounts(self.record.id, f"{self.record.id}/{task.id}", self.config),
                shape=plan.shape,
                priority=plan.base_priority,
                patch=self._patch(task, task_type, task.id, plan.shape),
                config=self.config,
            )
        )
        self._node(task, {"name": task.id, "template": name}, dependencies)

    def _split(
        self, task: TaskSpec, task_type: TaskType, plan: TaskPlan, dependencies: list[str]
    ) -> None:
        """The worker template, its coordinator and extra workers, and a merge if the plan has
        one of its own."""
        coordinator = self._env(task, task_type, contract.COORDINATOR, plan.shape)
        extra = self._env(task, task_type, _SAMPLE_EXTRA, plan.shape)
        varying = {
            key: _parameter_name(key) for key in coordinator if coordinator[key] != extra[key]
        }
        if extra[contract.WORKER] != _SAMPLE_EXTRA or contract.WORKER not in varying:
            raise RuntimeError("the launch contract changed: SIMRUN_WORKER names no worker")
        name = f"worker-{task.id}"
        inputs = [*varying.values(), PRIORITY_PARAMETER]
        launch = self._launch(task, task_type, contract.COORDINATOR, plan.shape)
        self.templates.append(
            pod_template(
                name=name,
                task=task.id,
                image=self._image(task, task_type),
                command=self._command(task, task_type, launch),
                env=pod_environment(coordinator, varying),
                mounts=mounts(
                    self.record.id,
                    f"{self.record.id}/{task.id}/{parameter(varying[contract.WORKER])}",
                    self.config,
                ),
                shape=plan.shape,
                priority=parameter(PRIORITY_PARAMETER),
                patch=self._patch(
                    task, task_type, contract.COORDINATOR, plan.shape, worker_parameter=True
                ),
                config=self.config,
                inputs=inputs,
            )
        )
        extra_values = {**extra, contract.WORKER: "w{{item}}"}
        self._node(
            task,
            {
                "name": f"{task.id}-{contract.COORDINATOR}",
                "template": name,
                "arguments": _arguments(varying, coordinator, plan.base_priority),
            },
            dependencies,
        )
        if plan.pods > 1:
            self._node(
                task,
                {
                    "name": f"{task.id}-extra",
                    "template": name,
                    "arguments": _arguments(varying, extra_values, plan.extra_priority),
                    "withSequence": {"start": "1", "count": str(plan.pods - 1)},
                    "continueOn": {"failed": True, "error": True},
                },
                dependencies,
            )
        if not plan.coordinator_merges:
            self._merge(task, task_type, plan)

    def _merge(self, task: TaskSpec, task_type: TaskType, plan: TaskPlan) -> None:
        """The node `<task>-merge` of a plan whose coordinator does not merge: `simrun-merge`
        on one core and the memory of one worker process besides the base (spec 31)."""
        merge_shape = self._merge_shape(task, task_type, plan.shape)
        env = self._env(task, task_type, MERGE_WORKER, merge_shape)
        name = f"merge-{task.id}"
        self.templates.append(
            pod_template(
                name=name,
                task=task.id,
                image=self._image(task, task_type),
                command=["simrun-merge"],
                env=pod_environment(env),
                mounts=mounts(
                    self.record.id, f"{self.record.id}/{task.id}/{MERGE_WORKER}", self.config
                ),
                shape=merge_shape,
                priority=plan.base_priority,
                patch=self._patch(task, task_type, MERGE_WORKER, merge_shape),
                config=self.config,
            )
        )
        self._node(
            task,
            {"name": f"{task.id}-merge", "template": name},
            [f"{task.id}-{contract.COORDINATOR}"],
        )

    # -- the values of a pod --------------------------------------------------------------------

    def _launch(
        self,
        task: TaskSpec,
        task_type: TaskType,
        worker: str,
        pod: PodShape,
        retry_memory: bool = False,
    ) -> contract.Launch:
        """The launch of a worker's first attempt, as the pod sees the store and its scratch."""
        return contract.launch_for(
            self.record,
            task.id,
            worker,
            0,
            task_type=task_type,
            store=self.store,
            scratch=self.config.scratch_path,
            node=_PLACEHOLDER_NODE,
            cores=pod.cores,
            grace_s=self.config.grace_s,
            memory_source="cgroup",
            memory_enforced=True,
            retry_memory=retry_memory,
            editable=self._editable(task, task_type),
        )

    def _editable(self, task: TaskSpec, task_type: TaskType) -> tuple[str, ...]:
        """The snapshots a pod installs at its start (`SIMRUN_EDITABLE`): those of the run's
        sources as the pod mounts them, in the order of the sources, for a pod in the image of
        the run's environment, which has their dependencies and build backends; none for a
        pod in another image (a `command`'s, a type's own, the default one)."""
        if self.record.image is None or task_type.name == COMMAND_TYPE or task_type.image:
            return ()
        return contract.editable_snapshots(self.record, self.store)

    def _env(
        self, task: TaskSpec, task_type: TaskType, worker: str, pod: PodShape
    ) -> dict[str, str]:
        """The variables of a worker's pod: its launch's, the first attempts of the task's
        workers (after `SIMRUN_ATTEMPT`, where they do not start at 0), and `PYTHONPATH` the
        model's root."""
        launch_env = self._launch(task, task_type, worker, pod).to_env()
        first = contract.first_attempts_text(self.first_attempts.get(task.id, {}))
        env: dict[str, str] = {}
        for key, value in launch_env.items():
            env[key] = value
            if key == contract.ATTEMPT and first:
                env[contract.FIRST_ATTEMPTS] = first
        root = self._import_root()
        if root is not None:
            env["PYTHONPATH"] = root
        return env

    def _import_root(self) -> str | None:
        """The root of the model, which a task imports from first (spec 31's `import_root`):
        the snapshot of the run's first source as the pod mounts it, else its working tree."""
        if not self.record.sources:
            return None
        model = self.record.sources[0]
        if model.snapshot:  # relative to the store: snapshots/<name>/<hash>
            return str(self.store / model.snapshot)
        return model.path or None

    def _patch(
        self,
        task: TaskSpec,
        task_type: TaskType,
        worker: str,
        pod: PodShape,
        *,
        worker_parameter: bool = False,
    ) -> str:
        """The `podSpecPatch`: after an exit 137 the retry memory of the pod and the variables
        of the launch with the retry memory; the grace period. A worker killed for memory
        before this Workflow has the retry memory in every attempt: in a template of one
        worker its retry values are its only ones, in one of many (`worker_parameter`, the
        worker an input parameter) the condition names it."""
        first = self._launch(task, task_type, worker, pod).to_env()
        retry = self._launch(task, task_type, worker, pod, retry_memory=True).to_env()
        changed = {key: (first[key], retry[key]) for key in first if first[key] != retry[key]}
        memory = (gib(pod.memory_gb), gib(pod.retry_memory_gb))
        condition = retry_condition()
        if worker_parameter:
            workers = [w for t, w in self.retry_memory if t == task.id]
            variable = f"inputs.parameters.{_parameter_name(contract.WORKER)}"
            condition = retry_condition(variable, workers)
        elif (task.id, worker) in self.retry_memory:
            changed = {key: (values[1], values[1]) for key, values in changed.items()}
            memory = (memory[1], memory[1])
        return pod_spec_patch(MAIN, memory, changed, self.grace_period_s, condition)

    def _image(self, task: TaskSpec, task_type: TaskType) -> str:
        """The image of a task's pods: a `command`'s own, else its type's, the run's, the
        default one."""
        if task_type.name == COMMAND_TYPE:
            image = getattr(task_type.decode_settings(task.settings), "image", None)
            if isinstance(image, str) and image:
                return image
            raise WorkflowError(Problem("no image", task.id, field="settings.image"))
        image = task_type.image or self.record.image or self.default_image
        if image is None:
            message = f"no image: its type {task_type.name!r} has none and the run has none"
            raise WorkflowError(Problem(message, task.id))
        return image

    def _command(self, task: TaskSpec, task_type: TaskType, launch: contract.Launch) -> list[str]:
        """The argv of a task's pods: its harness entry, or a `command` task's args with its
        settings file, its output and its inputs as the pod sees them (spec 31)."""
        return pod_command(task, task_type, launch, self.store)

    def _merge_shape(self, task: TaskSpec, task_type: TaskType, pod: PodShape) -> PodShape:
        """One process on one core, sized by the planner as the worker pods are."""
        resolved = self.record.resources.get(task.id)
        base = resolved.memory_base_gb if resolved else task_type.hint.memory_base_gb
        one = ResolvedResources(memory_base_gb=base, memory_per_worker_gb=pod.per_worker_gb)
        return shape(one, [Node(name=MERGE_WORKER, cores=1, memory_gb=float(pod.memory_gb))], 1)

    # -- the DAG ----------------------------------------------------------------------------------

    def _final_node(self, task_id: str) -> str:
        """The DAG node a reader of a task waits for: its pod, else its merge (spec 32)."""
        plan = self.record.plans.get(task_id)
        if plan is None or plan.units is None:
            return task_id
        if plan.coordinator_merges:
            return f"{task_id}-{contract.COORDINATOR}"
        return f"{task_id}-merge"

    def _node(self, task: TaskSpec, node: dict[str, Any], dependencies: list[str]) -> None:
        name = node["name"]
        other = self.nodes.get(name)
        if other is not None:
            message = f"its DAG node {name!r} is also one of task {other!r}: rename a task"
            raise WorkflowError(Problem(message, task.id, field="id"))
        self.nodes[name] = task.id
        if dependencies:
            ordered: dict[str, Any] = {"name": name, "template": node["template"]}
            ordered["dependencies"] = dependencies
            ordered.update(node)  # the keys there keep their place
            node = ordered
        self.dag.append(node)

    def manifest(self) -> dict[str, Any]:
        """The whole Workflow."""
        record, config = self.record, self.config
        run_labels = {labels.RUN: record.id}
        annotations: dict[str, str] = {}
        if record.group is not None:
            run_labels[labels.GROUP] = labels.label_value(record.group)
            annotations[labels.GROUP] = record.group
        metadata: dict[str, Any] = {
            "name": workflow_name(record.id),
            "namespace": config.namespace,
            "labels": dict(run_labels),
        }
        pod_metadata: dict[str, Any] = {"labels": dict(run_labels)}
        if annotations:
            pod_metadata["annotations"] = dict(annotations)
        if self.added:
            annotations[labels.FIRST_ATTEMPTS] = json.dumps(
                self.added, sort_keys=True, separators=(",", ":")
            )
        if annotations:
            metadata["annotations"] = dict(annotations)
        spec: dict[str, Any] = {
            "entrypoint": ENTRYPOINT,
            "serviceAccountName": config.service_account,
            "podMetadata": pod_metadata,
            "ttlStrategy": {"secondsAfterCompletion": config.ttl_after_finished_s},
            "volumes": volumes(config),
        }
        if record.reserve is not None:
            # the node's label names the run; no effect: tolerated whatever the taint's effect
            spec["nodeSelector"] = {labels.RESERVED: record.id}
            spec["tolerations"] = [
                {"key": labels.RESERVED, "operator": "Equal", "value": record.id}
            ]
        spec["templates"] = [{"name": ENTRYPOINT, "dag": {"tasks": self.dag}}, *self.templates]
        return {"apiVersion": API_VERSION, "kind": "Workflow", "metadata": metadata, "spec": spec}


def _parameter_name(variable: str) -> str:
    """The input parameter of a variable of the launch: `SIMRUN_WORKER` is `worker`."""
    return variable.removeprefix("SIMRUN_").lower()


def _arguments(varying: Mapping[str, str], env: Mapping[str, str], priority: str) -> dict[str, Any]:
    """The arguments of a DAG node of the worker template: its values of the varying variables
    and its priority class."""
    values = [{"name": name, "value": env[key]} for key, name in varying.items()]
    values.append({"name": PRIORITY_PARAMETER, "value": priority})
    return {"parameters": values}
