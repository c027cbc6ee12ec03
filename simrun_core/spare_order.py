"""The order the local backend writes to a spare harness process (`simrun_harness.spare`): which
harness entry to become, for which task. Both ends read this one definition."""

from __future__ import annotations

import msgspec

UNCLAIMED_RUN = "-" * 64
"""`SIMRUN_RUN` of a spare started for whichever run takes it: as long as the longest run id,
which the spare writes over it in its own environment block when it takes up its task."""


class SpareOrder(msgspec.Struct, frozen=True):
    """What a spare becomes: the harness `entry` (`python -m simrun_harness.<entry>`:
    `worker` or `exec`) of a task, in its environment and working directory, writing to its log.
    `env` holds `SIMRUN_RUN`, the run of the task."""

    entry: str
    env: dict[str, str]
    cwd: str
    log: str


class SpareStarted(msgspec.Struct, frozen=True, tag="started"):
    """The fork server (`simrun_harness.spare --forks`) handed an order to a spare: the pid of
    the harness process it became."""

    pid: int


class SpareEnded(msgspec.Struct, frozen=True, tag="ended"):
    """A harness process of the fork server ended: its exit code as `subprocess` gives it (a
    negative signal number for a process killed by one)."""

    pid: int
    returncode: int


class SpareRefused(msgspec.Struct, frozen=True, tag="refused"):
    """The fork server could not give an order a process (a fork failed): start it anew."""

    reason: str


SpareNews = SpareStarted | SpareEnded | SpareRefused
"""What the fork server writes to the service, one JSON line each, in the order of events: the
`SpareStarted` (or `SpareRefused`) of each order in the order of the orders, the `SpareEnded`
of a process after its `SpareStarted`."""
