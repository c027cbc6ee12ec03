"""The first and last acts of a harness process: SIGTERM as a stop request, when the process
started, and a quick exit once its report is written.

Both happen before anything else is imported (see `worker.main`, `exec.main`), so a process
stopped while it prepares sees the request, and its report can tell how long it prepared.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

PROC = Path("/proc")
MAX_START_AGE_S = 600.0
HARNESS_STARTED = "SIMRUN_HARNESS_STARTED"
"""When the harness started (seconds since the epoch), kept across its restart after the
install of the sources (`simrun_harness.sources`)."""


def stop_on_sigterm() -> threading.Event:
    """Install a SIGTERM handler that sets the returned event, and nothing else; then unblock
    SIGTERM.

    Called first thing by every entry point, so a process stopped while it prepares (as PID 1
    of a pod without a handler it would ignore SIGTERM) sees the request before its first claim.
    A launcher that blocks SIGTERM across the exec closes even the window of the interpreter's
    own start: the signal stays pending until the handler is installed, and is then delivered.
    """
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return stop


def process_started(proc: Path = PROC) -> float:
    """When this process started, in seconds since the epoch (before the interpreter started).

    Its start in `/proc/self/stat` (clock ticks since boot) against `/proc/uptime`; now where
    procfs cannot tell, or tells an age that cannot be the one of a starting harness.
    """
    now = time.time()
    try:
        stat = (proc / "self" / "stat").read_text()
        start_ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        uptime = float((proc / "uptime").read_text().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return now
    return now - age if 0.0 <= age <= MAX_START_AGE_S else now


def harness_started() -> float:
    """When the harness started, set in `HARNESS_STARTED` by its first call: the variable
    survives the restart after the install of the sources, so the start is the one before the
    install (`process_started` of the first interpreter). Seconds since the epoch."""
    value = os.environ.get(HARNESS_STARTED)
    if value:
        try:
            return float(value)
        except ValueError:
            pass
    started = process_started()
    os.environ[HARNESS_STARTED] = repr(started)
    return started


def exit_now(code: int) -> None:
    """End the process with `code` once its standard streams are flushed, without the teardown
    of the interpreter (~20 ms a task): the harness has closed its files and its pool and
    written its report by then, so nothing is left for the teardown to do."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
