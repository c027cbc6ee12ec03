"""The event streams open per identity, and their limit (`max_streams_per_identity`).

Every stream holds a connection, a task and up to `stream_queue_bytes` of messages; a client
that opens streams without end (a page reloaded in a loop, an agent that never closes what it
follows) would take the service's memory and connections from everyone else. Beyond the limit
a stream is refused with 429 until one of the identity's streams ends.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import gc
from collections.abc import Callable

from litestar.exceptions import TooManyRequestsException

from simrun_core.wire import Identity

COLLECT_AFTER = 256
"""Streams ended since the last full collection of garbage that make the next one (a second
after the last of them ended). A stream that ends leaves reference cycles behind (its
cancelled tasks, their exceptions and frames), tens of KiB each: Python's collector reaches
them only after many more allocations, which a quiet service does not make, so 2,000 streams
that ended kept 125 MiB until then. After the collection the C heap's free pages are given
back (`give_back_free_memory`)."""
COLLECT_DELAY_S = 1.0


class OpenStreams:
    """The number of event streams each identity has open."""

    def __init__(self) -> None:
        self._open: collections.Counter[Identity] = collections.Counter()
        self._ended = 0
        self._collection: asyncio.TimerHandle | None = None

    def open(self, identity: Identity, limit: int) -> Callable[[], None]:
        """Count a stream of `identity`; its release (to call once, more calls do nothing).
        TooManyRequestsException (429) when the identity has `limit` open already."""
        if self._open[identity] >= limit:
            raise TooManyRequestsException(
                f"{identity.kind} {identity.name!r} has {limit} event streams open, the most "
                "this service allows (max_streams_per_identity): close one first"
            )
        self._open[identity] += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._open[identity] -= 1
            if self._open[identity] <= 0:
                del self._open[identity]
            self._count_ended()

        return release

    def _count_ended(self) -> None:
        self._ended += 1
        if self._ended < COLLECT_AFTER:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._collection is not None:
            self._collection.cancel()
        self._collection = loop.call_later(COLLECT_DELAY_S, self._collect)

    def _collect(self) -> None:
        self._collection = None
        self._ended = 0
        gc.collect()
        give_back_free_memory()

    def count(self, identity: Identity) -> int:
        """The streams `identity` has open."""
        return self._open[identity]


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, None where the C library has none (musl, macOS)."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


MALLOC_TRIM = _malloc_trim()


def give_back_free_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's `malloc_trim`): the buffers
    of thousands of ended connections leave free pages among pages still in use, which the
    heap keeps otherwise (2,000 ended streams kept ~25 MiB more without it)."""
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)
