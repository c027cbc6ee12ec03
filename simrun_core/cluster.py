"""The cluster a run's pods are placed on: one value the manifests are built from.

The fields, their names and defaults are those of spec 30 (`simrun.config.ClusterConfig`), so a
settings file's `cluster:` decodes into it unchanged. Pure data: no I/O.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

DEFAULT_BASE_IMAGE = (
    "astral-sh/uv:0.13.7-python3.14-trixie-slim"
    "@sha256:e80c05a310400cfc90af00b5b7271ef9ad24816e3265e1162af8a678e1aad099"
)


class ClusterConfig(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """Where and how the pods of a run are placed in the cluster (spec 30).

    `namespace`: of the workflows and their pods; `local_queue`: the Kueue LocalQueue of the
    pods; `store_claim`: the PersistentVolumeClaim of the NFS run store, mounted at
    `store_mount` in a pod; `scratch_path`: the local scratch, a hostPath on the node's disk
    mounted at the same path in a pod; `registry`/`registry_url`: the image registry as the
    nodes name it and the URL of its API; `service_account`: of the pods (the Argo executor's
    wait container writes its results with it); `buildkit`, `buildctl_image`, `base_image`,
    `system_packages`: the builds of the environments' images; `grace_s`: the seconds a worker
    has to stop after SIGTERM; `ttl_after_finished_s`: the seconds a finished workflow is kept;
    `pod_start_s`: about the seconds from a pod's creation to its first unit (the planner).

    `registry` is optional here (spec 30 requires it): building manifests needs none, only the
    builds of images do.
    """

    namespace: str = "simrun"
    local_queue: str = "simrun"
    store_claim: str = "simrun-store"
    store_mount: str = "/store"
    scratch_path: str = "/scratch"
    registry: str | None = None
    registry_url: str | None = None
    service_account: str = "simrun-workflow"
    buildkit: str = "tcp://buildkitd.simrun:1234"
    buildctl_image: str = "moby/buildkit:v0.34.2-rootless"
    base_image: str = DEFAULT_BASE_IMAGE
    system_packages: tuple[str, ...] = ("libexpat1",)
    grace_s: Annotated[float, msgspec.Meta(ge=0)] = 60.0
    ttl_after_finished_s: Annotated[int, msgspec.Meta(ge=0)] = 86400
    pod_start_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0

    def base_image_ref(self) -> str:
        """The base image of the environments as the builds name it: `base_image` below
        `registry` (the mirror of an image of another registry), unless its first component is
        a registry host itself (it has a `.` or a `:`, or is `localhost`). ValueError when it
        would be below a registry and the cluster has none."""
        first, slash, _ = self.base_image.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            return self.base_image
        if not self.registry:
            raise ValueError(
                f"the base image {self.base_image} is below the registry of the cluster, and "
                "the cluster has none (`cluster.registry` of the settings)"
            )
        return f"{self.registry.rstrip('/')}/{self.base_image}"
