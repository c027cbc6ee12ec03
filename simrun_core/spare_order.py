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
