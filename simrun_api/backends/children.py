"""The processes the local backend starts, without holding its event loop while they start.

`asyncio.create_subprocess_exec` with a `preexec_fn` forks the service (no vfork) and waits
in the event loop until the child ran that Python function and exec'd: 30-50 ms of a loop that
meanwhile starts no other task and reads no mailbox. `spawn` starts a process with vfork
instead (no `preexec_fn`): a harness's SIGTERM is held by blocking it in the calling thread
around the start, a mask the child inherits (the harness unblocks it once its handler is
installed). Its end is awaited through a pidfd in the loop (a thread waits where the kernel
has none).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import IO, Protocol


class Process(Protocol):
    """A process of the backend: a `Child` it started, or a harness of its fork server."""

    @property
    def pid(self) -> int:
        """The pid of the process (the leader of its process group)."""
        ...

    @property
    def returncode(self) -> int | None:
        """The exit code (a negative signal number for a process killed by one), None while
        it runs."""
        ...

    async def wait(self) -> int:
        """Wait for the end of the process; its exit code."""
        ...

    def kill(self) -> None:
        """SIGKILL to the process (not its group) unless it ended already."""
        ...


class Child:
    """A started process: its pid, its exit code once it ended, its stdin pipe if it has one."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._exited: asyncio.Future[int] = loop.create_future()
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except (OSError, AttributeError):
            self._pidfd = None
            waiting = asyncio.ensure_future(asyncio.to_thread(popen.wait))
            waiting.add_done_callback(lambda done: self._ended())
        else:
            loop.add_reader(self._pidfd, self._ended)

    @property
    def returncode(self) -> int | None:
        """The exit code (a negative signal number for a killed process), None while it runs."""
        return self._popen.returncode if self._exited.done() else None

    @property
    def stdin(self) -> IO[bytes] | None:
        """The pipe to the process's stdin, when it was started with one."""
        return self._popen.stdin

    @property
    def stdout(self) -> IO[bytes] | None:
        """The pipe from the process's stdout, when it was started with one."""
        return self._popen.stdout

    async def wait(self) -> int:
        """Wait for the end of the process; its exit code."""
        return await asyncio.shield(self._exited)

    def kill(self) -> None:
        """SIGKILL to the process (not its group) unless it ended already."""
        if not self._exited.done():
            with contextlib.suppress(ProcessLookupError):
                self._popen.kill()

    def _ended(self) -> None:
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        code = self._popen.wait()
        if not self._exited.done():
            self._exited.set_result(code)


def spawn(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    env: dict[str, str],
    stdout: int | IO[bytes],
    stdin: int | None = subprocess.DEVNULL,
    stderr: int = subprocess.STDOUT,
    hold_sigterm: bool = False,
) -> Child:
    """Start `argv` in a session of its own, stderr to its stdout unless told otherwise; with
    `hold_sigterm` it starts with SIGTERM blocked. Raises as `subprocess.Popen` does (OSError,
    ValueError)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}) if hold_sigterm else None
    try:
        popen = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
    finally:
        if held is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return Child(popen)


async def write_all(child: Child, data: bytes) -> None:
    """Write `data` to the stdin of `child` and close it, without blocking the loop on a full
    pipe; BrokenPipeError when the process closed its end (or ended)."""
    pipe = child.stdin
    if pipe is None:
        raise BrokenPipeError(errno.EPIPE, "the process has no stdin")
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                await wait_writable(fd)
                continue
            view = view[written:]
    finally:
        pipe.close()


async def wait_writable(fd: int) -> None:
    """Wait until a file descriptor (a pipe) can be written to."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    loop.add_writer(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_writer(fd)
