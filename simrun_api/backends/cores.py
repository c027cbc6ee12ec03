"""The cores of this machine, shared by the tasks of all runs in the order of their submission."""

from __future__ import annotations

import asyncio
import itertools


class CorePool:
    """A first-come queue for cores: a request waits until it is first and its cores are free.

    A request for more cores than the machine has gets all of them.
    """

    def __init__(self, cores: int) -> None:
        self.total = cores
        self.free = cores
        self._waiting: list[tuple[tuple[int, int], int, asyncio.Future[int]]] = []
        self._ticket = itertools.count()

    async def acquire(self, order: int, cores: int) -> int:
        """Wait for `cores` (at most all); requests of a lower `order` go first. The cores got."""
        want = min(cores, self.total)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append(((order, next(self._ticket)), want, future))
        self._waiting.sort(key=lambda entry: entry[0])
        self._grant()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())
            self._waiting = [entry for entry in self._waiting if entry[2] is not future]
            self._grant()
            raise

    def release(self, cores: int) -> None:
        """Give cores back and wake the next requests that fit."""
        self.free += cores
        self._grant()

    def _grant(self) -> None:
        while self._waiting:
            _, want, future = self._waiting[0]
            if future.done():
                self._waiting.pop(0)
                continue
            if want > self.free:
                return
            self._waiting.pop(0)
            self.free -= want
            future.set_result(want)
