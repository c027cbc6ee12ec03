"""The Argo backend: the runs as Argo Workflows on a cluster with Kueue (spec 38), on
kubernetes-asyncio.

A run is the Workflow of `simrun_core.argo.workflow_manifest` under its deterministic name in
the configured namespace; a Workflow of that name that exists already is the run submitted
(again after a restart: the pods live in the cluster, nothing is started twice). ONE watch of
the Workflows labelled `simrun/run` (`argo_watch.WorkflowWatch`) follows every run: each
Workflow it sees is read into attempts (`simrun_core.argo.status.attempts`) and the changes
against the run's attempts before (`changes`) go to that run's callback in order, each
attempt's phases only forward (an attempt's end is final; a phase seen again, after a relist or
an older copy, is not reported again), the phases a Workflow skipped between two events filled
in (an attempt seen running was pending and admitted first; one that exited ran). A pending
attempt is `admitted` once its pod (Argo labels it `workflows.argoproj.io/workflow=<name>` and
annotates it `workflows.argoproj.io/node-id=<node id>`) has no scheduling gates left: Kueue
removed them. The memory per process a pod got (`SIMRUN_MEMORY_PER_WORKER_GB` of its `main`)
says whether the attempt ran with the retry memory (`on_retry_memory`).

A Workflow is created (`submit`, when none of the name exists) once the pods left of an earlier
one of the name are gone; the API refusing it for good (400, 404, 422) is a WorkflowError naming
what the API said (the run fails with it), AlreadyExists is the run submitted. Where the run ran
before, the new one leaves out the tasks the submission says are done and starts every worker at
the attempt the decider named, never one the record had (Argo counts from 0: the Workflow's
annotation and the pods' `SIMRUN_FIRST_ATTEMPTS` carry the first attempts,
`simrun_core.argo.workflow`).

A Workflow gone under a live run (deleted by hand, or by its time to live, also while the
service was down: a submission finds none while the record has attempts live) is a fact the
backend reports, `WorkflowGone`; what follows is the decider's (the live attempts end preempted
and the run is submitted again, `simrun_core.decider`). The backend keeps no memory of what the
decider asked.

Argo retries the pods (`retryStrategy`), so `retry` starts nothing. `cancel` stops the workflow
(`shutdown: Stop`: Argo ends its running pods and fails its nodes), deletes the pods Kueue still
gates (no executor runs in them to stop), waits until the pods are gone and reports the ends:
an attempt of a stopped workflow without an exit code is reported failed, not preempted.
`close` stops the watch and leaves the runs running in the cluster.

Nodes are those labelled `simrun/worker=true` (`argo_nodes.node_from`); reservations are the
taint and label `simrun/reserved=<run>`, written guarded by the node's resourceVersion.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

import aiohttp
import msgspec
from kubernetes_asyncio import client
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client.exceptions import ApiException

from simrun_api.backends.argo_nodes import (
    EXECUTOR,
    WORKFLOW_LABEL,
    Amounts,
    PodFacts,
    UnknownNode,
    container_requests,
    is_pod_of_run,
    main_container,
    node_from,
    pod_ended,
    pod_facts,
    pod_labels,
    pod_name,
    pod_node,
    releasing,
    reserving,
    used_by_others,
)
from simrun_api.backends.argo_watch import WATCH_TIMEOUT_S, WorkflowWatch
from simrun_api.backends.base import Capabilities, RunSubmission, workflow_name
from simrun_api.backends.kube_calls import ignore_missing, read_body, read_json
from simrun_api.backends.kubeconfig import kubeconfig_problem
from simrun_api.settings import ServiceSettings
from simrun_core.argo import labels
from simrun_core.argo.retry import GRACE_MARGIN_S
from simrun_core.argo.status import AttemptStatus, Resolver, attempts, changes, resolver
from simrun_core.argo.workflow import MERGE_WORKER, workflow_manifest
from simrun_core.cluster import ClusterConfig
from simrun_core.errors import WorkflowError
from simrun_core.messages import BackendReport, Phase, PodChanged, WorkflowGone
from simrun_core.planner import MAX_PIECES, Node
from simrun_core.wire import PodUsage, ServerUsage

log = logging.getLogger(__name__)

ARGO_GROUP: Final = "argoproj.io"
ARGO_VERSION: Final = "v1alpha1"
WORKFLOWS: Final = "workflows"
MERGE_PATCH: Final = "application/merge-patch+json"
"""kubernetes-asyncio sends a dict body of a custom object's patch as a JSON patch unless told."""
STOP: Final = "Stop"
FINISHED: Final = frozenset({"Succeeded", "Failed", "Error"})
"""The phases of a Workflow that ended."""
RANK: Final[dict[str, int]] = {
    "pending": 0,
    "admitted": 1,
    "running": 2,
    "preempted": 3,
    "succeeded": 3,
    "failed": 3,
}
"""The order of the phases of an attempt; the last three end it."""
ENDED_RANK: Final = 3
REQUEST_TIMEOUT_S: Final = 30.0
LOG_LIMIT_BYTES: Final = 8 * 1024**2
"""The most of a pod's log `logs` reads (the first of its last `tail_lines` lines)."""
CANCEL_POLL_S: Final = 0.2
SETTLE_S: Final = 5.0
"""How long `cancel` waits for the Workflow to show the ends of the pods that are gone."""
NODE_WRITE_TRIES: Final = 5
DELETED: Final = "its workflow was deleted"
STOPPED: Final = "stopped: its pod is gone"
REFUSED: Final = frozenset({400, 404, 422})
"""The statuses of a create of a Workflow that are a refusal for good: BadRequest, NotFound (no
namespace, no Workflow kind), Invalid."""

