"""The spare harness processes of the local backend: started ahead, each handed one task of a
run (`simrun_harness.spare`).

The backend keeps spares of its own python ready for any run through one fork server
(`ForkServer`, `python -m simrun_harness.spare --forks`), so even the first task of a run starts
from a process that has python started and the harness imported, and a task that takes one up
costs the machine a fork, not the start of another python (0.1-0.2 s of CPU, which on a small
machine competes with the tasks running). The server is a child of the service, started in a
session of its own with SIGTERM blocked; each spare it forks is in a session of its own too (its
group is signalled as any harness's), and the server, its parent, tells its pid when it takes
up an order and its exit code when it ends. A spare of the server starts with a placeholder for
the run in its environment (`UNCLAIMED_RUN`) and writes the run of its order over it, so it is
found among the run's processes (`SIMRUN_RUN` in /proc/<pid>/environ) as ever.

A run with a python of its own (the venv of a run with snapshots) gets one spare at a time
started for it (`Spare`), as its tasks start: a child of the service like any harness process
(its exit code is waited for, its group signalled). One that is not ready in time is still used
(it is nearer its start than a new process); one that died, or whose stdin is closed, is not: the
task's harness is started as ever. A discarded spare is killed; a spare (or a fork server) whose
service died reads the end of its stdin and exits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import msgspec

from simrun_api.backends.children import Child, spawn, wait_writable, write_all
from simrun_core.launch import RUN
from simrun_core.spare_order import (
    UNCLAIMED_RUN,
    SpareEnded,
    SpareNews,
    SpareOrder,
    SpareRefused,
    SpareStarted,
)

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0
"""How long a closed fork server may take to exit before it is killed."""


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


class ServedChild:
    """A harness process of the fork server: its pid, and its exit code once the server told
    it (`ForkServer`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pidfd: int | None = None

    @property
    def returncode(self) -> int | None:
        """The exit code (a negative signal number for a process killed by one), None while it
        runs."""
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        """Wait for the end of the process; its exit code."""
        return await asyncio.shield(self._exited)

    def kill(self) -> None:
        """SIGKILL to the process (not its group) unless it ended already."""
        if not self._exited.done():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def ended(self, returncode: int) -> None:
        """The process ended with this exit code."""
        if self._pidfd is not None:
            asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if not self._exited.done():
            self._exited.set_result(returncode)

    def orphaned(self) -> None:
        """The server, which would tell the exit code, is gone: the end of the process is
        awaited through a pidfd, and taken as a kill (SIGKILL): its task is then retried like
        one whose process was killed, never taken as done without its exit code."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except (OSError, AttributeError):
            self.ended(-signal.SIGKILL)  # it ended already (or cannot be watched)
            return
        self._pidfd = pidfd
        asyncio.get_running_loop().add_reader(pidfd, self.ended, -signal.SIGKILL)


class ForkServer:
    """The fork server of the spares of one python for any run (`simrun_harness.spare
    --forks`): `hand_off` an order, and the harness process it became comes back."""

    def __init__(self, cwd: Path, python: str = sys.executable) -> None:
        self.cwd = cwd
        self.python = python
        self._pending: collections.deque[asyncio.Future[ServedChild | None]] = collections.deque()
        self._children: dict[int, ServedChild] = {}
        self._sending = asyncio.Lock()
        self._buffer = b""
        self._closed = False
        env = {**os.environ, RUN: UNCLAIMED_RUN}
        self._server: Child | None
        try:
            self._server = spawn(
                [python, "-m", "simrun_harness.spare", "--forks"],
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                hold_sigterm=True,
            )
        except (OSError, ValueError) as error:
            log.warning("the fork server of the spares does not start: %s", error)
            self._server = None
            return
        assert self._server.stdin is not None and self._server.stdout is not None
        self._orders = self._server.stdin.fileno()
        self._news = self._server.stdout.fileno()
        os.set_blocking(self._orders, False)
        os.set_blocking(self._news, False)
        asyncio.get_running_loop().add_reader(self._news, self._read_news)

    @property
    def pid(self) -> int | None:
        """The pid of the server, None when it did not start."""
        return self._server.pid if self._server is not None else None

    @property
    def alive(self) -> bool:
        """Whether the server takes orders (it runs and is not closed)."""
        server = self._server
        return not self._closed and server is not None and server.returncode is None

    async def hand_off(self, order: SpareOrder) -> ServedChild | None:
        """Give an order to a spare of the server; the harness process it became, or None when
        the server is gone (or could not fork): start the harness anew then."""
        if not self.alive:
            return None
        future: asyncio.Future[ServedChild | None] = asyncio.get_running_loop().create_future()
        async with self._sending:
            self._pending.append(future)
            try:
                await self._send(msgspec.json.encode(order) + b"\n")
            except OSError:
                self._gone()
        return await future

    async def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._orders, view) :]
            except BlockingIOError:
                await wait_writable(self._orders)

    def _read_news(self) -> None:
        try:
            data = os.read(self._news, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._gone()
            return
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            try:
                news = msgspec.json.decode(line, type=SpareNews)
            except msgspec.DecodeError:
                continue  # a line that is no news: not from the server
            self._take(news)

    def _take(self, news: SpareNews) -> None:
        if isinstance(news, SpareStarted):
            child = self._children[news.pid] = ServedChild(news.pid)
            self._answer(child)
        elif isinstance(news, SpareRefused):
            log.warning("the fork server did not start a spare: %s", news.reason)
            self._answer(None)
        elif isinstance(news, SpareEnded):
            ended = self._children.pop(news.pid, None)
            if ended is not None:
                ended.ended(news.returncode)

    def _answer(self, child: ServedChild | None) -> None:
        future = self._pending.popleft() if self._pending else None
        if future is not None and not future.done():
            future.set_result(child)
        elif child is not None:
            # Its order's hand-off was given up (cancelled): nobody waits for it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)

    def _gone(self) -> None:
        """The server ended (or its pipes broke): no more orders; the pending ones get None,
        the running harnesses are watched without it."""
        if self._server is None:
            return
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self._news)
        self._closed = True
        self._server.kill()  # a server whose pipes broke ends (a closed one has ended)
        while self._pending:
            future = self._pending.popleft()
            if not future.done():
                future.set_result(None)
        children, self._children = self._children, {}
        for child in children.values():
            child.orphaned()

    async def close(self) -> None:
        """Take no more orders; end the server (the end of its stdin, a kill after
        `CLOSE_TIMEOUT_S`) and wait for it. Harness processes it started and that still run are
        then watched without it (`ServedChild.orphaned`)."""
        self._closed = True
        server = self._server
        if server is None:
            return
        if server.stdin is not None:
            with contextlib.suppress(OSError):
                server.stdin.close()
        try:
            await asyncio.wait_for(server.wait(), CLOSE_TIMEOUT_S)
        except TimeoutError:
            server.kill()
            await server.wait()
        self._gone()
        if server.stdout is not None:
            with contextlib.suppress(OSError):
                server.stdout.close()
