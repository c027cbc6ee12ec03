"""The spare harness processes of the local backend: started ahead, each handed one task of a
run (`simrun_harness.spare`).

The backend keeps warm spares of its own python ready for any run (`SparePool`), so even the
first task of a run starts from a process that has python started and the harness imported; a
run with a python of its own (the venv of a run with snapshots) gets one spare at a time started
for it, as its tasks start. A spare is a child of the service like any harness process (its exit
code is waited for, its group signalled), started in a session of its own with SIGTERM blocked.
A pooled spare starts with a placeholder for the run in its environment (`UNCLAIMED_RUN`) and
writes the run of its order over it, so it is found among the run's processes (`SIMRUN_RUN` in
/proc/<pid>/environ) as ever. One that is not ready in time is still used (it is nearer its
start than a new process); one that died, or whose stdin is closed, is not: the task's harness
is started as ever. A discarded spare is killed; a spare whose service died reads the end of
its stdin and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import msgspec

from simrun_api.backends.children import Child, spawn, write_all
from simrun_core.launch import RUN
from simrun_core.spare_order import UNCLAIMED_RUN, SpareOrder

WARM_SPARES = 3
"""The spares of the service's python the local backend keeps ready for the next tasks."""


class Spare:
    """A harness process waiting for its task."""

    def __init__(self, child: Child | None) -> None:
        self._child = child

    @classmethod
    def start(cls, run_id: str | None, cwd: Path, python: str = sys.executable) -> Spare:
        """Start a spare with `python`, the one its harness processes run with (the venv of a
        run with snapshots), for a run or (None) for whichever run takes it first; a spare
        that cannot start is one that is gone."""
        env = {**os.environ, RUN: run_id or UNCLAIMED_RUN}
        try:
            child = spawn(
                [python, "-m", "simrun_harness.spare"],
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                hold_sigterm=True,
            )
        except (OSError, ValueError):
            return cls(None)
        return cls(child)

    @property
    def alive(self) -> bool:
        """Whether the spare still waits (it did not end)."""
        return self._child is not None and self._child.returncode is None

    async def hand_off(self, order: SpareOrder) -> Child | None:
        """Give the spare its task; the process, now the task's harness, or None when the spare
        is gone (start the harness anew then)."""
        child, self._child = self._child, None
        if child is None or child.returncode is not None:
            return None
        try:
            await write_all(child, msgspec.json.encode(order))
        except (BrokenPipeError, ConnectionResetError):
            await self._end(child)
            return None
        return child

    async def discard(self) -> None:
        """Kill the spare (unless it was handed off) and wait for it."""
        child, self._child = self._child, None
        if child is not None:
            await self._end(child)

    @staticmethod
    async def _end(child: Child) -> None:
        if child.stdin is not None:
            with contextlib.suppress(OSError):
                child.stdin.close()
        child.kill()
        await child.wait()


class SparePool:
    """Warm spares of one python for any run: `take` one, and another starts in its place."""

    def __init__(self, cwd: Path, python: str = sys.executable, size: int = WARM_SPARES) -> None:
        self.cwd = cwd
        self.python = python
        self.size = size
        self._ready: list[Spare] = []
        self._closed = False

    def fill(self) -> None:
        """Start spares until `size` of them wait (not after `close`)."""
        self._ready = [spare for spare in self._ready if spare.alive]
        while not self._closed and len(self._ready) < self.size:
            self._ready.append(Spare.start(None, self.cwd, self.python))

    def take(self) -> Spare | None:
        """The spare started longest ago that still waits (the one nearest its readiness),
        None without one; `fill` starts another (after the hand-off: first the task)."""
        while self._ready:
            spare = self._ready.pop(0)
            if spare.alive:
                return spare
        return None

    async def close(self) -> None:
        """Start no more spares and kill those waiting."""
        self._closed = True
        ready, self._ready = self._ready, []
        await asyncio.gather(*(spare.discard() for spare in ready))
