"""The processes of the local backend (`simrun_api.backends.children`) and the fork server of
its warm spares (`simrun_api.backends.spares.ForkServer`), with real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from harness.helpers import RUN_ID, HarnessTask, make_harness_task

from simrun_api.backends.children import spawn, write_all
from simrun_api.backends.spares import ForkServer
from simrun_core.spare_order import UNCLAIMED_RUN, SpareOrder

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


def environ_of(pid: int) -> bytes:
    """/proc/<pid>/environ: empty while an exec has not set up the new program's (a spawn
    returns once the exec is under way, not done)."""
    return Path(f"/proc/{pid}/environ").read_bytes()


def run_of(pid: int) -> str | None:
    """`SIMRUN_RUN` as /proc/<pid>/environ shows it."""
    for entry in environ_of(pid).split(b"\0"):
        if entry.startswith(b"SIMRUN_RUN="):
            return entry.decode().partition("=")[2]
    return None


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def children_of(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [
        int(child) for task in tasks.iterdir() for child in (task / "children").read_text().split()
    ]


def order_of(task: HarnessTask, **env: str | None) -> SpareOrder:
    """The order of a worker of the task, of the run `RUN_ID`."""
    environment = task.environment(SIMRUN_RUN=RUN_ID, **env)
    log = task.task_dir / "w0-0.log"
    return SpareOrder(entry="worker", env=environment, cwd=str(task.task_dir), log=str(log))


def test_a_fork_server_gives_each_order_a_spare_of_any_run_and_tells_its_end(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        server = ForkServer(tmp_path)
        assert server.pid is not None
        server_pid = server.pid
        await wait_for(lambda: environ_of(server_pid) != b"", "the exec of the fork server")
        assert run_of(server_pid) == UNCLAIMED_RUN
        task = make_harness_task(tmp_path / "a", {"n": 2, "sleep_s": 0.5})
        child = await asyncio.wait_for(server.hand_off(order_of(task)), 60)
        assert child is not None and child.returncode is None
        assert parent_of(child.pid) == server.pid
        assert os.getsid(child.pid) == child.pid  # its group is signalled as any harness's
        await wait_for(lambda: run_of(child.pid) == RUN_ID, "the run in its environment")
        assert await asyncio.wait_for(child.wait(), 60) == 0
        assert child.returncode == 0 and task.summary() == {"n": 2, "sum": 1}
        broken = make_harness_task(tmp_path / "b", {"n": 1})
        failing = await server.hand_off(order_of(broken, SIMRUN_TASK_DIR=str(tmp_path / "none")))
        assert failing is not None
        assert await asyncio.wait_for(failing.wait(), 60) == 4
        pid = server.pid
        await wait_for(lambda: len(children_of(pid)) == 1, "the next spare")
        waiting = children_of(pid)
        assert run_of(waiting[0]) == UNCLAIMED_RUN
        await asyncio.wait_for(server.close(), 60)
        assert not server.alive and await server.hand_off(order_of(task)) is None
        await wait_for(lambda: not Path(f"/proc/{waiting[0]}").exists(), "the spare's end")

    asyncio.run(scenario())


def test_the_harness_of_a_fork_server_that_died_ends_as_killed_not_as_done(
    tmp_path: Path,
) -> None:
    """Without the server no exit code is told: the end of its process is seen through a pidfd
    and taken as a kill, so the task is retried rather than taken as done."""

    async def scenario() -> None:
        server = ForkServer(tmp_path)
        task = make_harness_task(tmp_path / "a", {"n": 1, "sleep_s": 1})
        child = await asyncio.wait_for(server.hand_off(order_of(task)), 60)
        assert child is not None and server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        await wait_for(lambda: not server.alive, "the server's end")
        assert await server.hand_off(order_of(task)) is None
        assert child.returncode is None  # it runs on
        assert await asyncio.wait_for(child.wait(), 60) == -signal.SIGKILL
        assert task.report().exit_code == 0  # it did finish: its end is only not told

    asyncio.run(scenario())


async def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Wait in the loop until `condition()` holds; fail after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"no {what} within {timeout} s"
        await asyncio.sleep(0.01)
