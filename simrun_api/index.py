"""The index of the runs in SQLite: a projection of every run's log, rebuilt at start.

Beside the row of each run it keeps the snapshots its sources refer to (`run_snapshots`, the
`snapshot` of each source of its `submitted` event, relative to the store), so that removing
runs knows which snapshots no remaining run refers to without reading every log.

Its calls pass the fault seam (`simrun_core.faults`: `index` for writes, `index-read` for
reads), so tests can make the database fail as a full disk would.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import aiosqlite
import msgspec

from simrun_core import faults
from simrun_core.wire import RunItem

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    owner TEXT NOT NULL,
    agent TEXT,
    submitted_by TEXT NOT NULL,
    run_group TEXT,
    item BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS run_snapshots (
    run TEXT NOT NULL,
    snapshot TEXT NOT NULL,
    PRIMARY KEY (run, snapshot)
)
"""


class RunIndex:
    """The runs by id with the fields `GET /runs` filters on; each row holds the run's item."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        """Open the database and create its tables; closed again when that fails (its thread
        would keep the process from ending)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = await aiosqlite.connect(self.path)
        try:
            await self._db.execute("PRAGMA journal_mode=WAL")
            await self._db.executescript(SCHEMA)
            await self._db.commit()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the database."""
        if self._db is not None:
            await self._db.close()
            self._db = None

    @property
    def db(self) -> aiosqlite.Connection:
        assert self._db is not None, "the index is not open"
        return self._db

    async def rebuild(
        self, items: list[RunItem], snapshots: dict[str, list[str]] | None = None
    ) -> None:
        """Replace every row with the items folded from the logs, and the snapshots their
        sources refer to (by run id) when given."""
        rows = [_row(item) for item in items]
        references = [
            (run_id, snapshot)
            for run_id, referred in (snapshots or {}).items()
            for snapshot in dict.fromkeys(referred)
        ]
        await self._write(
            ("DELETE FROM runs", ()),
            ("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)", rows),
            ("DELETE FROM run_snapshots", ()),
            ("INSERT INTO run_snapshots VALUES (?, ?)", references),
        )

    async def refer(self, run_id: str, snapshots: list[str]) -> None:
        """Record the snapshots a run's sources refer to."""
        rows = [(run_id, snapshot) for snapshot in dict.fromkeys(snapshots)]
        await self._write(("INSERT OR IGNORE INTO run_snapshots VALUES (?, ?)", rows))

    async def snapshots(self) -> dict[str, set[str]]:
        """The snapshots each run refers to, by run id (runs without one left out)."""
        rows = await self._read("SELECT run, snapshot FROM run_snapshots", ())
        found: dict[str, set[str]] = {}
        for run_id, snapshot in rows:
            found.setdefault(run_id, set()).add(snapshot)
        return found

    async def put(self, item: RunItem) -> None:
        """Insert or replace the row of a run."""
        await self._write(("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)", _row(item)))

    async def remove(self, run_id: str) -> None:
        """Remove the row of a run and its snapshots."""
        await self._write(
            ("DELETE FROM runs WHERE id = ?", (run_id,)),
            ("DELETE FROM run_snapshots WHERE run = ?", (run_id,)),
        )

    async def _write(self, *statements: tuple[str, Any]) -> None:
        """Run statements in one transaction, one at a time and never during a read (the
        connection is shared); an error (OSError, sqlite3.Error) rolls it back and is raised."""
        async with self._lock:
            faults.check("index", self.path)
            try:
                for sql, values in statements:
                    if isinstance(values, list):
                        await self.db.executemany(sql, values)
                    else:
                        await self.db.execute(sql, values)
                await self.db.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.db.rollback()
                raise

    async def _read(self, query: str, values: Any) -> list[Any]:
        """The rows of a query, read between writes: the connection is shared, and a scan
        that a write interleaves with sees replaced rows twice, a rebuild half done."""
        faults.check("index-read", self.path)
        async with self._lock:
            return list(await self.db.execute_fetchall(query, values))

    async def list(
        self,
        group: str | None = None,
        owner: str | None = None,
        agent: str | None = None,
        state: str | None = None,
    ) -> list[RunItem]:
        """The runs, newest first (by their creation to the microsecond, then by id: ids of
        one second differ in a random suffix), filtered; the runs of an owner include their
        agents'."""
        where, values = [], []
        for column, value in (
            ("run_group", group),
            ("owner", owner),
            ("agent", agent),
            ("state", state),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                values.append(value)
        query = "SELECT item FROM runs"
        if where:
            query += " WHERE " + " AND ".join(where)
        rows = await self._read(query, values)
        items = [msgspec.json.decode(row[0], type=RunItem) for row in rows]
        return sorted(items, key=lambda item: (item.created, item.id), reverse=True)


def _row(item: RunItem) -> tuple[str, str, str, str | None, str, str | None, bytes]:
    return (
        item.id,
        item.state.value,
        item.owner,
        item.agent,
        item.submitted_by,
        item.group,
        msgspec.json.encode(item),
    )
