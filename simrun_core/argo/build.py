"""The builds of images on the cluster: the manifests of a build and the registry's URLs (spec 38).

An image is built by a `batch/v1` Job of `buildctl` (the image `ClusterConfig.buildctl_image`,
moby/buildkit) against the cluster's BuildKit daemon (`ClusterConfig.buildkit`), which pushes
it to the registry as `ref`. The build context is a ConfigMap of its files (`context_configmap`),
so a context is flat (no directories) and holds at most the 1 MiB of a ConfigMap. The Job's pod
mounts it at `/context` and the optional Secret `simrun-registry-auth` (a
`kubernetes.io/dockerconfigjson` Secret, `kubectl create secret docker-registry`) as the
`config.json` of `DOCKER_CONFIG`, from which `buildctl` sends the registry's credentials to the
daemon; without the Secret the push is anonymous.

`buildctl` reads the context from `/context/..data`, not `/context`: the kubelet writes a
ConfigMap volume as symbolic links (`Dockerfile -> ..data/Dockerfile`, `..data -> ..<time>`),
and BuildKit sends the links of a local directory as links, so `/context` would give it a
Dockerfile that points out of what it sent. It resolves the links of the directory it is given
(`fsutil.NewFS`), so `..data` is the directory of the files themselves.

Order of creation: the Job first, then the ConfigMap with the Job's uid in its ownerReference.
The uid exists only once the Job does, the service may only create and delete ConfigMaps (no
patch to add the reference later: deploy/cluster/simrun.yaml), and a pod whose ConfigMap volume
is missing waits for it (the kubelet retries the mount), so the build starts once the context is
there. The reference has neither `controller` nor `blockOwnerDeletion` (which would need the
right to update the Job's finalizers); deleting the Job (its TTL, or the service with
`propagationPolicy: Background`) deletes the context with it.

Names are fixed by the image (`build_name`), so a build the service started before a restart is
found again rather than started twice. The Job has `backoffLimit: 0` (a failed build is not
retried: it fails again the same way), `activeDeadlineSeconds` (a minute more than the service
waits: the cluster ends a build nobody waits for any more) and `ttlSecondsAfterFinished`
(`ClusterConfig.ttl_after_finished_s`, as the workflows). Its pod stays off the nodes of the
runs (`simrun/worker NotIn [true]`), as the rest of the infrastructure (spec 11).

Pure: plain dicts, no I/O but the reading of a context's files (`context_files`).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from simrun_core.argo import labels
from simrun_core.cluster import ClusterConfig

BUILD_TIMEOUT_S: Final = 3600.0
"""The longest the service waits for a build."""
DEADLINE_MARGIN_S: Final = 60
"""The Job's `activeDeadlineSeconds` is the wait of the service and this: the service gives up
first (and deletes the Job); the deadline ends a build whose service is gone."""
CONFIGMAP_MAX_BYTES: Final = 1024 * 1024
"""What a ConfigMap holds: its keys and contents together (the API server's 1 MiB)."""
REGISTRY_AUTH_SECRET: Final = "simrun-registry-auth"
"""The optional Secret of the registry's credentials (`.dockerconfigjson`)."""
DOCKER_CONFIG_KEY: Final = ".dockerconfigjson"
CONTAINER: Final = "buildctl"
CONTEXT_MOUNT: Final = "/context"
CONTEXT_DIR: Final = f"{CONTEXT_MOUNT}/..data"
"""The directory of the context's files in the ConfigMap volume (see the module)."""
DOCKER_CONFIG_MOUNT: Final = "/etc/simrun/registry-auth"
DOCKERFILE: Final = "Dockerfile"

NAME_PREFIX: Final = "build-"
CONTEXT_SUFFIX: Final = "-context"
_STEM_CHARS: Final = 30
_HASH_CHARS: Final = 12

BUILD_LABEL: Final = "simrun/build"
"""The Job, its pod and its ConfigMap carry the name of the build."""
IMAGE_ANNOTATION: Final = "simrun/image"
"""The image a build pushes (no label value: it has `/` and `:`)."""
APP_LABELS: Final[Mapping[str, str]] = {
    "app.kubernetes.io/name": "simrun-build",
    "app.kubernetes.io/managed-by": "simrun",
}
CONTROLLER_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"
"""The label the Job controller gives the pods of a Job: its uid."""
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"

MANIFEST_TYPES: Final = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
"""The media types of manifests a registry is asked for (the `Accept` of `has_image`)."""

REQUESTS: Final[Mapping[str, str]] = {"cpu": "100m", "memory": "64Mi"}
LIMITS: Final[Mapping[str, str]] = {"memory": "256Mi"}
"""`buildctl` only sends the context and follows the build: BuildKit's daemon does the work."""

# The grammar of an image reference (distribution/reference).
_DOMAIN_PART: Final = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN: Final = re.compile(rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?")
_PATH_PART: Final = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG: Final = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST: Final = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
_CONFIG_KEY: Final = re.compile(r"[-._a-zA-Z0-9]+")
_NOT_IN_NAME: Final = re.compile(r"[^a-z0-9]+")

JobState = Literal["running", "complete", "failed"]


# --- image references -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ImageRef:
    """An image reference: `<registry>/<repository>[:<tag>][@<digest>]`; `registry` is None
    for a reference without a registry host (Docker Hub's)."""

    registry: str | None
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What names the manifest in the registry's API: the digest, else the tag, else
        `latest`."""
        return self.digest or self.tag or "latest"


def parse_ref(ref: str) -> ImageRef:
    """The parts of an image reference; ValueError for one that is not valid."""
    rest, at, digest = ref.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise ValueError(f"image {ref!r}: {digest!r} is no digest")
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    tag: str | None = None
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise ValueError(f"image {ref!r}: {tag!r} is no tag")
    first, sep, remainder = rest.partition("/")
    registry: str | None = None
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        if not _DOMAIN.fullmatch(first):
            raise ValueError(f"image {ref!r}: {first!r} is no registry host")
        registry, rest = first, remainder
    parts = rest.split("/")
    if not rest or not all(_PATH_PART.fullmatch(part) for part in parts):
        raise ValueError(f"image {ref!r}: {rest!r} is no repository name")
    return ImageRef(registry, rest, tag, digest or None)


def registry_api(config: ClusterConfig) -> str:
    """The URL of the registry's API as the service reaches it (`registry_url`, else
    `http://<registry>`); ValueError when the cluster has no registry."""
    if not config.registry:
        raise ValueError("the cluster has no registry (`cluster.registry` of the settings)")
    return (config.registry_url or f"http://{config.registry}").rstrip("/")


def in_registry(ref: str, config: ClusterConfig) -> ImageRef:
    """The parts of an image of the cluster's registry; ValueError for another one."""
    parsed = parse_ref(ref)
    registry_api(config)  # the cluster has one
    assert config.registry is not None
    if parsed.registry is None or parsed.registry.lower() != config.registry.lower():
        raise ValueError(
            f"image {ref!r} is not in the registry of the cluster ({config.registry}): "
            "only its images are looked up and built"
        )
    return parsed


def manifest_url(ref: str, config: ClusterConfig) -> str:
    """The URL of the manifest of an image in the API of the cluster's registry:
    `<registry_url>/v2/<repository>/manifests/<tag or digest>`.

    ValueError: the image is not in the registry of the cluster (or the cluster has none).
    """
    parsed = in_registry(ref, config)
    return f"{registry_api(config)}/v2/{parsed.repository}/manifests/{parsed.reference}"


# --- names ----------------------------------------------------------------------------------------


def build_name(ref: str) -> str:
    """The name of the Job of the build of an image: `build-<repository>-<hash of ref>`.

    A DNS-1123 label of at most 49 characters, so the ConfigMap (`-context`) and the pods (the
    Job controller's `-xxxxx`) are names too; the same image always gives the same name.
    """
    parsed = parse_ref(ref)
    tail = parsed.repository.rsplit("/", 1)[-1]
    stem = _NOT_IN_NAME.sub("-", tail.lower()).strip("-")[:_STEM_CHARS].rstrip("-")
    digest = hashlib.sha256(ref.encode()).hexdigest()[:_HASH_CHARS]
    return f"{NAME_PREFIX}{stem}-{digest}" if stem else f"{NAME_PREFIX}{digest}"


def context_name(ref: str) -> str:
    """The name of the ConfigMap of the context of a build."""
    return build_name(ref) + CONTEXT_SUFFIX


def _labels(ref: str) -> dict[str, str]:
    return {**APP_LABELS, BUILD_LABEL: build_name(ref)}


# --- the context ----------------------------------------------------------------------------------


def check_context(files: Mapping[str, bytes], where: str = "the build context") -> None:
    """Refuse what a ConfigMap cannot hold as a build context: a name that is no ConfigMap
    key, more than `CONFIGMAP_MAX_BYTES` together, no Dockerfile (ValueError naming it)."""
    for name in files:
        if len(name) > 253 or not _CONFIG_KEY.fullmatch(name) or name in (".", ".."):
            raise ValueError(
                f"{where} has the file {name!r}: a ConfigMap holds only names of letters, "
                "digits, '-', '_' and '.'"
            )
    total = sum(len(name) + len(data) for name, data in files.items())
    if total > CONFIGMAP_MAX_BYTES:
        largest = max(files, key=lambda name: len(files[name]))
        raise ValueError(
            f"{where} is too large for a ConfigMap: {total} bytes, at most "
            f"{CONFIGMAP_MAX_BYTES} (its largest file: {largest}, {len(files[largest])} bytes)"
        )
    if DOCKERFILE not in files:
        raise ValueError(f"{where} has no {DOCKERFILE}")


def context_files(directory: Path) -> dict[str, bytes]:
    """The files of a flat build context by name, checked as `check_context` does.

    ValueError: the context is no directory, has a directory (or anything but files), is too
    large for a ConfigMap or has no Dockerfile. The sizes are checked before a file is read.
    """
    where = f"the build context {directory}"
    if not directory.is_dir():
        raise ValueError(f"{where} is no directory")
    entries = sorted(directory.iterdir())
    sizes: dict[str, int] = {}
    for entry in entries:
        if entry.is_dir():
            raise ValueError(
                f"{where} has a directory, {entry.name}: a context is flat, the files of a "
                "ConfigMap"
            )
        if not entry.is_file():
            raise ValueError(f"{where} has {entry.name}, which is no file")
        sizes[entry.name] = entry.stat().st_size
    # the sizes first: a context far too large is refused without reading it
    total = sum(len(name) + size for name, size in sizes.items())
    if total > CONFIGMAP_MAX_BYTES:
        largest = max(sizes, key=lambda name: sizes[name])
        raise ValueError(
            f"{where} is too large for a ConfigMap: {total} bytes, at most "
            f"{CONFIGMAP_MAX_BYTES} (its largest file: {largest}, {sizes[largest]} bytes)"
        )
    files = {entry.name: entry.read_bytes() for entry in entries}
    check_context(files, where)
    return files


def owner_reference(job: Mapping[str, Any]) -> dict[str, str]:
    """The ownerReference of a Job as the API returned it (it has its uid)."""
    metadata = job.get("metadata") or {}
    uid = metadata.get("uid")
    if not uid:
        raise ValueError("the Job has no uid: it was not created yet")
    return {"apiVersion": "batch/v1", "kind": "Job", "name": str(metadata["name"]), "uid": uid}


def context_configmap(
    ref: str, config: ClusterConfig, files: Mapping[str, bytes], owner: Mapping[str, Any]
) -> dict[str, Any]:
    """The ConfigMap of a build's context, owned by its Job (`owner`, as created).

    A file of UTF-8 text is in `data`, any other in `binaryData` (base64); both are files of
    the volume. Immutable: a context never changes (and the kubelet need not watch it).
    ValueError as `check_context`.
    """
    check_context(files)
    data: dict[str, str] = {}
    binary: dict[str, str] = {}
    for name, content in sorted(files.items()):
        try:
            data[name] = content.decode("utf-8")
        except UnicodeDecodeError:
            binary[name] = base64.b64encode(content).decode("ascii")
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": context_name(ref),
            "namespace": config.namespace,
            "labels": _labels(ref),
            "annotations": {IMAGE_ANNOTATION: ref},
            "ownerReferences": [owner_reference(owner)],
        },
        "immutable": True,
        "data": data,
    }
    if binary:
        manifest["binaryData"] = binary
    return manifest


