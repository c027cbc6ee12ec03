"""A harness process started ahead of its task, so the next task of a local run does not wait for
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
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable

import msgspec

from simrun_core import exits
from simrun_core.launch import RUN
from simrun_core.spare_order import UNCLAIMED_RUN, SpareOrder

PLACEHOLDER = f"{RUN}={UNCLAIMED_RUN}".encode()


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
    """Wait for an order on stdin, then run the harness entry it names; exit with its code."""
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
    request = sys.stdin.buffer.read()
    if not request.strip():
        sys.exit(0)
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


if __name__ == "__main__":
    main()
