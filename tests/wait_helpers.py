"""Waiting on a condition in tests and benchmarks: poll it until it holds, with a deadline.

Standard library only, so that the benchmarks can load it by its path (as they load the Slurm
fixture, which uses it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    condition: Callable[[], Any], timeout: float = 20.0, what: str = "", every: float = 0.02
) -> Any:
    """Poll a condition every `every` seconds until it is truthy, and return its value;
    TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what or condition}")
        time.sleep(every)
