"""The service's SQLite file (the index and the learned resources), checked before it opens.

Everything in it can be rebuilt from the store: the index is a projection of the run logs, and
what was learned comes from the worker reports in them. So a file that cannot be used (not a
database, truncated, a page overwritten, tables of another shape, a directory in its place) is
moved aside as `<name>.broken-<time>` (with its `-wal` and `-shm`), kept for a look, and the
service starts on a new one. An error that says nothing about the file's content (it is locked,
the disk is full, no permission) is raised: moving the file would not help.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

BROKEN_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_FORMAT})
"""The primary result codes that mean the file itself is broken."""
SIDE_FILES = ("-wal", "-shm", "-journal")
QUICK_CHECK_ROWS = 3
"""How many of the problems `PRAGMA quick_check` finds the message names."""


def set_aside_if_unusable(path: Path, schemas: Iterable[str]) -> Path | None:
    """Move the database at `path` aside when it cannot be used as a database of `schemas`
    (scripts of CREATE statements; a table they make that the file has must have their
    columns) and log it; where it went, None when it is usable or missing.

    Raises sqlite3.Error or OSError for a problem that is not the file's content.
    """
    why = unusable(path, expected_columns(schemas))
    if why is None:
        return None
    aside = _aside_name(path)
    for suffix in SIDE_FILES:
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(aside.with_name(aside.name + suffix))
    path.rename(aside)
    log.warning(
        "the index %s cannot be used (%s): moved aside to %s; it is rebuilt from the logs "
        "of the store",
        path,
        why,
        aside.name,
    )
    return aside


def unusable(path: Path, expected: dict[str, list[str]]) -> str | None:
    """Why the database at `path` cannot be used, None when it can (or does not exist yet)."""
    if path.is_dir():
        return "it is a directory"
    if not path.exists():
        return None
    try:
        # Opened read-write as the service will, not created; closed before any rename.
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=rw", uri=True)) as db:
            problems = [row[0] for row in db.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                shown = "; ".join(" ".join(str(row).split()) for row in problems[:QUICK_CHECK_ROWS])
                more = len(problems) - QUICK_CHECK_ROWS
                return f"quick_check: {shown}" + (f" and {more} more" if more > 0 else "")
            for table, columns in expected.items():
                found = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
                if found and found != columns:
                    return f"its table {table} has the columns {found}, not {columns}"
    except sqlite3.DatabaseError as error:
        if error.sqlite_errorcode & 0xFF in BROKEN_CODES:
            return str(error)
        raise
    return None


def expected_columns(schemas: Iterable[str]) -> dict[str, list[str]]:
    """The columns of each table the scripts create, as SQLite reports them."""
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        for script in schemas:
            db.executescript(script)
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return {
            table: [row[1] for row in db.execute(f"PRAGMA table_info({table})")] for table in tables
        }


def _aside_name(path: Path) -> Path:
    """`<name>.broken-<UTC time>`, with a number after it when that is taken."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    aside = path.with_name(f"{path.name}.broken-{stamp}")
    number = 1
    while aside.exists() or aside.is_symlink():
        number += 1
        aside = path.with_name(f"{path.name}.broken-{stamp}-{number}")
    return aside
