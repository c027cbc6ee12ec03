"""The exit codes of a harness process, one definition for the harness, the decider and the
backends: how a pod (a local process) ended and what that means for its retry."""

from __future__ import annotations

from typing import Final

DONE: Final = 0
HARNESS_BUG: Final = 1
FAILED: Final = 3
"""A unit, the merge or the command failed; the report's message says which and why."""
CONFIGURATION: Final = 4
"""The environment or the settings of the task are wrong; the report's message names them."""
DISK_FULL: Final = 5
"""The disk of the store is full (ENOSPC, EDQUOT): the harness could not write its event log,
its report or what its work writes. Not retried: an attempt again would meet the same disk."""
KILLED: Final = 137
"""SIGKILL: for its memory when the report counts kills for memory, else from outside."""
TERMINATED: Final = 143
"""Stopped on SIGTERM before its work was done."""

HARNESS_ERRORS: Final = frozenset({FAILED, CONFIGURATION, DISK_FULL})
"""The exits whose reason is the message of the worker's report, not the exit code."""


def stopped_from_outside(code: int) -> bool:
    """Whether an exit code is a signal's (128 + the signal): a stop, a kill or an eviction."""
    return code > 128
