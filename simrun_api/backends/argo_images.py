"""The images of the Argo backend: whether the registry has one, and builds by BuildKit (spec 38).

`ImageBuilds.has_image` asks the registry's API for the manifest (`HEAD` of
`simrun_core.argo.build.manifest_url`, with the OCI and Docker media types of manifests and
indexes accepted): 200 is True, 404 False, anything else (or no answer) a RuntimeError naming
the status and the URL; an image of another registry is a ValueError.

`ImageBuilds.build_image` runs the Job of `buildctl` of `simrun_core.argo.build` with the
context as its ConfigMap: the Job first, then the ConfigMap owned by it (the module of the
manifests says why), then it polls the Job every `poll_s` until its conditions say `Complete`
or `Failed`. The names are fixed by the image, so:

- a Job of the name that has not finished is a build in flight (of an earlier service, or of
  this one): it is waited for, not started twice; its ConfigMap is created when it is missing
  (a service that died between the two creates);
- a Job of the name that has finished is a leftover of an earlier build (kept for its TTL): it
  is deleted (`propagationPolicy: Background`, so its pod and ConfigMap go with it) and the
  build starts anew, so a build that failed for a passing reason can be tried again;
- a ConfigMap of the name that a new Job finds (one whose Job was deleted but not yet collected)
  is deleted and created again, owned by the new Job.

A build that fails raises RuntimeError with the reason of the Job's condition and the last
`LOG_TAIL_LINES` lines of its pod's log. One that takes longer than `timeout_s`
(`BUILD_TIMEOUT_S`; the Job's `activeDeadlineSeconds` is a minute longer, for a service that is
gone) raises TimeoutError after its Job is deleted, so a later build starts afresh instead of
waiting on a stuck one.

The service needs in its namespace (deploy/cluster/simrun.yaml): jobs create, delete, get; pods
list and their log (the ClusterRole and Role); configmaps create and delete. Nothing reads or
patches a ConfigMap.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import httpx
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from simrun_api.backends.kube_calls import ignore_missing, read_body, read_json
from simrun_core.argo.build import (
    BUILD_TIMEOUT_S,
    CONTAINER,
    CONTROLLER_UID_LABEL,
    MANIFEST_TYPES,
    build_job,
    build_name,
    context_configmap,
    context_files,
    context_name,
    job_state,
    manifest_url,
)
from simrun_core.cluster import ClusterConfig

log = logging.getLogger(__name__)

__all__ = ["BUILD_TIMEOUT_S", "ImageBuilds", "manifest_url"]

REGISTRY_TIMEOUT_S: Final = 30.0
REQUEST_TIMEOUT_S: Final = 30.0
POLL_S: Final = 2.0
"""How often the Job of a build is read while it runs."""
LOG_TAIL_LINES: Final = 40
"""The lines of a failed build's log its error carries."""
START_TRIES: Final = 5
BACKGROUND: Final = "Background"

ApiCall = Callable[[], Awaitable[client.ApiClient]]