Key = tuple[str, str, int]
Report = Callable[[BackendReport], None]


@dataclasses.dataclass(eq=False)
class _Run:
    """A run this backend follows: what was reported to it (`known`, the last phase of each
    attempt; `last`, the latest attempt of each worker) and its Workflow's attempts."""

    submission: RunSubmission
    report: Report
    name: str
    known: dict[Key, Phase]
    last: dict[tuple[str, str], int]
    attempts: dict[Key, AttemptStatus] = dataclasses.field(default_factory=dict)
    pods: dict[str, PodFacts] = dataclasses.field(default_factory=dict)
    """The pod of each node id, as last read."""
    seen: bool = False
    ended: bool = False
    cancelled: bool = False
    stopped: bool = False
    uid: str | None = None
    """The uid of the Workflow followed: another one is a Workflow of the run created again."""
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    updated: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    _resolver: Resolver | None = None
    _resolved_for: object = None

    @property
    def id(self) -> str:
        """The run's id."""
        return self.submission.record.id

    def resolve(self, name: str, item: str | None) -> tuple[str, str] | None:
        """The (task, worker) of a DAG node of the run's Workflow."""
        record = self.submission.record
        if self._resolver is None or self._resolved_for is not record:
            split = [task for task, plan in record.plans.items() if plan.units is not None]
            self._resolver, self._resolved_for = resolver(record.plans, split), record
        return self._resolver(name, item)

    def admitted(self, node_id: str) -> bool:
        """Whether the pod of a node was read without scheduling gates."""
        facts = self.pods.get(node_id)
        return facts is not None and not facts.gated

    def live(self) -> list[Key]:
        """The attempts reported to the run that have not ended (of tasks not done)."""
        return [
            key
            for key, phase in sorted(self.known.items())
            if RANK[phase] < ENDED_RANK and key[0] not in self.submission.done
        ]

    def changed(self) -> None:
        """Wake those waiting for the next change of the run."""
        event, self.updated = self.updated, asyncio.Event()
        event.set()


def known_from(submission: RunSubmission) -> tuple[dict[Key, Phase], dict[tuple[str, str], int]]:
    """What a run's record knows of its pods: the phase of each worker's last attempt (its
    earlier ones ended), so a run taken over after a restart is not told them again."""
    known: dict[Key, Phase] = {}
    last: dict[tuple[str, str], int] = {}
    for task, pods in submission.record.pods.items():
        for worker, pod in pods.items():
            last[(task, worker)] = pod.attempt
            if pod.state in RANK:
                known[(task, worker, pod.attempt)] = cast(Phase, pod.state)
    return known, last


