"""A harness process started ahead of its task, so a task of a local run does not wait for
python to start and import the harness (about 0.1 s a task on a small machine).

The local backend starts `python -m simrun_harness.spare` ahead of tasks, with SIGTERM blocked
and its stdin a pipe, and with the run's id in its environment (`SIMRUN_RUN`, so the orphans of
a killed service are found as ever) or, for a spare kept warm for any run, a placeholder
(`UNCLAIMED_RUN`) that the spare overwrites with its order's run in its own environment block,
the memory /proc/<pid>/environ shows (`claim_run`); where that cannot be done it starts the
harness anew (an exec) with the order's environment. The spare imports the harness, then reads
its order from stdin to the end: the JSON of a `SpareOrder`. It then becomes the harness process
`python -m simrun_harness.<entry>` would have been in the task's directory: the task's
environment, its working directory as `sys.path[0]` with `PYTHONPATH` after it, stdout and
stderr appended to the task's log, stdin from /dev/null; its start (`started`, and so its
`prepare_seconds`) is the moment of the order. An empty stdin (the service went away, or
discarded the spare) ends it with nothing done.

With `--forks` it is the fork server of the spares kept warm for any run: it imports the harness
once and forks each spare from itself (a fork costs a few milliseconds of one process, where a
new python costs 0.1-0.2 s of CPU: on a small machine that CPU competes with the tasks
running). It keeps one forked spare waiting, in a session of its own, for its order on a pipe
of its own. The orders come on stdin, a JSON line each: the server hands each to the spare that
waits longest, writes its news to stdout (`SpareNews`, a JSON line each: the spare's pid, later
its exit code, which the server waits for as its parent) and forks the next spare a little
later (`REFILL_DELAY_S`: a fork at once would compete for the CPU with the start of the
harness just handed its order; an order that comes before gets a spare forked at once). At
the end of stdin (the service closed it, or went away) the server exits and its waiting spares
with it; the spares that took up a task run on, as every harness process does when its
service goes.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable

import msgspec

from simrun_core import exits
from simrun_core.launch import RUN
from simrun_core.spare_order import (
    UNCLAIMED_RUN,
    SpareEnded,
    SpareNews,
    SpareOrder,
    SpareRefused,
    SpareStarted,
)

PLACEHOLDER = f"{RUN}={UNCLAIMED_RUN}".encode()
FORKS = "--forks"
"""The argument that makes `python -m simrun_harness.spare` the fork server."""
REFILL_DELAY_S = 0.02
"""How long after handing an order the fork server forks the next spare (an order that comes
before gets a spare forked at once); `SIMRUN_SPARE_REFILL_S` in its environment sets another
(tests)."""
REFILL_ENV = "SIMRUN_SPARE_REFILL_S"


def run_slot() -> int | None:
    """The address of the `SIMRUN_RUN=<placeholder>` string in this process's initial environment
    block (what /proc/<pid>/environ shows), None without one (or without ctypes' access)."""
    if os.environ.get(RUN) != UNCLAIMED_RUN:
        return None
    try:
        environ = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError, AttributeError):
        return None
    index = 0
    while environ[index]:
        address = environ[index]
        if ctypes.string_at(address) == PLACEHOLDER:
            return address
        index += 1
    return None


def claim_run(slot: int, run_id: str) -> bool:
    """Write `SIMRUN_RUN=<run_id>` over the placeholder at `slot` (padded with NULs, so the rest
    reads as empty entries); whether /proc/self/environ shows it now."""
    marker = f"{RUN}={run_id}".encode()
    if len(marker) > len(PLACEHOLDER) or b"\0" in marker:
        return False
    ctypes.memmove(slot, marker.ljust(len(PLACEHOLDER), b"\0"), len(PLACEHOLDER))
    try:
        with open("/proc/self/environ", "rb") as shown:
            return marker in shown.read().split(b"\0")
    except OSError:
        return False


