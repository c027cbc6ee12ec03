"""The memory allocator of the service's process: the C library's malloc for Python's objects.

CPython's own allocator (pymalloc) takes memory from the system in arenas of 1 MiB and gives an
arena back only once no object in it is left. Thousands of clients at once (2,000 SSE
subscribers of one live run) fill tens of new arenas with their small objects, and what the
service allocates meanwhile and keeps (its live runs' last appends, their timers, its state)
lands among them: after the clients left nearly every such arena stayed (30 of 44 MiB, still
there 20 s later). With malloc (`PYTHONMALLOC=malloc`) what they freed goes back page by page
(the service's `malloc_trim` after ended streams): 4 MiB stayed. The price is about 5% more
time in code that allocates many objects.

The allocator is chosen when the interpreter starts, so the launchers of the service set it in
the environment they start it with (`service_environment`: the local service's spawn by the
CLI; the service's image sets both variables itself). The service takes the variables out of
its own environment once it runs (`adopt_service_allocator`), so the processes it starts
(harnesses, the commands of runs) get the interpreter's default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ALLOCATOR = "PYTHONMALLOC"
MARK = "SIMRUN_SERVICE_MALLOC"
"""Set with `ALLOCATOR` by a launcher of the service: the variable is the service's, not the
user's (a user's own PYTHONMALLOC is left to the processes of runs)."""


def service_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """`environment` with the service's allocator, for a process that runs the service."""
    if ALLOCATOR in environment and MARK not in environment:
        return dict(environment)  # the user chose one (a debug allocator): theirs
    return {**environment, ALLOCATOR: "malloc", MARK: "1"}


def adopt_service_allocator() -> None:
    """In the service's process, at its start: take the variables its launcher set out of its
    environment (the interpreter uses malloc already), so that its children do not inherit
    them."""
    if os.environ.get(MARK) == "1":
        os.environ.pop(ALLOCATOR, None)
        os.environ.pop(MARK, None)
