"""A fake Kubernetes API for the tests: real HTTP that kubernetes-asyncio talks to unchanged.

`FakeKubernetes` (api.py) serves a `Store` (store.py) whose objects are validated against the
schemas of `tests/upstream/` (schemas.py). The emulated Argo controller (argo.py), Kueue
(kueue.py), Job controller (jobs.py) and kubelet (kubelet.py) plug into the store: its
thread-safe calls (`create`, `update`, `update_status`, `delete`, `watch`), its admission hooks
(`add_admission`) and its log storage (`append_log`, `log_reader`). `FakeCluster` (cluster.py)
runs all of them with nodes, so a Workflow submitted over HTTP runs its pods as local processes.
BuildKit and Zot, which cannot run here, have stand-ins: `FakeRegistry` (registry.py, the OCI
distribution API over HTTP) and `buildctl` (buildctl.py, first on the pods' PATH through bin/),
which pushes to it.
"""

from .api import FakeKubernetes, RecordedRequest
from .argo import ArgoController
from .cluster import FakeCluster, NodeSpec
from .jobs import JobController
from .kubelet import Kubelet
from .kueue import Kueue
from .registry import FakeRegistry
from .store import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    ApiError,
    Kind,
    Store,
    Watcher,
)

__all__ = [
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_PATCH",
    "ApiError",
    "ArgoController",
    "FakeCluster",
    "FakeKubernetes",
    "FakeRegistry",
    "JobController",
    "Kind",
    "Kubelet",
    "Kueue",
    "NodeSpec",
    "RecordedRequest",
    "Store",
    "Watcher",
]
