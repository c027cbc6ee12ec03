"""An emulated Job controller (batch/v1, as in Kubernetes 1.33) and its TTL-after-finished.

`JobController` turns a Job into pods the fake kubelet runs and writes the Job's status as the
real controller (`pkg/controller/job`) does for the Jobs simrun makes, one pod at a time:

- a Job neither suspended nor finished without a live pod gets one: `generateName`
  `<job>-`, the template's labels and annotations plus `batch.kubernetes.io/controller-uid`,
  `batch.kubernetes.io/job-name` (and the legacy `controller-uid`, `job-name`), a controller
  ownerReference to the Job, the template's spec; `status.startTime` is set at the first pod;
- `status.active` / `ready` / `succeeded` / `failed` count the pods, each terminated pod once
  (a pod deleted before it terminated counts as failed, as with the tracking finalizers);
- a succeeded pod completes the Job: the conditions `SuccessCriteriaMet` and `Complete` (reason
  `CompletionsReached`) and `completionTime`;
- more failed pods than `backoffLimit` (6 when unset) fail it (`BackoffLimitExceeded`), and so
  does `activeDeadlineSeconds` past `startTime` (`DeadlineExceeded`, its live pods deleted):
  first the condition `FailureTarget`, then, once no pod of it runs any more, `Failed`; below
  the limit a failed pod is replaced at once (the real controller backs off 10 s, 20 s, ...);
- `ttlSecondsAfterFinished` deletes a finished Job (with `propagationPolicy: Foreground`, as the
  TTL-after-finished controller does), its pods and the objects it owns with it.

Not emulated: `completions`/`parallelism` other than 1, indexed Jobs, `podFailurePolicy`,
`successPolicy`, `podReplacementPolicy`, `managedBy`, the defaulting of `spec.selector` and of
the template's labels by the API server (the pods get the labels directly), the finalizer
`batch.kubernetes.io/job-tracking` of the pods, the backoff between retries, events. A Job that
asks for what is not emulated is refused (`errors`).
"""

from __future__ import annotations

import collections
import copy
import datetime as dt
from collections.abc import Iterable

from .reconcile import JSON, Reconciler, is_terminal
from .store import ApiError, Store, now

CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"
LEGACY_LABELS = ("controller-uid", "job-name")
DEFAULT_BACKOFF_LIMIT = 6
COMPLETED = ("CompletionsReached", "Reached expected number of succeeded pods")
BACKOFF = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
DEADLINE = ("DeadlineExceeded", "Job was active longer than specified deadline")


