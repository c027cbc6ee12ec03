"""The labels and annotations of simrun's Kubernetes objects, and valid label values of free text.

Kubernetes takes a label value of at most 63 characters of `[A-Za-z0-9._-]`, starting and ending
alphanumeric (or empty); an object name of the workflows and pods a DNS-1123 label. A group is
free text, so its label is `label_value(group)` and its annotation the group as given (spec 32).
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

RUN: Final = "simrun/run"
"""The run of a workflow and of its pods; the backend watches the Workflows carrying it."""
GROUP: Final = "simrun/group"
"""The group of a run: a label (`label_value`) and an annotation (as given)."""
TASK: Final = "simrun/task"
"""The task of a pod."""
FIRST_ATTEMPTS: Final = "simrun/first-attempts"
"""The annotation of a Workflow whose workers do not all start at attempt 0 (one created again
for a run): JSON, `{task: {worker: first attempt}}`; its pods read theirs from
`SIMRUN_FIRST_ATTEMPTS`."""
WORKER_NODE: Final = "simrun/worker"
"""`simrun/worker=true` marks the nodes of the runs, those of the ResourceFlavor (spec 11)."""
RESERVED: Final = "simrun/reserved"
"""A node reserved for a run: its label and its taint `simrun/reserved=<run>:NoExecute`."""
QUEUE_NAME: Final = "kueue.x-k8s.io/queue-name"
"""The Kueue LocalQueue of a pod: it makes the pod a Kueue workload (spec 11 findings)."""
PRIORITY_CLASS: Final = "kueue.x-k8s.io/priority-class"
"""The Kueue WorkloadPriorityClass of a pod."""
REQUIRED_TOPOLOGY: Final = "kueue.x-k8s.io/podset-required-topology"
"""The annotation of topology aware scheduling: the level a pod's podset must fit in."""
HOSTNAME: Final = "kubernetes.io/hostname"
"""The node label of the topology level of one host: one node per pod."""

MAX_LABEL: Final = 63
HASH_CHARS: Final = 8
"""The hex digits of the hash a changed label value ends in."""
_LABEL_VALUE: Final = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")
_NOT_IN_VALUE: Final = re.compile(r"[^a-z0-9._-]")
_EDGES: Final = "._-"


def is_label_value(text: str) -> bool:
    """Whether Kubernetes takes `text` as a label value."""
    return bool(_LABEL_VALUE.fullmatch(text))


def label_value(text: str) -> str:
    """A valid label value for free text (spec 32).

    Lower case, every character but `[a-z0-9._-]` made `-`, the ends trimmed to alphanumerics,
    at most 63 characters. A value that had to be changed ends in a hash of the text, so two
    texts that differ keep different values (`Study 1` and `study-1` do); `text` itself when it
    is a lower case label value already.
    """
    value = _NOT_IN_VALUE.sub("-", text.lower()).strip(_EDGES)
    if value == text and len(value) <= MAX_LABEL:
        return value
    digest = hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]
    stem = value[: MAX_LABEL - HASH_CHARS - 1].rstrip(_EDGES)
    return f"{stem}-{digest}" if stem else digest
