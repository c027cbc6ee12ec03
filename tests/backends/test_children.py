"""The processes of the local backend (`simrun_api.backends.children`) and its warm spares
(`simrun_api.backends.spares.SparePool`), with real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from simrun_api.backends.children import spawn, write_all
from simrun_api.backends.spares import SparePool
from simrun_core.spare_order import UNCLAIMED_RUN

SIGTERM_BLOCKED = """
import signal
print(signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, []))
"""


def blocked_in_child(tmp_path: Path, hold: bool) -> bool:
    """Whether a child started with `hold_sigterm=hold` starts with SIGTERM blocked."""
    out = tmp_path / f"blocked-{hold}.txt"

    async def scenario() -> int:
        with open(out, "wb") as output:
            child = spawn(
                [sys.executable, "-c", SIGTERM_BLOCKED],
                cwd=tmp_path,
                env=dict(os.environ),
                stdout=output,
                hold_sigterm=hold,
            )
        return await asyncio.wait_for(child.wait(), 30)

    assert asyncio.run(scenario()) == 0
    return out.read_text().strip() == "True"


def test_a_harness_starts_with_sigterm_held_and_the_loop_keeps_its_mask(tmp_path: Path) -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert blocked_in_child(tmp_path, hold=True)
    assert not blocked_in_child(tmp_path, hold=False)  # a `command` task's own process
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_the_exit_code_of_a_child_is_awaited_once_it_ends(tmp_path: Path) -> None:
    async def scenario() -> tuple[int | None, int, int, int | None]:
        quick = spawn(
            [sys.executable, "-c", "import sys; sys.exit(3)"],
            cwd=tmp_path,
            env=dict(os.environ),
            stdout=subprocess.DEVNULL,
        )
        hanging = spawn(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            cwd=tmp_path,
            env=dict(os.environ),
            stdout=subprocess.DEVNULL,
        )
        running = hanging.returncode
        code = await asyncio.wait_for(quick.wait(), 30)
        hanging.kill()
        killed = await asyncio.wait_for(hanging.wait(), 30)
        return running, code, killed, hanging.returncode

    running, code, killed, after = asyncio.run(scenario())
    assert running is None
    assert code == 3
    assert killed == after == -signal.SIGKILL


def test_a_program_that_does_not_exist_is_refused_at_its_start(tmp_path: Path) -> None:
    async def scenario() -> None:
        spawn(["/no/such/program"], cwd=tmp_path, env={}, stdout=subprocess.DEVNULL)

    with pytest.raises(FileNotFoundError):
        asyncio.run(scenario())


def test_an_order_larger_than_a_pipe_reaches_a_child_that_reads_late(tmp_path: Path) -> None:
    out = tmp_path / "read.txt"
    reader = "import sys, time; time.sleep(0.2); print(len(sys.stdin.buffer.read()))"
    data = b"x" * (1 << 20)  # more than the 64 KiB a pipe holds

    async def scenario() -> int:
        with open(out, "wb") as output:
            child = spawn(
                [sys.executable, "-c", reader],
                cwd=tmp_path,
                env=dict(os.environ),
                stdout=output,
                stdin=subprocess.PIPE,
            )
        await asyncio.wait_for(write_all(child, data), 30)
        return await asyncio.wait_for(child.wait(), 30)

    assert asyncio.run(scenario()) == 0
    assert out.read_text().strip() == str(len(data))


def run_of(pid: int) -> str | None:
    """`SIMRUN_RUN` as /proc/<pid>/environ shows it."""
    for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if entry.startswith(b"SIMRUN_RUN="):
            return entry.decode().partition("=")[2]
    return None


def test_a_pool_keeps_its_spares_ready_for_any_run_and_kills_them_when_closed(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        pool = SparePool(tmp_path, size=2)
        pool.fill()
        first, second = list(pool._ready)
        assert first.alive and second.alive
        pids = [spare._child.pid for spare in (first, second)]  # type: ignore[union-attr]
        assert all(run_of(pid) == UNCLAIMED_RUN for pid in pids)
        os.kill(pids[0], signal.SIGKILL)
        await asyncio.wait_for(first._child.wait(), 30)  # type: ignore[union-attr]
        taken = pool.take()
        assert taken is second  # the dead one is passed over
        pool.fill()
        assert len(pool._ready) == 2 and second not in pool._ready
        await taken.discard()
        waiting = list(pool._ready)
        await pool.close()
        assert not any(spare.alive for spare in waiting)
        pool.fill()
        assert pool.take() is None  # a closed pool starts none

    asyncio.run(scenario())
