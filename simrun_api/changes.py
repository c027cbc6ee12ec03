"""A broadcast signal: waiters wake on the next change, without polling."""

from __future__ import annotations

import asyncio


class ChangeSignal:
    """Wakes every waiter once `notify` is called; a waiter may give up after a timeout."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        """Wake the current waiters."""
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float | None = None) -> bool:
        """Wait for the next change; False when the timeout passed first."""
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True
