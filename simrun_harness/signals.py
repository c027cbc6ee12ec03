"""SIGTERM as a stop request: the harness finishes what it can, then exits 143."""

from __future__ import annotations

import signal
import threading


def stop_on_sigterm() -> threading.Event:
    """Install a SIGTERM handler that sets the returned event, and nothing else.

    Called first thing by every entry point, so a process stopped while it prepares (as PID 1
    of a pod without a handler it would ignore SIGTERM) sees the request before its first claim.
    """
    stop = threading.Event()

    def request_stop(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    return stop
