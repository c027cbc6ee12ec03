"""The index as a projection of the runs' logs: rebuilt at start, written after every change of
a run's summary, and written again later (with backoff) when its database fails: a write of the
index never fails a run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable

from simrun_api.changes import ChangeSignal
from simrun_api.index import RunIndex
from simrun_core.wire import RunItem

log = logging.getLogger(__name__)

INDEX_RETRY_S = (0.1, 0.2, 0.5, 1.0, 2.0)
INDEX_REBUILD_TRIES = 8
INDEX_ERRORS = (OSError, sqlite3.Error)
_MISSING = object()


class IndexProjection:
    """Keeps the index equal to the summaries of the runs.

    `current(run_id)` gives the summary of a live run as it is now (a write retried later
    writes that, not the older one that failed); `changed` is notified once a retried write
    went through.

    The snapshots of a run (`refer`) count as referred to from the moment `refer` is called,
    also while their write waits to be done again (`snapshots`), so a removal of other runs
    never takes a snapshot a new run refers to for one no run refers to.
    """

    def __init__(
        self,
        index: RunIndex,
        changed: ChangeSignal,
        current: Callable[[str], RunItem | None],
    ) -> None:
        self.index = index
        self.changed = changed
        self.current = current
        self._unindexed: dict[str, RunItem | None] = {}
        self._unreferred: dict[str, list[str]] = {}
        self._wake = asyncio.Event()
        self._retrier: asyncio.Task[None] | None = None

    def pending(self, run_id: str) -> bool:
        """Whether a write of a run's summary waits to be done again."""
        return run_id in self._unindexed

    async def rebuild(
        self, items: list[RunItem], snapshots: dict[str, list[str]] | None = None
    ) -> None:
        """Rebuild the index (with the snapshots of the runs, by run id), trying again with
        backoff when its database fails; then start the retries of later writes."""
        for attempt in range(INDEX_REBUILD_TRIES):
            try:
                await self.index.rebuild(items, snapshots)
                break
            except INDEX_ERRORS as error:
                if attempt == INDEX_REBUILD_TRIES - 1:
                    raise
                log.warning("the index could not be rebuilt (trying again): %s", error)
                await asyncio.sleep(INDEX_RETRY_S[min(attempt, len(INDEX_RETRY_S) - 1)])
        self._retrier = asyncio.create_task(self._retry(), name="index retries")

    async def put(self, item: RunItem) -> None:
        """Put an item into the index; when its database fails, put it later."""
        self._unindexed.pop(item.id, None)
        try:
            await self.index.put(item)
        except INDEX_ERRORS as error:
            log.warning("run %s: the index was not updated (later): %s", item.id, error)
            self._unindexed[item.id] = item
            self._wake.set()

    async def refer(self, run_id: str, snapshots: list[str]) -> None:
        """Record the snapshots a run refers to (at once for `snapshots`); when the database
        fails, write them later."""
        if not snapshots:
            return
        self._unreferred[run_id] = snapshots
        try:
            await self.index.refer(run_id, snapshots)
        except INDEX_ERRORS as error:
            log.warning("run %s: its snapshots were not indexed (later): %s", run_id, error)
            self._wake.set()
            return
        if self._unreferred.get(run_id) is snapshots:
            del self._unreferred[run_id]

    async def snapshots(self) -> dict[str, set[str]]:
        """The snapshots each run refers to, by run id: the index's and those whose write
        waits to be done again. A run whose removal waits still counts (its snapshots are
        kept until the index has it). Raises when the database cannot be read."""
        found = await self.index.snapshots()
        for run_id, snapshots in self._unreferred.items():
            found.setdefault(run_id, set()).update(snapshots)
        return found

    async def remove(self, run_id: str) -> None:
        """Remove a run from the index; when its database fails, remove it later."""
        self._unindexed.pop(run_id, None)
        self._unreferred.pop(run_id, None)
        try:
            await self.index.remove(run_id)
        except INDEX_ERRORS as error:
            log.warning("run %s: not removed from the index (later): %s", run_id, error)
            self._unindexed[run_id] = None
            self._wake.set()

    async def _retry(self) -> None:
        """Apply the index writes that failed, with backoff, until the database takes them."""
        failures = 0
        while True:
            await self._wake.wait()
            await asyncio.sleep(INDEX_RETRY_S[min(failures, len(INDEX_RETRY_S) - 1)])
            for run_id, pending in list(self._unindexed.items()):
                if self._unindexed.get(run_id, _MISSING) is not pending:
                    continue  # written (or failed again) meanwhile
                item = (self.current(run_id) or pending) if pending else None
                try:
                    if item is None:
                        await self.index.remove(run_id)
                    else:
                        await self.index.put(item)
                except INDEX_ERRORS as error:
                    log.debug("run %s: the index is still failing: %s", run_id, error)
                    failures += 1
                    break
                failures = 0
                if self._unindexed.get(run_id, _MISSING) is pending:
                    del self._unindexed[run_id]
                self.changed.notify()
            for run_id, snapshots in list(self._unreferred.items()):
                try:
                    await self.index.refer(run_id, snapshots)
                except INDEX_ERRORS as error:
                    log.debug("run %s: the index is still failing: %s", run_id, error)
                    failures += 1
                    break
                failures = 0
                if self._unreferred.get(run_id) is snapshots:
                    del self._unreferred[run_id]
            if not self._unindexed and not self._unreferred:
                self._wake.clear()

    async def close(self) -> None:
        """Stop the retries and try once more every write still pending."""
        if self._retrier is not None:
            self._retrier.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retrier
        for run_id, item in list(self._unindexed.items()):
            with contextlib.suppress(*INDEX_ERRORS):
                await (self.index.put(item) if item else self.index.remove(run_id))
        for run_id, snapshots in list(self._unreferred.items()):
            with contextlib.suppress(*INDEX_ERRORS):
                await self.index.refer(run_id, snapshots)
