"""The peak anonymous memory of a harness: of its cgroup, or of its process tree."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Literal

from simrun_harness import cgroup

MemorySource = Literal["cgroup", "process"]
PROC = Path("/proc")


def process_tree_anon(pid: int, proc: Path = PROC) -> int | None:
    """The anonymous memory of a process and all its descendants in bytes, None when it is gone.

    The sum of `RssAnon` (`VmRSS` without it) over the processes: pages shared after a fork
    count once per process, so it is an upper bound.
    """
    root = _anon_of(pid, proc)
    if root is None:
        return None
    return root + sum(_anon_of(child, proc) or 0 for child in descendants(pid, proc))


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """The pids of the descendants of a process, read from procfs (children of every thread)."""
    found: list[int] = []
    frontier = [pid]
    parents = None
    while frontier:
        parent = frontier.pop()
        try:
            children = _children(parent, proc)
        except FileNotFoundError:
            # A kernel without /proc/<pid>/task/<tid>/children: scan the parents of all.
            parents = parents if parents is not None else _parent_map(proc)
            children = [child for child, ppid in parents.items() if ppid == parent]
        found.extend(children)
        frontier.extend(children)
    return found


def _children(pid: int, proc: Path) -> list[int]:
    children: list[int] = []
    tasks = proc / str(pid) / "task"
    try:
        threads = list(tasks.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    for thread in threads:
        try:
            children.extend(int(child) for child in (thread / "children").read_text().split())
        except FileNotFoundError:
            if thread.exists():
                raise
    return children


def _parent_map(proc: Path) -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError):
            continue
    return parents


def _anon_of(pid: int, proc: Path) -> int | None:
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    value = fields.get("RssAnon") or fields.get("VmRSS")
    if value is None:
        return 0  # a zombie has no memory
    number, _, unit = value.strip().partition(" ")
    return int(number) * (1024 if unit.strip() == "kB" else 1)


class MemorySampler:
    """The largest anonymous memory of the harness over its samples, in bytes (`peak`).

    Source `cgroup`: `anon` of `memory.stat` of the harness's cgroup v2, which counts what the
    processes allocated but not the page cache of staging and writing outputs; without a
    readable cgroup v2 it falls back to `process`: `process_tree_anon` of the harness.
    `source` says which one is used. Thread safe.
    """

    def __init__(self, source: MemorySource = "cgroup", pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.cgroup = cgroup.own_cgroup() if source == "cgroup" else None
        if self.cgroup is not None and cgroup.memory_anon(self.cgroup) is None:
            self.cgroup = None
        self.source: MemorySource = "cgroup" if self.cgroup is not None else "process"
        self.peak: int | None = None
        self._lock = threading.Lock()

    def sample(self) -> None:
        """Read the anonymous memory now and keep it when it is the largest so far."""
        if self.cgroup is not None:
            value = cgroup.memory_anon(self.cgroup)
        else:
            value = process_tree_anon(self.pid)
        if value is None:
            return
        with self._lock:
            if self.peak is None or value > self.peak:
                self.peak = value


class OomKillCounter:
    """The out of memory kills of the harness's cgroup since it was created (0 without one)."""

    def __init__(self, source: MemorySource) -> None:
        self.cgroup = cgroup.own_cgroup() if source == "cgroup" else None
        self.start = self._read()

    def _read(self) -> int | None:
        return None if self.cgroup is None else cgroup.memory_oom_kills(self.cgroup)

    def kills(self) -> int:
        """The kills since the start; 0 when the counter cannot be read."""
        now = self._read()
        if now is None or self.start is None:
            return 0
        return max(0, now - self.start)
