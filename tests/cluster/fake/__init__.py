"""A fake Kubernetes API for the tests: real HTTP that kubernetes-asyncio talks to unchanged.

`FakeKubernetes` (api.py) serves a `Store` (store.py) whose objects are validated against the
schemas of `../shared/reference/` (schemas.py). The emulated Argo controller, Kueue and kubelet
will plug into the store: its thread-safe calls (`create`, `update`, `update_status`, `delete`,
`watch`), its admission hooks (`add_admission`) and its log storage (`append_log`,
`log_reader`).
"""

from .api import FakeKubernetes, RecordedRequest
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
    "FakeKubernetes",
    "Kind",
    "RecordedRequest",
    "Store",
    "Watcher",
]