def become(order: SpareOrder, initial_path: list[str]) -> None:
    """Turn this process into the task's: environment, directory, `sys.path`, standard files.
    `initial_path` is `sys.path` as the spare started, `PYTHONPATH` of its own environment
    taken out."""
    os.environ.clear()
    os.environ.update(order.env)
    os.chdir(order.cwd)
    python_path = [os.path.abspath(p) for p in order.env.get("PYTHONPATH", "").split(os.pathsep)]
    sys.path[:] = [order.cwd, *filter(None, python_path), *initial_path[1:]]
    log = os.open(order.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    os.dup2(null, 0)
    os.close(null)


def _without_own_python_path(path: list[str]) -> list[str]:
    own = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return [path[0], *(p for p in path[1:] if p not in own)]


def main() -> None:
    """Wait for an order on stdin, then run the harness entry it names; exit with its code.
    With `--forks`, serve orders as the fork server (`serve_forks`) until stdin ends."""
    # What the entry points import when they run, imported now while there is time: the
    # harness, what its pool forks with, and the task types of simrun itself.
    import multiprocessing.popen_fork
    import multiprocessing.synchronize  # noqa: F401

    import simrun_core.task_types.command
    import simrun_core.task_types.demo  # noqa: F401
    import simrun_harness.command
    import simrun_harness.entry
    import simrun_harness.sources
    import simrun_harness.split  # noqa: F401
    from simrun_core.plugins import scan_task_types
    from simrun_harness import exec as exec_entry
    from simrun_harness import worker as worker_entry

    scan_task_types()  # what loading the task's type reads, read now while there is time
    mains: dict[str, Callable[..., None]] = {
        "worker": worker_entry.main,
        "exec": exec_entry.main,
    }
    initial_path = _without_own_python_path(list(sys.path))
    slot = run_slot()

    def take_up(request: bytes) -> None:
        _take_up(request, mains, initial_path, slot)

    if sys.argv[1:] == [FORKS]:
        serve_forks(take_up)
        return
    request = sys.stdin.buffer.read()
    if not request.strip():
        sys.exit(0)
    take_up(request)


def _take_up(
    request: bytes,
    mains: dict[str, Callable[..., None]],
    initial_path: list[str],
    slot: int | None,
) -> None:
    """Become the harness of an order and run it (it exits with its code); exit 4 for a
    request that is no order."""
    try:
        order = msgspec.json.decode(request, type=SpareOrder)
        run = mains[order.entry]
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError) as error:
        print(f"simrun-spare: the order is not one: {error}", file=sys.stderr)
        sys.exit(exits.CONFIGURATION)
    started = time.time()
    unclaimed = os.environ.get(RUN) == UNCLAIMED_RUN
    claimed = slot is not None and claim_run(slot, order.env.get(RUN, ""))
    become(order, initial_path)
    if unclaimed and not claimed:
        # Not found under its run otherwise: the harness as it would have started (SIGTERM is
        # still blocked, as the backend starts it).
        entry = f"simrun_harness.{order.entry}"
        os.execve(sys.executable, [sys.executable, "-m", entry], order.env)
    sys.argv = [sys.modules[run.__module__].__file__ or order.entry]
    run(started=started)


# -- the fork server --------------------------------------------------------------------------


def serve_forks(take_up: Callable[[bytes], None]) -> None:
    """Serve the orders of stdin, one JSON line each, until it ends (see the module): each goes
    to a spare forked from this process, and stdout gets the news of it (`SpareNews`)."""
    _ForkServer(take_up).serve()