def _time(stamp: str | None) -> dt.datetime | None:
    if not stamp:
        return None
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def condition(job: JSON, kind: str) -> JSON | None:
    """The condition of a type of a Job, if it is true."""
    for item in (job.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind and item.get("status") == "True":
            found: JSON = item
            return found
    return None


def finished(job: JSON) -> bool:
    """Whether a Job is `Complete` or `Failed`."""
    return condition(job, "Complete") is not None or condition(job, "Failed") is not None


def _condition(kind: str, reason: str, message: str) -> JSON:
    stamp = now()
    return {
        "type": kind,
        "status": "True",
        "lastProbeTime": stamp,
        "lastTransitionTime": stamp,
        "reason": reason,
        "message": message,
    }


def _ready(pod: JSON) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class JobController(Reconciler):
    """The Job controller of the fake cluster (see the module)."""

    name = "jobs"
    plurals = ("jobs", "pods")

    def __init__(self, store: Store, *, resync_s: float = 0.5) -> None:
        super().__init__(store, resync_s=resync_s)
        self._created: dict[str, set[str]] = collections.defaultdict(set)
        """The uids of the pods made of each Job (by its uid)."""
        self._counted: dict[str, set[str]] = collections.defaultdict(set)
        """The uids of the terminated (or vanished) pods each Job counted."""
        self.pods_created: list[str] = []
        """The names of the pods made, in order (for tests)."""

    async def reconcile(self) -> None:
        jobs, _ = self.store.list("jobs")
        pods, _ = self.store.list("pods")
        owned: dict[str, list[JSON]] = collections.defaultdict(list)
        for pod in pods:
            for ref in pod["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "Job" and ref.get("controller"):
                    owned[ref.get("uid", "")].append(pod)
        for job in jobs:
            try:
                self._sync(job, owned.get(job["metadata"]["uid"], []))
            except ApiError as error:
                if error.code not in (404, 409):  # gone or changed meanwhile: the next round
                    raise

    def _sync(self, job: JSON, pods: list[JSON]) -> None:
        meta, spec = job["metadata"], job.get("spec") or {}
        if meta.get("deletionTimestamp"):
            return
        if finished(job):
            self._expire(job)
            return
        unsupported = [
            key
            for key, value in spec.items()
            if (key in ("completions", "parallelism") and value not in (None, 1))
            or (key == "completionMode" and value != "NonIndexed")
            or key in ("podFailurePolicy", "successPolicy", "managedBy", "backoffLimitPerIndex")
        ]
        if unsupported:
            self.refuse(f"job {meta['namespace']}/{meta['name']}: {unsupported} not emulated")
            return
        if spec.get("suspend"):
            return
        uid = meta["uid"]
        status = copy.deepcopy(job.get("status") or {})
        counted = self._counted[uid]
        present = {pod["metadata"]["uid"] for pod in pods}
        for pod in pods:
            pod_uid = pod["metadata"]["uid"]
            if is_terminal(pod) and pod_uid not in counted:
                counted.add(pod_uid)
                key = "succeeded" if pod["status"]["phase"] == "Succeeded" else "failed"
                status[key] = int(status.get(key) or 0) + 1
        for pod_uid in sorted(self._created[uid] - present - counted):
            counted.add(pod_uid)  # deleted before it terminated: a failure
            status["failed"] = int(status.get("failed") or 0) + 1
        live = [p for p in pods if not is_terminal(p)]
        running = [p for p in live if not p["metadata"].get("deletionTimestamp")]
        failure = self._failure(job, status)
        if failure is not None:
            if condition(job, "FailureTarget") is None:
                status.setdefault("conditions", []).append(_condition("FailureTarget", *failure))
            for pod in running:
                self._delete(pod)
            if not live:
                status["conditions"].append(_condition("Failed", *failure))
        elif int(status.get("succeeded") or 0) >= 1:
            conditions = status.setdefault("conditions", [])
            if condition(job, "SuccessCriteriaMet") is None:
                conditions.append(_condition("SuccessCriteriaMet", *COMPLETED))
            for pod in running:
                self._delete(pod)
            if not live:
                conditions.append(_condition("Complete", *COMPLETED))
                status["completionTime"] = now()
        active = len(running)
        if failure is None and not live and not int(status.get("succeeded") or 0):
            self._create_pod(job)
            status.setdefault("startTime", now())
            active = 1
        status["active"] = active
        status["ready"] = sum(1 for p in running if _ready(p))
        status["terminating"] = len(live) - len(running)
        status.setdefault("uncountedTerminatedPods", {})
        if status != (job.get("status") or {}):
            self.store.update_status("jobs", meta["name"], status, meta["namespace"])

    def _failure(self, job: JSON, status: JSON) -> tuple[str, str] | None:
        """Why a Job fails (reason, message), None while it does not."""
        target = condition(job, "FailureTarget")
        if target is not None:
            return str(target.get("reason")), str(target.get("message"))
        spec = job.get("spec") or {}
        limit = spec.get("backoffLimit")
        limit = DEFAULT_BACKOFF_LIMIT if limit is None else int(limit)
        if int(status.get("failed") or 0) > limit:
            return BACKOFF
        deadline = spec.get("activeDeadlineSeconds")
        started = _time(status.get("startTime"))
        if (
            deadline is not None
            and started is not None
            and dt.datetime.now(dt.UTC) - started >= dt.timedelta(seconds=int(deadline))
        ):
            return DEADLINE
        return None

    def _create_pod(self, job: JSON) -> None:
        meta, template = job["metadata"], (job.get("spec") or {}).get("template") or {}
        name, uid = meta["name"], meta["uid"]
        template_meta = template.get("metadata") or {}
        pod_labels = {
            **(template_meta.get("labels") or {}),
            CONTROLLER_UID: uid,
            JOB_NAME: name,
            LEGACY_LABELS[0]: uid,
            LEGACY_LABELS[1]: name,
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{name}-",
                "namespace": meta["namespace"],
                "labels": pod_labels,
                "annotations": dict(template_meta.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": name,
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(template.get("spec") or {}),
        }
        created = self.store.create("pods", pod, meta["namespace"])
        self._created[uid].add(created["metadata"]["uid"])
        self.pods_created.append(created["metadata"]["name"])

    def _delete(self, pod: JSON) -> None:
        meta = pod["metadata"]
        try:
            self.store.delete("pods", meta["name"], meta["namespace"])
        except ApiError as error:
            if error.code != 404:
                raise

    def _expire(self, job: JSON) -> None:
        """Delete a finished Job whose `ttlSecondsAfterFinished` passed."""
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        ended = condition(job, "Complete") or condition(job, "Failed") or {}
        at = _time(ended.get("lastTransitionTime"))
        if at is None or dt.datetime.now(dt.UTC) - at < dt.timedelta(seconds=int(ttl)):
            return
        meta = job["metadata"]
        self.store.delete(
            "jobs",
            meta["name"],
            meta["namespace"],
            propagation="Foreground",
            preconditions={"uid": meta["uid"]},
        )


def job_pods(store: Store, job: JSON) -> Iterable[JSON]:
    """The pods of a Job, by its controller-uid label (for tests)."""
    pods, _ = store.list(
        "pods", job["metadata"]["namespace"], labels={CONTROLLER_UID: job["metadata"]["uid"]}
    )
    return pods