class ImageBuilds:
    """The image questions and builds of a cluster (see the module); `api` gives the client
    of the backend (made at its first use)."""

    def __init__(
        self,
        config: ClusterConfig,
        api: ApiCall,
        *,
        timeout_s: float = BUILD_TIMEOUT_S,
        poll_s: float = POLL_S,
        registry_timeout_s: float = REGISTRY_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.namespace = config.namespace
        self._api = api
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.registry_timeout_s = registry_timeout_s

    # -- the registry ---------------------------------------------------------------------------

    async def has_image(self, ref: str) -> bool:
        """Whether the cluster's registry has the image (its manifest).

        ValueError: the image is not in the registry of the cluster. RuntimeError: the registry
        answered neither found nor not found, or did not answer.
        """
        url = manifest_url(ref, self.config)
        headers = {"Accept": ", ".join(MANIFEST_TYPES)}
        try:
            async with httpx.AsyncClient(
                timeout=self.registry_timeout_s, follow_redirects=True
            ) as http:
                response = await http.head(url, headers=headers)
        except httpx.HTTPError as error:
            raise RuntimeError(f"the registry did not answer HEAD {url}: {error!r}") from error
        if response.status_code == 200:
            return True
        if response.status_code == 404:
            return False
        raise RuntimeError(
            f"the registry answered HEAD {url} with {response.status_code} "
            f"{response.reason_phrase}: neither found nor not found"
        )

    # -- builds -------------------------------------------------------------------------------

    async def build_image(
        self, context: os.PathLike[str] | str, ref: str, *, timeout_s: float | None = None
    ) -> None:
        """Build the image of a flat build context with BuildKit and push it as `ref`.

        ValueError: the context has a directory or is too large for a ConfigMap (or has no
        Dockerfile), or the image is not in the cluster's registry. RuntimeError: the build
        failed (its log's end in the message). TimeoutError: it took longer than `timeout_s`.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        manifest = build_job(ref, self.config, timeout_s=timeout)  # ValueError: foreign
        files = context_files(Path(context))  # ValueError: not a flat context that fits
        loop = asyncio.get_running_loop()
        started = loop.time()
        api = await self._api()
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        name = build_name(ref)
        scope = asyncio.timeout(timeout)
        uid: str | None = None
        try:
            async with scope:
                job = await self._start(batch, core, manifest, files, ref)
                uid = str(job["metadata"]["uid"])
                state, why = await self._wait(batch, name, ref)
        except TimeoutError:
            if not scope.expired():
                raise  # a request that timed out, not the build
            await self._delete_job(batch, name, uid=uid)
            raise TimeoutError(
                f"the build of {ref} took longer than {timeout:g} s: its Job {name} was deleted"
            ) from None
        if state == "failed":
            assert uid is not None
            tail = await self._log_tail(core, uid)
            raise RuntimeError(f"the build of {ref} failed (Job {name}: {why}); {tail}")
        log.info("built %s (Job %s) in %.0f s", ref, name, loop.time() - started)

    async def _start(
        self,
        batch: client.BatchV1Api,
        core: client.CoreV1Api,
        manifest: dict[str, Any],
        files: dict[str, bytes],
        ref: str,
    ) -> dict[str, Any]:
        """Create the Job and its ConfigMap, or take the Job in flight; the Job."""
        name = manifest["metadata"]["name"]
        body: Any = manifest  # the client takes the dict as the API serialises a Job
        for _ in range(START_TRIES):
            try:
                job: dict[str, Any] = await read_json(
                    batch.create_namespaced_job(
                        self.namespace,
                        body,
                        _preload_content=False,
                        _request_timeout=REQUEST_TIMEOUT_S,
                    )
                )
            except ApiException as error:
                if error.status != 409:
                    raise
            else:
                try:
                    await self._create_context(core, ref, files, job, fresh=True)
                except BaseException:
                    await self._delete_job(batch, name)
                    raise
                log.info("building %s: Job %s created", ref, name)
                return job
            existing = await self._read_job(batch, name)
            if existing is None:
                continue  # deleted meanwhile: create it again
            state, _ = job_state(existing)
            if state == "running":
                log.info("building %s: Job %s is in flight, waiting for it", ref, name)
                await self._create_context(core, ref, files, existing, fresh=False)
                return existing
            log.info(
                "building %s: the Job %s of an earlier build (%s) is replaced", ref, name, state
            )
            await self._delete_job(batch, name, uid=str(existing["metadata"]["uid"]))
        raise RuntimeError(f"the Job {name} of the build of {ref} could not be created")

    async def _create_context(
        self,
        core: client.CoreV1Api,
        ref: str,
        files: dict[str, bytes],
        job: dict[str, Any],
        *,
        fresh: bool,
    ) -> None:
        """Create the ConfigMap of the context owned by `job`. One that exists is the context
        of a Job in flight (`fresh` False: kept) or a leftover of a Job deleted before (`fresh`
        True: deleted and created again)."""
        body: Any = context_configmap(ref, self.config, files, job)
        for _ in range(START_TRIES):
            try:
                await read_json(
                    core.create_namespaced_config_map(
                        self.namespace,
                        body,
                        _preload_content=False,
                        _request_timeout=REQUEST_TIMEOUT_S,
                    )
                )
                return
            except ApiException as error:
                if error.status != 409:
                    raise
            if not fresh:
                return
            await ignore_missing(
                core.delete_namespaced_config_map(
                    context_name(ref),
                    self.namespace,
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            )
        raise RuntimeError(f"the ConfigMap {context_name(ref)} of the build of {ref} is in the way")

    async def _wait(self, batch: client.BatchV1Api, name: str, ref: str) -> tuple[str, str]:
        """Poll the Job until it finished: (`complete` or `failed`, why)."""
        while True:
            job = await self._read_job(batch, name)
            if job is None:
                raise RuntimeError(
                    f"the Job {name} of the build of {ref} was deleted before it ended"
                )
            state, why = job_state(job)
            if state != "running":
                return state, why
            await asyncio.sleep(self.poll_s)

    async def _read_job(self, batch: client.BatchV1Api, name: str) -> dict[str, Any] | None:
        try:
            job: dict[str, Any] = await read_json(
                batch.read_namespaced_job(
                    name, self.namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                )
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return job

    async def _delete_job(
        self, batch: client.BatchV1Api, name: str, uid: str | None = None
    ) -> None:
        """Delete a Job with its pods and ConfigMap (batch/v1 would orphan them by default)."""
        options = client.V1DeleteOptions(
            propagation_policy=BACKGROUND,
            preconditions=client.V1Preconditions(uid=uid) if uid is not None else None,
        )
        try:
            await read_json(
                batch.delete_namespaced_job(
                    name,
                    self.namespace,
                    body=options,
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            )
        except ApiException as error:
            if error.status not in (404, 409):  # gone, or another Job of the name by now
                raise

    async def _log_tail(self, core: client.CoreV1Api, uid: str) -> str:
        """The end of the log of the newest pod of a Job, said as such (or why there is none)."""
        try:
            pods = await read_json(
                core.list_namespaced_pod(
                    self.namespace,
                    label_selector=f"{CONTROLLER_UID_LABEL}={uid}",
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            )
        except ApiException as error:
            return f"its pods could not be listed ({error.status} {error.reason})"
        items = sorted(
            pods.get("items") or [],
            key=lambda pod: str((pod.get("metadata") or {}).get("creationTimestamp") or ""),
        )
        if not items:
            return "no pod of it is left to show its log"
        pod = items[-1]
        pod_name = str(pod["metadata"]["name"])
        terminated = _terminated(pod)
        ended = ""
        if terminated:
            ended = f", exit code {terminated.get('exitCode')}"
            if terminated.get("reason"):
                ended += f" ({terminated['reason']})"
        try:
            response = await core.read_namespaced_pod_log(
                pod_name,
                self.namespace,
                container=CONTAINER,
                tail_lines=LOG_TAIL_LINES,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            text = (await read_body(response)).decode(errors="replace").rstrip()
        except ApiException as error:
            return f"the log of its pod {pod_name}{ended} could not be read ({error.status})"
        if not text:
            return f"its pod {pod_name}{ended} logged nothing"
        return f"the end of the log of its pod {pod_name}{ended}:\n{text}"


def _terminated(pod: dict[str, Any]) -> dict[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            found: dict[str, Any] = (status.get("state") or {}).get("terminated") or {}
            return found
    return {}
