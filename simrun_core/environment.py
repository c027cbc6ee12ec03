"""The environment a process runs simrun in: its python, simrun version and task types.

A local service records it in `service.json`; a command whose environment differs restarts an
idle service, so a new venv, plugin or simrun takes effect.
"""

from __future__ import annotations

import hashlib
import sys
from importlib.metadata import entry_points

import simrun_core
from simrun_core.plugins import ENTRY_POINT_GROUP


def environment() -> dict[str, str]:
    """`python` (the interpreter), `version` (of simrun) and `types`, a hash of the entry points
    of the task types with the names and versions of their distributions, so a new, removed or
    upgraded plugin changes it. Distributions are taken once by name, as imports see them (a
    checkout's `*.egg-info` in the working directory does not count twice)."""
    lines = sorted(
        f"{entry.name}={entry.value}@{entry.dist.name if entry.dist else ''}"
        f"=={entry.dist.version if entry.dist else ''}"
        for entry in entry_points(group=ENTRY_POINT_GROUP)
    )
    digest = hashlib.sha256("\n".join(lines).encode())
    return {
        "python": sys.executable,
        "version": simrun_core.__version__,
        "types": digest.hexdigest()[:16],
    }