# --- the Job --------------------------------------------------------------------------------------


def buildctl_args(ref: str, config: ClusterConfig) -> list[str]:
    """The arguments of `buildctl`: build the context's Dockerfile on the daemon and push."""
    return [
        "--addr",
        config.buildkit,
        "build",
        "--progress",
        "plain",
        "--frontend",
        "dockerfile.v0",
        "--local",
        f"context={CONTEXT_DIR}",
        "--local",
        f"dockerfile={CONTEXT_DIR}",
        "--output",
        f"type=image,name={ref},push=true",
    ]


def build_job(
    ref: str, config: ClusterConfig, *, timeout_s: float = BUILD_TIMEOUT_S
) -> dict[str, Any]:
    """The Job that builds `ref` from the ConfigMap `context_name(ref)` (see the module);
    `timeout_s` is how long the service waits for it (`DEADLINE_MARGIN_S` more is its
    `activeDeadlineSeconds`).

    ValueError for an image not in the cluster's registry: BuildKit pushes only there.
    """
    in_registry(ref, config)
    name = build_name(ref)
    metadata = {"labels": _labels(ref), "annotations": {IMAGE_ANNOTATION: ref}}
    container = {
        "name": CONTAINER,
        "image": config.buildctl_image,
        "command": ["buildctl"],
        "args": buildctl_args(ref, config),
        "env": [{"name": "DOCKER_CONFIG", "value": DOCKER_CONFIG_MOUNT}],
        "resources": {"requests": dict(REQUESTS), "limits": dict(LIMITS)},
        "volumeMounts": [
            {"name": "context", "mountPath": CONTEXT_MOUNT, "readOnly": True},
            {"name": "registry-auth", "mountPath": DOCKER_CONFIG_MOUNT, "readOnly": True},
        ],
    }
    off_workers = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": labels.WORKER_NODE, "operator": "NotIn", "values": ["true"]}
                        ]
                    }
                ]
            }
        }
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": config.namespace, **metadata},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": math.ceil(max(timeout_s, 0)) + DEADLINE_MARGIN_S,
            "ttlSecondsAfterFinished": config.ttl_after_finished_s,
            "template": {
                "metadata": metadata,
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "affinity": off_workers,
                    "containers": [container],
                    "volumes": [
                        {"name": "context", "configMap": {"name": context_name(ref)}},
                        {
                            "name": "registry-auth",
                            "secret": {
                                "secretName": REGISTRY_AUTH_SECRET,
                                "optional": True,
                                "items": [{"key": DOCKER_CONFIG_KEY, "path": "config.json"}],
                            },
                        },
                    ],
                },
            },
        },
    }


# --- the state of a Job ---------------------------------------------------------------------------


def job_state(job: Mapping[str, Any]) -> tuple[JobState, str]:
    """Where a Job is, from its conditions, and why (`reason: message` of the condition).

    `complete` once `Complete` (or `SuccessCriteriaMet`, which precedes it) is true, `failed`
    once `Failed` (or `FailureTarget`, which precedes it while the pods end) is, else
    `running`; the Job controller writes these conditions (batch/v1, Kubernetes >= 1.31).
    """
    conditions = (job.get("status") or {}).get("conditions") or []
    true = {
        str(c.get("type")): c
        for c in conditions
        if isinstance(c, Mapping) and str(c.get("status")) == "True"
    }
    order: tuple[tuple[str, JobState], ...] = (
        ("Failed", "failed"),
        ("FailureTarget", "failed"),
        ("Complete", "complete"),
        ("SuccessCriteriaMet", "complete"),
    )
    for kind, state in order:
        condition = true.get(kind)
        if condition is not None:
            parts = (condition.get("reason"), condition.get("message"))
            return state, ": ".join(str(part) for part in parts if part)
    return "running", ""
