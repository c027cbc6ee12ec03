"""The spare harness processes of the local backend: one started ahead per run that has tasks
left, handed the next task of the run (`simrun_harness.spare`).

A spare is a child of the service like any harness process (its exit code is waited for, its
group signalled), started in a session of its own with SIGTERM blocked and the run's id in its
environment. One that is not ready in time is still used (it is nearer its start than a new
process); one that died, or whose stdin is closed, is not: the task's harness is started as
ever. A discarded spare is killed; a spare whose service died reads the end of its stdin and
exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from simrun_core.spare_order import SpareOrder


class Spare:
    """A harness process waiting for its task."""

    def __init__(self, starting: asyncio.Task[asyncio.subprocess.Process]) -> None:
        self._starting = starting

    @classmethod
    def start(
        cls, run_id: str, cwd: Path, preexec: Callable[[], None], python: str = sys.executable
    ) -> Spare:
        """Start a spare for a run (in the background: this returns at once) with `python`, the
        one its harness processes run with (the venv of a run with snapshots)."""
        env = {**os.environ, "SIMRUN_RUN": run_id}
        starting = asyncio.ensure_future(
            asyncio.create_subprocess_exec(
                python,
                "-m",
                "simrun_harness.spare",
                cwd=cwd,
                env=env,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=preexec,
            )
        )
        return cls(starting)

    async def hand_off(self, order: SpareOrder) -> asyncio.subprocess.Process | None:
        """Give the spare its task; the process, now the task's harness, or None when the spare
        is gone (start the harness anew then)."""
        try:
            process = await self._starting
        except OSError:
            return None
        stdin = process.stdin
        if process.returncode is not None or stdin is None:
            return None
        try:
            stdin.write(msgspec.json.encode(order))
            stdin.close()
            await stdin.wait_closed()
        except (BrokenPipeError, ConnectionResetError):
            await self._end(process)
            return None
        return process

    async def discard(self) -> None:
        """Kill the spare (once started) and wait for it."""
        try:
            process = await self._starting
        except OSError:
            return
        await self._end(process)

    @staticmethod
    async def _end(process: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