class ArgoBackend:
    """Runs the runs as Argo Workflows of the namespace of `config` (see the module).

    `configuration` is the client's (tests); without it the service account of the pod is
    used in a cluster, else the kubeconfig of `KUBECONFIG` (or `~/.kube/config`). `executor`
    is what one container of Argo's executor requests (the controller config's
    `executor.resources`); `poll_s` the period of the list that stands in for a failing watch.
    """

    name = "argo"
    max_pods = MAX_PIECES
    capabilities = Capabilities(
        reservations=True,
        images=True,
        retries_pods=True,
        runs_dag=True,
        admits_pods=True,
        merge_marker_grace_s=120.0,
        pods_outlive_service=True,
        pod_logs_in_store=False,
    )

    def __init__(
        self,
        config: ClusterConfig | None = None,
        *,
        configuration: client.Configuration | None = None,
        default_image: str | None = None,
        poll_s: float = 5.0,
        executor: Amounts = EXECUTOR,
        cancel_timeout_s: float | None = None,
        settle_s: float = SETTLE_S,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self.config = config or ClusterConfig()
        self.capabilities = dataclasses.replace(
            ArgoBackend.capabilities, image_builds=self, pod_start_s=self.config.pod_start_s
        )
        self.namespace = self.config.namespace
        self.default_image = default_image
        self.poll_s = poll_s
        self.executor = executor
        self.cancel_timeout_s = (
            cancel_timeout_s
            if cancel_timeout_s is not None
            else self.config.grace_s + GRACE_MARGIN_S + 30.0
        )
        self.settle_s = settle_s
        self.watch_timeout_s = watch_timeout_s
        self._configuration = configuration
        self._api: client.ApiClient | None = None
        self._api_lock = asyncio.Lock()
        self._watch: WorkflowWatch | None = None
        self._runs: dict[str, _Run] = {}
        self._by_name: dict[str, _Run] = {}
        self._workflows: dict[str, dict[str, Any]] = {}
        """The latest Workflow of each name no run claimed yet (a run a restart left)."""
        self._closed = False

    # -- the client ---------------------------------------------------------------------------

    async def api(self) -> client.ApiClient:
        """The API client, made at the first call (the configuration loaded then)."""
        async with self._api_lock:
            if self._api is None:
                configuration = self._configuration
                if configuration is None:
                    configuration = client.Configuration()
                    if os.environ.get("KUBERNETES_SERVICE_HOST"):
                        kube_config.load_incluster_config(client_configuration=configuration)
                    else:
                        # read now: the client's default path was read at its import
                        await kube_config.load_kube_config(
                            config_file=os.environ.get("KUBECONFIG"),
                            client_configuration=configuration,
                        )
                self._api = client.ApiClient(configuration)
            return self._api

    async def _objects(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(await self.api())

    async def _core(self) -> client.CoreV1Api:
        return client.CoreV1Api(await self.api())

    @property
    def watch(self) -> WorkflowWatch | None:
        """The watch of the Workflows, once started."""
        return self._watch

    async def _start_watch(self) -> WorkflowWatch:
        """The watch, started at the first call (recover or the first submit)."""
        objects = await self._objects()
        if self._watch is None:
            listing = functools.partial(
                objects.list_namespaced_custom_object,
                ARGO_GROUP,
                ARGO_VERSION,
                self.namespace,
                WORKFLOWS,
                label_selector=labels.RUN,
            )
            self._watch = WorkflowWatch(
                listing,
                self._on_event,
                self._on_list,
                poll_s=self.poll_s,
                timeout_s=self.watch_timeout_s,
            )
        self._watch.start()
        return self._watch

    # -- the protocol ---------------------------------------------------------------------------

    async def recover(self) -> int:
        """Start the watch; nothing to clean up (the pods live in the cluster)."""
        await self._start_watch()
        return 0

    async def submit(self, run: RunSubmission, report: Report) -> str:
        """Follow the run's Workflow: one that exists is the run submitted (before a restart);
        else, where the record has attempts live, their Workflow went while the service was
        away: that is reported (`WorkflowGone`, the decider submits the run again) and nothing
        is created; else it is created (`_create`) for the tasks not done, each worker starting
        at the attempt the decider named (`first_attempts_of`), those killed for memory with
        the retry memory. A run followed already keeps what it was told; its callback and
        submission change.

        WorkflowError when the Workflow cannot be built, or the API refuses it for good (400,
        404, 422: `refusal` names what it said); anything else (5xx, a connection) as raised.
        """
        if self._closed:
            raise RuntimeError("the argo backend is closed")
        record = run.record
        name = workflow_name(record.id)
        manifest = workflow_manifest(
            record,
            run.types,
            self.config,
            default_image=self.default_image,
            done=run.done,
            first_attempts=first_attempts_of(run),
            retry_memory=run.retry_memory,
        )
        await self._start_watch()
        workflow = self._workflows.pop(name, None) or await self._read_workflow(name)
        if workflow is None and not nothing_to_run(run) and live_in_record(run):
            state = self._take(run, report, name)
            await self._gone(state)
            return name
        if workflow is None and not nothing_to_run(run):
            workflow = await self._create(name, manifest)
        state = self._take(run, report, name)
        cached = self._workflows.pop(name, None)
        if cached is not None:
            workflow = cached
        elif workflow is None:
            workflow = await self._read_workflow(name)
        if workflow is not None:
            await self._follow(state, workflow)
        elif nothing_to_run(run):
            state.ended = True
        return name

    async def _create(self, name: str, manifest: dict[str, Any]) -> dict[str, Any] | None:
        """Create a Workflow once no pod of an earlier one of its name is left
        (`_await_old_pods_gone`); None when one exists already (409 AlreadyExists: the run
        submitted). WorkflowError when the API refuses it for good (`REFUSED`)."""
        await self._await_old_pods_gone(name)
        objects = await self._objects()
        try:
            created: dict[str, Any] = await objects.create_namespaced_custom_object(
                ARGO_GROUP,
                ARGO_VERSION,
                self.namespace,
                WORKFLOWS,
                manifest,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except ApiException as error:
            if error.status == 409:
                return None
            if error.status in REFUSED:
                raise refusal(error, name) from None
            raise
        return created

    async def _await_old_pods_gone(self, name: str) -> None:
        """Before a Workflow is created under a name: delete the pods left of an earlier one
        (their garbage collection may lag; an orphan stays) and wait until they are gone. Argo
        names the pod of a node's attempt alike in every Workflow of a name, and would take
        one that is still there for the one it creates. TimeoutError after
        `cancel_timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cancel_timeout_s
        core = await self._core()
        deleted: set[str] = set()
        while pods := await self._workflow_pods(name):
            for pod in pods:
                metadata = pod.get("metadata") or {}
                uid = str(metadata.get("uid") or metadata.get("name"))
                if uid in deleted or metadata.get("deletionTimestamp"):
                    continue
                deleted.add(uid)
                await self._delete_pod(core, metadata["name"])
            if loop.time() > deadline:
                names = ", ".join(sorted(str(p["metadata"]["name"]) for p in pods))
                raise TimeoutError(
                    f"workflow {name}: pods {names} of an earlier one still there "
                    f"{self.cancel_timeout_s:g} s after they were deleted"
                )
            await asyncio.sleep(CANCEL_POLL_S)

    def _take(self, run: RunSubmission, report: Report, name: str) -> _Run:
        """The state of a submitted run: new, or the one followed already with its callback
        and submission replaced and the record's knowledge added."""
        known, last = known_from(run)
        state = self._runs.get(run.record.id)
        if state is None:
            state = _Run(submission=run, report=report, name=name, known=known, last=last)
            self._runs[run.record.id] = state
            self._by_name[name] = state
            return state
        state.submission, state.report = run, report
        for key, phase in known.items():
            if RANK[phase] > RANK.get(state.known.get(key, ""), -1):
                state.known[key] = phase
        for worker, attempt in last.items():
            state.last[worker] = max(attempt, state.last.get(worker, attempt))
        return state

    async def start_task(self, run_id: str, task: str) -> None:
        """Nothing to start: the Workflow's DAG starts a task once the tasks it reads from
        succeeded, the decider's rule written into the manifest (`runs_dag`)."""

    async def retry(
        self, run_id: str, task: str, worker: str, attempt: int, retry_memory: bool
    ) -> None:
        """Nothing to start: Argo retries the pods (`retryStrategy`, `podSpecPatch`), by the
        decider's rule written into the manifest."""

    async def cancel(self, run_id: str) -> None:
        """Stop the run's Workflow (`shutdown: Stop`), delete its pods Kueue still gates, and
        return once its pods are gone and their ends were reported.

        TimeoutError when pods are left after `cancel_timeout_s` (a later cancel goes on).
        """
        name = workflow_name(run_id)
        run = self._runs.get(run_id)
        if run is not None:
            run.cancelled = True
        objects = await self._objects()
        try:
            workflow = await objects.patch_namespaced_custom_object(
                ARGO_GROUP,
                ARGO_VERSION,
                self.namespace,
                WORKFLOWS,
                name,
                {"spec": {"shutdown": STOP}},
                _content_type=MERGE_PATCH,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except ApiException as error:
            if error.status != 404:
                raise
            if run is not None:
                await self._gone(run)
            return
        if run is not None:
            run.stopped = True
            await self._follow(run, workflow)
        await self._await_pods_gone(run_id, name)
        if run is not None:
            await self._settle(run)

    async def _await_pods_gone(self, run_id: str, name: str) -> None:
        """Delete the gated pods of a stopped Workflow; wait until none of its pods runs."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cancel_timeout_s
        core = await self._core()
        deleted: set[str] = set()
        while True:
            live = [pod for pod in await self._workflow_pods(name) if not pod_ended(pod)]
            if not live:
                return
            for pod in live:
                metadata = pod.get("metadata") or {}
                uid = str(metadata.get("uid") or metadata.get("name"))
                gated = bool((pod.get("spec") or {}).get("schedulingGates"))
                if gated and uid not in deleted:
                    deleted.add(uid)
                    await self._delete_pod(core, metadata["name"])
            if loop.time() > deadline:
                names = ", ".join(sorted(str(p["metadata"]["name"]) for p in live))
                raise TimeoutError(
                    f"run {run_id}: pods {names} still there {self.cancel_timeout_s:g} s "
                    "after its workflow was stopped"
                )
            await asyncio.sleep(CANCEL_POLL_S)

    async def _delete_pod(self, core: client.CoreV1Api, name: str) -> None:
        """Delete a pod of the namespace (one that is gone already is no error)."""
        await ignore_missing(
            core.delete_namespaced_pod(
                name,
                self.namespace,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        )

    async def _settle(self, run: _Run) -> None:
        """After a cancel: wait (up to `settle_s`) for the Workflow to show the ends of the
        attempts the run was told of, read it once more, and report the attempts still live as
        failed: their pods are gone."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settle_s
        while run.live() and (left := deadline - loop.time()) > 0:
            updated = run.updated
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(updated.wait(), left)
        if run.live():
            workflow = await self._read_workflow(run.name)
            if workflow is None:
                await self._gone(run)
                return
            await self._follow(run, workflow)
        async with run.lock:
            for task, worker, attempt in run.live():
                gone = PodChanged(
                    task=task, worker=worker, attempt=attempt, phase="failed", message=STOPPED
                )
                self._tell(run, gone, None)

    def has(self, run_id: str) -> bool:
        """Whether the run is followed and its Workflow neither ended, gone nor cancelled."""
        run = self._runs.get(run_id)
        return run is not None and not (run.ended or run.cancelled)

    async def logs(
        self,
        run_id: str,
        task: str,
        *,
        tail_lines: int | None = None,
        limit_bytes: int = LOG_LIMIT_BYTES,
    ) -> dict[str, str]:
        """The logs of the main containers of a task's pods that still exist, by pod name
        (`<worker>-<attempt>`), each worker's attempts in order; a pod whose container has
        not started has an empty log. At most `limit_bytes` of the last `tail_lines` lines."""
        core = await self._core()
        selector = f"{labels.RUN}={run_id},{labels.TASK}={task}"
        listing = await read_json(
            core.list_namespaced_pod(
                self.namespace,
                label_selector=selector,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        )
        newest: dict[str, PodFacts] = {}
        for pod in listing.get("items") or []:
            facts = pod_facts(pod)
            name = pod_name(facts)
            if name not in newest or facts.created >= newest[name].created:
                newest[name] = facts
        found: dict[str, str] = {}
        for name, facts in sorted(newest.items(), key=lambda item: _pod_order(item[1])):
            text = await self._pod_log(core, facts.name, tail_lines, limit_bytes)
            if text is not None:
                found[name] = text
        return found

    async def _pod_log(
        self, core: client.CoreV1Api, pod: str, tail_lines: int | None, limit_bytes: int
    ) -> str | None:
        """The log of a pod's main container; "" before it started, None for a pod gone."""
        options: dict[str, Any] = {"container": "main", "limit_bytes": limit_bytes}
        if tail_lines is not None:
            options["tail_lines"] = tail_lines
        try:
            response = await core.read_namespaced_pod_log(
                pod,
                self.namespace,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
                **options,
            )
            data = await read_body(response)
        except ApiException as error:
            if error.status == 404:
                return None
            if error.status == 400:
                return ""  # its container is waiting to start
            raise
        return data.decode(errors="replace")

    async def nodes(self) -> list[Node]:
        """The worker nodes pods of runs can go to, with their capacity (spec 38)."""
        return [node for node, _ in await self._worker_nodes()]

    async def servers(self) -> list[ServerUsage]:
        """The worker nodes with the pods of runs on them that have not terminated."""
        found = []
        for node, pods in await self._worker_nodes():
            usages = []
            for pod in pods:
                if not is_pod_of_run(pod):
                    continue
                pod_labels_ = pod_labels(pod)
                requested = container_requests(main_container(pod) or {})
                usages.append(
                    PodUsage(
                        run_id=pod_labels_.get(labels.RUN),
                        task_id=pod_labels_.get(labels.TASK, ""),
                        pod=pod_name(pod_facts(pod)),
                        phase=str((pod.get("status") or {}).get("phase") or "Pending").lower(),
                        cores=requested.cores,
                        memory_gb=requested.memory_gb,
                        gpus=round(requested.gpus),
                    )
                )
            found.append(
                ServerUsage(
                    name=node.name,
                    cores=node.cores,
                    memory_gb=node.memory_gb,
                    gpus=node.gpus,
                    reserved_by=node.reserved_by,
                    pods=usages,
                )
            )
        return found

    async def _worker_nodes(self) -> list[tuple[Node, list[dict[str, Any]]]]:
        """The planner's worker nodes, each with the pods bound to it that did not end."""
        core = await self._core()
        nodes = await read_json(
            core.list_node(
                label_selector=f"{labels.WORKER_NODE}=true",
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        )
        pods = await read_json(
            core.list_pod_for_all_namespaces(
                field_selector="status.phase!=Succeeded,status.phase!=Failed",
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        )
        items = [pod for pod in pods.get("items") or [] if not pod_ended(pod)]
        used = used_by_others(items)
        found = []
        for item in nodes.get("items") or []:
            node = node_from(item, used.get(item["metadata"]["name"], Amounts()), self.executor)
            if node is not None:
                on_it = [pod for pod in items if pod_node(pod) == node.name]
                found.append((node, on_it))
        return sorted(found, key=lambda pair: pair[0].name)

    async def close(self) -> None:
        """Stop the watch and close the client; the runs go on in the cluster."""
        self._closed = True
        if self._watch is not None:
            await self._watch.stop()
        if self._api is not None:
            await self._api.close()
            self._api = None

    # -- reservations (spec 38) ---------------------------------------------------------------

    async def reserve(self, node: str, run_id: str) -> None:
        """Taint (`simrun/reserved=<run>:NoExecute`) and label a node for a run.

        `argo_nodes.UnknownNode` (a KeyError) for an unknown node, `argo_nodes.NodeReserved`
        when another run holds it: both ReservationRefused.
        """
        await self._write_node(node, lambda current: reserving(current, run_id))

    async def release(self, node: str, run_id: str) -> None:
        """Remove a run's taint and label from a node; another run's (or none) is left as it
        is, so a late release never removes a later reservation; a node that is gone has
        nothing to release."""
        with contextlib.suppress(UnknownNode):
            await self._write_node(node, lambda current: releasing(current, run_id))

    async def _write_node(
        self, name: str, patch_of: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> None:
        """Read a node, patch it guarded by its resourceVersion; on a 409 read it again."""
        core = await self._core()
        for _ in range(NODE_WRITE_TRIES):
            try:
                node = await read_json(
                    core.read_node(name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)
                )
            except ApiException as error:
                if error.status == 404:
                    raise UnknownNode(name) from None
                raise
            patch = patch_of(node)
            if patch is None:
                return
            try:
                await read_json(
                    core.patch_node(
                        name,
                        patch,
                        _content_type=MERGE_PATCH,
                        _preload_content=False,
                        _request_timeout=REQUEST_TIMEOUT_S,
                    )
                )
                return
            except ApiException as error:
                if error.status == 404:
                    raise UnknownNode(name) from None
                if error.status != 409:
                    raise
                log.info("node %s changed meanwhile: reading it again", name)
        raise RuntimeError(f"node {name!r} kept changing: not written in {NODE_WRITE_TRIES} tries")

    # -- following the Workflows ----------------------------------------------------------------

    async def _on_event(self, kind: str, workflow: dict[str, Any]) -> None:
        """An event of the watch: the run of the Workflow follows it (or it waits for one)."""
        name = str((workflow.get("metadata") or {}).get("name") or "")
        run = self._by_name.get(name)
        if kind == "DELETED":
            self._workflows.pop(name, None)
            if run is not None:
                await self._gone(run)
            return
        if kind not in ("ADDED", "MODIFIED"):
            return
        if run is None:
            self._workflows[name] = workflow
        else:
            await self._follow(run, workflow)

    async def _on_list(self, items: list[dict[str, Any]]) -> None:
        """A full list: every run follows its Workflow; a run whose Workflow was seen and is
        missing now lost it."""
        listed = {str(item["metadata"]["name"]): item for item in items}
        self._workflows = {name: item for name, item in listed.items() if name not in self._by_name}
        for name, run in list(self._by_name.items()):
            try:
                workflow = listed.get(name)
                if workflow is not None:
                    await self._follow(run, workflow)
                elif run.seen:
                    await self._gone(run)
            except Exception:
                log.exception("run %s: its workflow was not followed", run.id)

    async def _read_workflow(self, name: str) -> dict[str, Any] | None:
        """The Workflow of a name, None when there is none."""
        objects = await self._objects()
        try:
            found: dict[str, Any] = await objects.get_namespaced_custom_object(
                ARGO_GROUP,
                ARGO_VERSION,
                self.namespace,
                WORKFLOWS,
                name,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    async def _follow(self, run: _Run, workflow: dict[str, Any]) -> None:
        """Report what changed in a run's Workflow since the run's attempts before."""
        async with run.lock:
            uid = str((workflow.get("metadata") or {}).get("uid") or "") or None
            if uid is not None and run.uid is not None and uid != run.uid:
                # a Workflow of the run created again: its attempts are others
                run.attempts, run.ended, run.stopped = {}, False, False
                run.pods.clear()
            run.uid = uid or run.uid
            run.seen = True
            if (workflow.get("spec") or {}).get("shutdown"):
                run.stopped = True
            found = attempts(workflow, run.resolve, run.admitted)
            if self._needs_pods(run, found):
                await self._read_pods(run)
                found = attempts(workflow, run.resolve, run.admitted)
            for change in changes(run.attempts, found):
                self._tell(run, change, found[(change.task, change.worker, change.attempt)].node_id)
            run.attempts = found
            if (workflow.get("status") or {}).get("phase") in FINISHED:
                run.ended = True
                run.pods.clear()
            run.changed()

    @staticmethod
    def _needs_pods(run: _Run, found: Mapping[Key, AttemptStatus]) -> bool:
        """Whether the pods must be read: an attempt waits for admission, or one changed whose
        pod was never read."""
        for key, now in found.items():
            if now.phase == "pending":
                return True
            if now.node_id in run.pods:
                continue
            before = run.attempts.get(key)
            changed = before is None or before.phase != now.phase
            if changed and RANK.get(run.known.get(key, ""), -1) < ENDED_RANK:
                return True
        return False

    async def _read_pods(self, run: _Run) -> None:
        """Read the pods of a run's Workflow into `run.pods` (the newest pod of a node id);
        a failure leaves them as they were."""
        try:
            pods = await self._workflow_pods(run.name)
        except (ApiException, aiohttp.ClientError, TimeoutError, OSError) as error:
            log.warning("run %s: its pods were not read: %r", run.id, error)
            return
        for pod in pods:
            facts = pod_facts(pod)
            current = run.pods.get(facts.node_id)
            if current is None or facts.created >= current.created:
                run.pods[facts.node_id] = facts

    async def _workflow_pods(self, name: str) -> list[dict[str, Any]]:
        """The pods Argo made of a Workflow."""
        core = await self._core()
        listing = await read_json(
            core.list_namespaced_pod(
                self.namespace,
                label_selector=f"{WORKFLOW_LABEL}={name}",
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        )
        return list(listing.get("items") or [])

    async def _gone(self, run: _Run) -> None:
        """The run's Workflow is gone, and its attempts not ended with it, without an exit
        code. Where the run was being stopped (a cancel, a shutdown) or its Workflow had ended,
        they are reported failed and the run ended. Else the Workflow went under a live run (by
        hand; spec 41's time to live): that fact is reported (`WorkflowGone`), which covers its
        live attempts (the decider ends them and submits the run again)."""
        async with run.lock:
            if run.cancelled or run.stopped or run.ended or self._closed:
                for task, worker, attempt in run.live():
                    change = PodChanged(
                        task=task, worker=worker, attempt=attempt, phase="failed", message=DELETED
                    )
                    self._tell(run, change, None)
                run.ended = True
            else:
                for key in run.live():
                    run.known[key] = "preempted"  # told by the report of the Workflow gone
                try:
                    run.report(WorkflowGone(name=run.name))
                except Exception:
                    log.exception("run %s: the report of its workflow gone failed", run.id)
            run.pods.clear()
            run.seen = False
            run.changed()

    def _tell(self, run: _Run, change: PodChanged, node_id: str | None) -> None:
        """Report a change to the run unless the run knows it: only forward, an attempt's end
        once, no earlier attempt of a worker, no task done; the phases it skipped first."""
        task, worker, attempt = change.task, change.worker, change.attempt
        if task in run.submission.done:
            return
        last = run.last.get((task, worker))
        if last is not None and attempt < last:
            return
        key = (task, worker, attempt)
        known = RANK.get(run.known.get(key, ""), -1)
        if run.stopped and change.phase == "preempted":
            change = msgspec.structs.replace(change, phase="failed")  # stopped, not preempted
        if RANK[change.phase] <= known:
            return
        facts = run.pods.get(node_id) if node_id is not None else None
        change = msgspec.structs.replace(
            change, on_retry_memory=self._on_retry_memory(run, task, facts)
        )
        exited = change.phase == "succeeded" or (
            change.phase == "failed" and change.exit_code is not None
        )
        steps: list[PodChanged] = []
        if known < RANK["pending"] and change.phase != "pending":
            steps.append(_skipped(change, "pending"))
        if known < RANK["admitted"] and (change.phase == "running" or exited):
            steps.append(_skipped(change, "admitted"))
        if known < RANK["running"] and exited:
            steps.append(_skipped(change, "running", change.node))
        steps.append(change)
        run.known[key] = change.phase
        run.last[(task, worker)] = max(attempt, last if last is not None else attempt)
        for step in steps:
            try:
                run.report(step)
            except Exception:
                log.exception("run %s: the report of a pod change failed", run.id)

    @staticmethod
    def _on_retry_memory(run: _Run, task: str, facts: PodFacts | None) -> bool | None:
        """Whether the attempt's pod got the retry memory per process; None when its pod was
        not read, it is a merge's (of its own shape) or the two memories are the same."""
        plan = run.submission.record.plans.get(task)
        if plan is None or facts is None or facts.per_worker_gb is None:
            return None
        if facts.worker == MERGE_WORKER:
            return None
        first, retry = plan.shape.per_worker_gb, plan.shape.retry_per_worker_gb
        if math.isclose(first, retry):
            return None
        return math.isclose(facts.per_worker_gb, retry)

    # -- images (spec 38): `argo_images` --------------------------------------------------------

    @functools.cached_property
    def images(self) -> Any:
        """The image look-ups and builds (`argo_images.ImageBuilds`) on this backend's client,
        made at the first use; its `timeout_s` and `poll_s` may be set (tests)."""
        from simrun_api.backends.argo_images import ImageBuilds

        return ImageBuilds(self.config, self.api)

    async def has_image(self, ref: str) -> bool:
        """Whether the cluster's registry has the image (a HEAD of its manifest). ValueError:
        the image is not in the registry of the cluster; RuntimeError: the registry answered
        neither found nor not found."""
        return bool(await self.images.has_image(ref))

    async def build_image(self, context: os.PathLike[str] | str, ref: str) -> None:
        """Build the image of a flat build context with BuildKit (a Job of `buildctl`, its
        context a ConfigMap owned by it) and push it as `ref`; a build of `ref` in flight is
        waited for. ValueError: the context has a directory or is too large for a ConfigMap;
        RuntimeError: the build failed (with the end of its log); TimeoutError: it took longer
        than `argo_images.BUILD_TIMEOUT_S`."""
        await self.images.build_image(context, ref)


def first_attempts_of(submission: RunSubmission) -> dict[tuple[str, str], int]:
    """The first attempt of each worker in a Workflow of the run created now: the one the
    decider named (`next_attempts`), and never one the record has (after the last attempt of
    the worker it knows). Argo numbers the attempts of every node from 0 again; reusing a
    number would make a pod write the harness log of an attempt the run has (and the decider
    drop its events)."""
    first = dict(submission.next_attempts)
    for key, attempt in known_from(submission)[1].items():
        first[key] = max(first.get(key, 0), attempt + 1)
    return {key: attempt for key, attempt in first.items() if attempt > 0}


def live_in_record(submission: RunSubmission) -> bool:
    """Whether the record of a submitted run has attempts that have not ended (of tasks not
    done): their pods are in its Workflow."""
    return any(
        pod.state in ("pending", "admitted", "running")
        for task, pods in submission.record.pods.items()
        if task not in submission.done
        for pod in pods.values()
    )


def nothing_to_run(submission: RunSubmission) -> bool:
    """Whether every task of the run is done: there is no Workflow to create."""
    return all(task.id in submission.done for task in submission.record.workflow.tasks)


def refusal(error: ApiException, name: str) -> WorkflowError:
    """The refusal of a Workflow by the API, naming what it said: the status and reason, the
    `message` of its Status body, and the causes (`field: message`) the message has not."""
    status: Any = {}
    body = error.body
    text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    with contextlib.suppress(ValueError):
        status = json.loads(text)
    if not isinstance(status, dict):
        status = {}
    reason = str(status.get("reason") or error.reason or "").strip()
    message = str(status.get("message") or "").strip()
    said_all = f"the cluster refused workflow {name} ({error.status} {reason})".replace(" )", ")")
    if message:
        said_all += f": {message}"
    causes = []
    for cause in (status.get("details") or {}).get("causes") or []:
        if not isinstance(cause, dict):
            continue
        said = str(cause.get("message") or cause.get("reason") or "").strip()
        field = str(cause.get("field") or "").strip()
        said = f"{field}: {said}" if field and said else field or said
        if said and said not in message and said not in causes:
            causes.append(said)
    if causes:
        said_all += "; " + "; ".join(causes)
    return WorkflowError(said_all)


def _skipped(change: PodChanged, phase: Phase, node: str | None = None) -> PodChanged:
    """A phase of an attempt that the Workflow skipped before `change`: its facts only."""
    return msgspec.structs.replace(
        change, phase=phase, exit_code=None, node=node, oom=False, message=None
    )


def _pod_order(facts: PodFacts) -> tuple[str, int, str]:
    """Pods by worker, then attempt."""
    return (facts.worker or facts.name, facts.attempt or 0, facts.name)


def argo_backend(settings: ServiceSettings, block: None = None) -> ArgoBackend:
    """The Argo backend of service settings (`backend: argo`): their cluster, default image
    and poll period. It declares no block of its own: its `cluster:` is a setting of the
    service, which the builds of images (`simrun_api.cluster_environments`), the deployment
    (`deploy/generate.py`) and `simrun render` read as well. ValueError, in one line, when
    the kubeconfig it would reach the cluster with cannot be loaded (`kubeconfig_problem`)."""
    problem = kubeconfig_problem(os.environ)
    if problem is not None:
        raise ValueError(f"backend argo: {problem}")
    return ArgoBackend(
        settings.cluster, default_image=settings.default_image, poll_s=settings.poll_s
    )
