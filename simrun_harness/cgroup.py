"""The limits and the usage of the cgroup (v2) the harness runs in; None where unreadable.

Every reader takes the directory it reads, so tests point the harness at a fixture tree
(`SIMRUN_CGROUP_ROOT`, see `simrun_harness.env.own_cgroup`) instead of `/sys/fs/cgroup`.
"""

from __future__ import annotations

import math
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def own_cgroup(root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> Path | None:
    """The directory of this process's cgroup v2, None without a cgroup v2 hierarchy.

    In a pod (a cgroup namespace) the path of `/proc/self/cgroup` is `/`, the mount itself.
    """
    try:
        lines = proc_self_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        if line.startswith("0::"):
            candidate = root / line[3:].strip().lstrip("/")
            if (candidate / "cgroup.controllers").exists():
                return candidate
    if (root / "cgroup.controllers").exists():
        return root
    return None


def cpu_quota(cgroup: Path) -> int | None:
    """The cores the quota of `cpu.max` allows, rounded down and at least 1; None without one."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        if quota == "max":
            return None
        return max(1, math.floor(int(quota) / int(period)))
    except (OSError, ValueError, ZeroDivisionError):
        return None


def memory_limit(cgroup: Path) -> int | None:
    """The limit of `memory.max` in bytes, None without a limit or without the file."""
    try:
        value = (cgroup / "memory.max").read_text().strip()
        return None if value == "max" else int(value)
    except (OSError, ValueError):
        return None


def memory_anon(cgroup: Path) -> int | None:
    """The anonymous memory of `memory.stat` (`anon`) in bytes, without the page cache."""
    return _field(cgroup / "memory.stat", "anon")


def memory_oom_kills(cgroup: Path) -> int | None:
    """The processes of the cgroup the out of memory killer killed (`memory.events` `oom_kill`)."""
    return _field(cgroup / "memory.events", "oom_kill")


def cpu_throttled_seconds(cgroup: Path) -> float | None:
    """The seconds the processes of the cgroup waited for its CPU quota (`cpu.stat`
    `throttled_usec`), the evidence that a task needs more cores; None without the field."""
    usec = _field(cgroup / "cpu.stat", "throttled_usec")
    return None if usec is None else usec / 1e6


def _field(path: Path, name: str) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            try:
                return int(value)
            except ValueError:
                return None
    return None