class _Waiting:
    """A spare forked by the server, waiting for its order on a pipe; it writes a byte to
    `ready_fd` once it leads a session of its own."""

    def __init__(self, pid: int, order_fd: int, ready_fd: int) -> None:
        self.pid = pid
        self.order_fd = order_fd
        self.ready_fd = ready_fd

    def close(self) -> None:
        for fd in (self.order_fd, self.ready_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class _ForkServer:
    """The loop of `serve_forks`: one thread (forks are safe), a select over the orders and the
    wakeup of SIGCHLD."""

    def __init__(self, take_up: Callable[[bytes], None]) -> None:
        self.take_up = take_up
        self.waiting: list[_Waiting] = []
        self.handed: set[int] = set()  # the pids of the spares that took up an order
        self.refill_at: float | None = None  # time.monotonic() of the next spare's fork
        try:
            self.refill_delay_s = float(os.environ.get(REFILL_ENV) or REFILL_DELAY_S)
        except ValueError:
            self.refill_delay_s = REFILL_DELAY_S
        self.wake_read, self.wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def serve(self) -> None:
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(self.wake_write)
        gc.freeze()  # what was imported is never collected: forks copy fewer of its pages
        self._fork_spare()
        pending = b""
        while True:
            timeout = None
            if self.refill_at is not None:
                timeout = max(0.0, self.refill_at - time.monotonic())
            readable, _, _ = select.select([0, self.wake_read], [], [], timeout)
            if self.refill_at is not None and time.monotonic() >= self.refill_at:
                self.refill_at = None
                if not self.waiting:
                    self._fork_spare()
            if self.wake_read in readable:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake_read, 512):
                        pass
                self._reap()
            if 0 in readable:
                data = os.read(0, 1 << 16)
                if not data:
                    break  # the service closed its end or went away
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._hand(line)
        for spare in self.waiting:
            spare.close()  # each reads the end of its pipe and exits

    def _hand(self, order: bytes) -> None:
        """Give an order to the spare waiting longest (once it leads its session, so its group
        can be signalled once its pid is told), then fork the next one."""
        while True:
            if not self.waiting and not self._fork_spare():
                self._news(SpareRefused(reason="no process could be forked"))
                return
            spare = self.waiting.pop(0)
            try:
                if not os.read(spare.ready_fd, 1):
                    continue  # it died before it was ready: its end is reaped
                _write_all(spare.order_fd, order)
            except BrokenPipeError:
                continue  # it died: its end is reaped
            finally:
                spare.close()
            self.handed.add(spare.pid)
            self._news(SpareStarted(pid=spare.pid))
            # The next spare is forked a little later: now, its fork would compete for the
            # CPU with the start of the harness just handed its order.
            self.refill_at = time.monotonic() + self.refill_delay_s
            return

    def _fork_spare(self) -> bool:
        """Fork a spare that waits for its order; whether one could be forked."""
        order_read, order_write = os.pipe2(os.O_CLOEXEC)
        ready_read, ready_write = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError:
            for fd in (order_read, order_write, ready_read, ready_write):
                os.close(fd)
            return False
        if pid == 0:
            os.close(order_write)
            os.close(ready_read)
            self._in_spare(order_read, ready_write)
        os.close(order_read)
        os.close(ready_write)
        self.waiting.append(_Waiting(pid, order_write, ready_read))
        return True

    def _in_spare(self, order_read: int, ready_write: int) -> None:
        """The life of a forked spare: none of the server's files, a session of its own, its
        order, then the harness it becomes; it never returns into the server's loop."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(self.wake_read)
            os.close(self.wake_write)
            for spare in self.waiting:
                spare.close()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.close(null)
            os.setsid()
            os.write(ready_write, b".")
            os.close(ready_write)
            request = _read_all(order_read)
            os.close(order_read)
            if request.strip():
                self.take_up(request)
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(code)

    def _reap(self) -> None:
        """Wait for the ended children: the news of a harness's end; a waiting spare that died
        is replaced."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.handed:
                self.handed.discard(pid)
                self._news(SpareEnded(pid=pid, returncode=_returncode(status)))
                continue
            for spare in list(self.waiting):
                if spare.pid == pid:
                    self.waiting.remove(spare)
                    spare.close()
                    self._fork_spare()

    @staticmethod
    def _news(news: SpareNews) -> None:
        _write_all(1, msgspec.json.encode(news) + b"\n")


def _returncode(status: int) -> int:
    """A wait status as `subprocess` gives it: the exit code, or the negative signal number."""
    return os.waitstatus_to_exitcode(status)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


if __name__ == "__main__":
    main()
