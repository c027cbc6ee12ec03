"""The event streams open per identity, and their limit (`max_streams_per_identity`).

Every stream holds a connection, a task and up to `stream_queue_bytes` of messages; a client
that opens streams without end (a page reloaded in a loop, an agent that never closes what it
follows) would take the service's memory and connections from everyone else. Beyond the limit
a stream is refused with 429 until one of the identity's streams ends.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from litestar.exceptions import TooManyRequestsException

from simrun_core.wire import Identity


class OpenStreams:
    """The number of event streams each identity has open."""

    def __init__(self) -> None:
        self._open: collections.Counter[Identity] = collections.Counter()

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

        return release

    def count(self, identity: Identity) -> int:
        """The streams `identity` has open."""
        return self._open[identity]
