"""The name of a run on a backend, fixed by its run id: a resubmission finds what it made.

Every backend names what it runs of a run by this name (Argo's Workflow, the jobs of a batch
system as their prefix, the local backend's answer to `submit`), so a service started again
takes over what an earlier one submitted instead of submitting it twice. It is a DNS-1123
label, which every backend's names take (Kubernetes' object names and label values).
"""

from __future__ import annotations

import re
from typing import Final

NAME_PREFIX: Final = "simrun-"
_DNS_LABEL: Final = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")


def is_dns_label(text: str) -> bool:
    """Whether `text` is a DNS-1123 label: a name of a workflow, and a label value too."""
    return bool(_DNS_LABEL.fullmatch(text))


def workflow_name(run_id: str) -> str:
    """The name of a run on a backend, `simrun-<run id>` (spec 32).

    A run id (`YYYYMMDD-HHMMSS-<6 hex>`, `simrun_core.store`) makes a DNS-1123 label of 29
    characters, which Argo also puts in a label of every pod; ValueError for an id that does not.
    """
    name = f"{NAME_PREFIX}{run_id}"
    if not is_dns_label(name):
        raise ValueError(f"run id {run_id!r} makes no workflow name: {name!r} is no DNS-1123 label")
    return name
