"""The memory and CPU usage of a harness: its peak, its kills for memory, its CPU throttling.

The usage comes from the harness's own cgroup v2 when it has one (`SIMRUN_MEMORY_SOURCE=cgroup`,
a pod), else from its process tree in procfs (`process`, the local backend, whose processes
share the cgroup of the service). In a cgroup the kernel kills a process above the memory
limit and counts it in `memory.events`; where the limit is real but no cgroup enforces it
(`SIMRUN_MEMORY_ENFORCED=1`, a Slurm job) the harness does that itself (`MemoryGuard`), so a task
killed for memory is retried with more the same way. Locally the limit is not enforced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from simrun_core.launch import MemorySource
from simrun_harness import cgroup as cgroup_files

PROC = Path("/proc")
MIB = 1024**2


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
        parent = _parent_of(int(entry.name), proc)
        if parent is not None:
            parents[int(entry.name)] = parent
    return parents


def _parent_of(pid: int, proc: Path) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
        return int(stat[stat.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return None


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

    With a `cgroup` directory whose `memory.stat` has `anon`: that, what the processes
    allocated without the page cache of staging and writing outputs. Otherwise (`source`
    `process`) `process_tree_anon` of the harness `pid`. Thread safe.
    """

    def __init__(self, cgroup: Path | None = None, pid: int | None = None) -> None:
        self.pid = os.getpid() if pid is None else pid
        if cgroup is not None and cgroup_files.memory_anon(cgroup) is None:
            cgroup = None
        self.cgroup = cgroup
        self.source: MemorySource = "cgroup" if cgroup is not None else "process"
        self.peak: int | None = None
        self._lock = threading.Lock()

    def sample(self) -> None:
        """Read the anonymous memory now and keep it when it is the largest so far."""
        if self.cgroup is not None:
            value = cgroup_files.memory_anon(self.cgroup)
        else:
            value = process_tree_anon(self.pid)
        if value is None:
            return
        with self._lock:
            if self.peak is None or value > self.peak:
                self.peak = value


class OomKillCounter:
    """The kills for memory while the harness ran: the growth of `oom_kill` of the
    `memory.events` of its cgroup, plus the processes the harness killed itself (`counted`).
    Thread safe."""

    def __init__(self, cgroup: Path | None = None) -> None:
        self.cgroup = cgroup
        self.start = self._read()
        self.kills_by_harness: list[str] = []
        self._lock = threading.Lock()

    def _read(self) -> int | None:
        return None if self.cgroup is None else cgroup_files.memory_oom_kills(self.cgroup)

    def counted(self, description: str) -> None:
        """Count a process the harness killed for its memory, with what it found."""
        with self._lock:
            self.kills_by_harness.append(description)

    def kills(self) -> int:
        """The kills since the start: of the cgroup (0 where unreadable) and of the harness."""
        now = self._read()
        by_kernel = 0 if now is None or self.start is None else max(0, now - self.start)
        with self._lock:
            return by_kernel + len(self.kills_by_harness)

    def last_kill(self) -> str | None:
        """What the harness found when it last killed a process for its memory."""
        with self._lock:
            return self.kills_by_harness[-1] if self.kills_by_harness else None


class CpuThrottle:
    """The seconds the cgroup of the harness waited for its CPU quota since the start
    (`cpu.stat` `throttled_usec`); None without a cgroup of its own."""

    def __init__(self, cgroup: Path | None = None) -> None:
        self.cgroup = cgroup
        self.start = self._read()

    def _read(self) -> float | None:
        return None if self.cgroup is None else cgroup_files.cpu_throttled_seconds(self.cgroup)

    def seconds(self) -> float | None:
        """The throttled seconds since the start, None when the counter cannot be read."""
        now = self._read()
        if now is None or self.start is None:
            return None
        return round(max(0.0, now - self.start), 6)


@dataclasses.dataclass
class MemoryGuard:
    """Kill a watched process whose tree holds more anonymous memory than `limit_bytes`.

    What the kernel does in a cgroup with a memory limit, for a backend whose limit is real but
    has no cgroup per task (`SIMRUN_MEMORY_ENFORCED=1` with `SIMRUN_MEMORY_SOURCE=process`):
    each process `pids()` returns is measured by `process_tree_anon`; one above the limit is
    killed with SIGKILL, its descendants with it, and counted in `oom` as a kill for memory
    (before the kill, so whoever sees the process die finds the count). `what` names the process
    in the message, `limit_name` the variable the limit comes from. Only children of this
    process are watched, so a pid reused after a child was reaped is never killed.
    """

    limit_bytes: int
    pids: Callable[[], list[int]]
    oom: OomKillCounter
    what: str
    limit_name: str
    proc: Path = PROC
    killed: set[int] = dataclasses.field(default_factory=set)

    def check(self) -> None:
        """Measure the watched processes now and kill those above the limit."""
        for pid in self.pids():
            if pid in self.killed or _parent_of(pid, self.proc) != os.getpid():
                continue
            anon = process_tree_anon(pid, self.proc)
            if anon is None or anon <= self.limit_bytes:
                continue
            tree = [pid, *descendants(pid, self.proc)]
            self.killed.add(pid)
            self.oom.counted(
                f"{self.what} (pid {pid}) was killed for its memory: {anon / MIB:.0f} MiB of "
                f"anonymous memory, above the {self.limit_bytes / MIB:.0f} MiB of {self.limit_name}"
            )
            for member in tree:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(member, signal.SIGKILL)
