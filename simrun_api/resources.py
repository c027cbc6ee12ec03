"""The learned resources of the service: the observations of past workers in SQLite.

One row per report of a worker, `(run, task, worker, attempt)` unique: recording a report again
(a service restarted and tailing the logs from their start) changes nothing. The file belongs on
a local volume, as the index beside the store.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import aiosqlite
import msgspec

from simrun_core.plugins import TaskType
from simrun_core.resources import (
    WINDOW,
    Observation,
    ResolvedResources,
    ResourceKey,
    resolve,
    resource_key,
)
from simrun_core.workflow import TaskSpec

SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS observations (
        key TEXT NOT NULL,
        run TEXT NOT NULL,
        task TEXT NOT NULL,
        worker TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        time_us INTEGER NOT NULL,
        per_worker_gb REAL,
        seconds_per_unit REAL,
        oom INTEGER NOT NULL,
        succeeded INTEGER NOT NULL,
        observation BLOB NOT NULL,
        PRIMARY KEY (run, task, worker, attempt)
    )
    """,
    "CREATE INDEX IF NOT EXISTS observations_of_key ON observations (key, oom, time_us)",
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ResourceStore:
    """The observations of the workers of past tasks by key, in an aiosqlite database.

    `open()` before use and `close()` after, or `async with`.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: aiosqlite.Connection | None = None
        self.created = False
        """Whether `open` created the table: what was learned before is not in it (the file
        was removed, or moved aside as broken) and is learned again from the logs."""

    async def open(self) -> None:
        """Open the database, creating it, its table and its index when missing; closed again
        when that fails (its thread would keep the process from ending)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(self.path)
        try:
            await self._db.execute("PRAGMA journal_mode=WAL")
            found = await self._db.execute_fetchall(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'observations'"
            )
            self.created = not list(found)
            for statement in SCHEMA:
                await self._db.execute(statement)
            await self._db.commit()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the database."""
        if self._db is not None:
            await self._db.close()
            self._db = None

    async def __aenter__(self) -> ResourceStore:
        await self.open()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def db(self) -> aiosqlite.Connection:
        assert self._db is not None, "the resource store is not open"
        return self._db

    async def record(self, observation: Observation) -> bool:
        """Keep an observation; False (and nothing changed) when its report was recorded before."""
        cursor = await self.db.execute(
            "INSERT OR IGNORE INTO observations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            _row(observation),
        )
        await self.db.commit()
        return cursor.rowcount == 1

    async def observations(self, key: ResourceKey | str, limit: int = WINDOW) -> list[Observation]:
        """What `resolve` needs of a key, in time order (oldest first, ties in recording order):
        the newest `limit` observations not killed for memory, and the newest `limit` kills for
        memory no success of the key followed (at the time of the last success or later).
        """
        text = key.text() if isinstance(key, ResourceKey) else key
        rows: list[Any] = []
        async with self.db.execute(
            "SELECT time_us, rowid, observation FROM observations WHERE key = ? AND oom = 0 "
            "ORDER BY time_us DESC, rowid DESC LIMIT ?",
            (text, limit),
        ) as cursor:
            rows.extend(await cursor.fetchall())
        async with self.db.execute(
            "SELECT time_us, rowid, observation FROM observations WHERE key = ? AND oom = 1 "
            "AND time_us >= (SELECT COALESCE(MAX(time_us), -1) FROM observations "
            "WHERE key = ? AND succeeded = 1) ORDER BY time_us DESC, rowid DESC LIMIT ?",
            (text, text, limit),
        ) as cursor:
            rows.extend(await cursor.fetchall())
        rows.sort(key=lambda row: (row[0], row[1]))
        return [msgspec.json.decode(row[2], type=Observation) for row in rows]

    async def count(self, key: ResourceKey | str) -> int:
        """The number of observations of a key."""
        text = key.text() if isinstance(key, ResourceKey) else key
        async with self.db.execute(
            "SELECT COUNT(*) FROM observations WHERE key = ?", (text,)
        ) as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def resolve(
        self, task: TaskSpec, task_type: TaskType, settings: msgspec.Struct, model: str
    ) -> ResolvedResources:
        """The resources of a task from the observations of its key (see `resolve`)."""
        key = resource_key(task_type, settings, model)
        return resolve(task, task_type, settings, await self.observations(key))


def _row(observation: Observation) -> tuple[Any, ...]:
    return (
        observation.key,
        observation.run,
        observation.task,
        observation.worker,
        observation.attempt,
        _microseconds(observation.time),
        observation.per_worker_gb,
        observation.seconds_per_unit,
        int(observation.oom),
        int(observation.succeeded),
        msgspec.json.encode(observation),
    )


def _microseconds(time: datetime) -> int:
    """Microseconds since the epoch, exact; a naive time counts as UTC."""
    if time.tzinfo is None:
        time = time.replace(tzinfo=UTC)
    return (time - _EPOCH) // timedelta(microseconds=1)
