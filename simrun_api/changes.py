"""A broadcast signal: waiters wake on the next change, without polling."""

from __future__ import annotations

import asyncio


class ChangeSignal:
    """Wakes every waiter once `notify` is called; a waiter may give up after a timeout.

    `version` counts the notifications: a waiter that read it before an `await` passes it as
    `since`, so a change that came in between is not missed.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.version = 0

    def notify(self) -> None:
        """Wake the current waiters."""
        self.version += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float | None = None, since: int | None = None) -> bool:
        """Wait for the next change (at once if there was one after `since`); False when the
        timeout passed first."""
        if since is not None and since != self.version:
            return True
        event = self._event
        try:
            # `timeout` rather than `wait_for`: no task of its own a wait (a thousand streams
            # wait on their runs' signals several times a second each).
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return False
        return True
