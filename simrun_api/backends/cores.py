"""The cores and GPUs of this machine, shared by the tasks of all runs in the order of their
submission."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Grant:
    """What a request got: its cores and its GPUs (as `CUDA_VISIBLE_DEVICES` names them)."""

    cores: int
    gpus: tuple[str, ...] = ()


class CorePool:
    """A first-come queue for cores and GPUs: a request waits until it is first and its cores
    and its GPUs are free; it gets them together, each GPU for itself alone.

    A request for more cores (or GPUs) than the machine has gets all of them.
    """

    def __init__(self, cores: int, gpus: Sequence[str] = ()) -> None:
        self.total = cores
        self.free = cores
        self.gpus = tuple(dict.fromkeys(gpus))  # a GPU named twice is still one GPU
        self._free_gpus = list(self.gpus)
        self._waiting: list[tuple[tuple[int, int], int, int, asyncio.Future[Grant]]] = []
        self._ticket = itertools.count()

    @property
    def gpus_used(self) -> int:
        """The GPUs granted now."""
        return len(self.gpus) - len(self._free_gpus)

    async def acquire(self, order: int, cores: int, gpus: int = 0) -> Grant:
        """Wait for `cores` and `gpus` (at most all); requests of a lower `order` go first."""
        want = min(cores, self.total)
        want_gpus = min(gpus, len(self.gpus))
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._waiting.append(((order, next(self._ticket)), want, want_gpus, future))
        self._waiting.sort(key=lambda entry: entry[0])
        self._grant()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())
            self._waiting = [entry for entry in self._waiting if entry[3] is not future]
            self._grant()
            raise

    def release(self, grant: Grant) -> None:
        """Give cores and GPUs back and wake the next requests that fit."""
        self.free += grant.cores
        self._free_gpus.extend(grant.gpus)
        self._free_gpus.sort(key=self.gpus.index)
        self._grant()

    def _grant(self) -> None:
        while self._waiting:
            _, want, want_gpus, future = self._waiting[0]
            if future.done():
                self._waiting.pop(0)
                continue
            if want > self.free or want_gpus > len(self._free_gpus):
                return
            self._waiting.pop(0)
            self.free -= want
            given, self._free_gpus = self._free_gpus[:want_gpus], self._free_gpus[want_gpus:]
            future.set_result(Grant(want, tuple(given)))
