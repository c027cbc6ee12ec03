"""The snapshots of the store as the service keeps them: the uploads of clients, the snapshots
the runs refer to, and the removal of those no run refers to any more.

A run refers to the snapshots of its sources (`snapshot` of each source of its `submitted`
event, `snapshots/<name>/<tree hash>`); the index keeps them (`RunIndex.snapshots`), rebuilt
from the logs at start, and a submission's count from the moment it is accepted, before its
log is written. A path of a source that names no snapshot of the store (its provenance comes
from its client) refers to nothing and is never removed.

The rule of removal: a snapshot is removed when no remaining run refers to it and its
manifest was written more than `GRACE_S` ago. Every assembly writes the manifest again, also
of a snapshot that exists already (an upload of an unchanged tree), so a snapshot a client has
just written or uploaded and not yet submitted a run of is kept, whatever other runs are
removed meanwhile. `DELETE /runs/{run}` considers the snapshots the removed run referred to;
`POST /cleanup` every snapshot of the store, so one kept for its grace then goes with a later
cleanup. An upload through the service and a removal of the same source wait for each other
(a lock per source name).

A snapshot is removed in an order a killed service cannot leave half done under its name: its
manifest first (the next upload links to nothing of it and sends what it lacks; a client that
asked `missing` before gets a 409 and asks again), then its directory is renamed to a name of
the store's own (`.tmp-removed-*`, which `remove_leftovers` takes at the next start), then
removed. The pointer `.latest` may go on naming a removed snapshot: without its manifest it
names none (`snapshot_store.latest` gives None) until the next snapshot of the name.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Final

from simrun_api.projection import INDEX_ERRORS, IndexProjection
from simrun_api.usage import freed_bytes
from simrun_core import snapshot_store
from simrun_core.provenance import SourceProvenance
from simrun_core.snapshot import (
    DEFAULT_LIMITS,
    FileEntry,
    PathLimits,
    Scan,
    SnapshotError,
    check_name,
    is_snapshot_name,
    manifest_path,
)

log = logging.getLogger(__name__)

GRACE_S: Final = 3600.0
"""How long after it was written (its manifest) a snapshot no run refers to is kept."""
REMOVING: Final = snapshot_store.ASSEMBLING + "removed-"
"""The prefix of a snapshot being removed: one a killed service left is a leftover."""


def path_limits(directory: Path, entries: int) -> PathLimits:
    """The limits of a file list for the file system of `directory` (its `NAME_MAX` and
    `PATH_MAX`, the defaults where it does not tell) with at most `entries` entries."""
    limits = {"name_bytes": DEFAULT_LIMITS.name_bytes, "path_bytes": DEFAULT_LIMITS.path_bytes}
    for field, name in (("name_bytes", "PC_NAME_MAX"), ("path_bytes", "PC_PATH_MAX")):
        with contextlib.suppress(OSError, ValueError):
            value = os.pathconf(directory, name)
            if value > 0:
                limits[field] = value
    return PathLimits(**limits, depth=DEFAULT_LIMITS.depth, entries=entries)


def snapshot_ref(source: SourceProvenance) -> str | None:
    """The snapshot a source refers to, `snapshots/<name>/<tree hash>`; None for a source
    without one or with a path that names no snapshot of the store."""
    if not source.snapshot:
        return None
    parts = source.snapshot.split("/")
    if len(parts) != 3 or parts[0] != "snapshots" or not is_snapshot_name(parts[2]):
        return None
    try:
        check_name(parts[1])
    except SnapshotError:
        return None
    return source.snapshot


def snapshot_refs(sources: Iterable[SourceProvenance]) -> list[str]:
    """The snapshots of sources, each once, in their order."""
    return list(dict.fromkeys(ref for ref in map(snapshot_ref, sources) if ref is not None))


def stored_snapshots(store: Path) -> set[str]:
    """Every snapshot in the store, `snapshots/<name>/<tree hash>`."""
    found: set[str] = set()
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for source in os.scandir(store / "snapshots"):
            try:
                check_name(source.name)
            except SnapshotError:
                continue
            if not source.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                for entry in os.scandir(source.path):
                    if is_snapshot_name(entry.name) and entry.is_dir(follow_symlinks=False):
                        found.add(f"snapshots/{source.name}/{entry.name}")
    return found


def _written(snapshot: Path) -> float | None:
    """When a snapshot was last written: its manifest's mtime (else its directory's); None
    when it is no directory (gone, or a link)."""
    try:
        if not snapshot.is_dir() or snapshot.is_symlink():
            return None
    except OSError:
        return None
    for path in (manifest_path(snapshot), snapshot):
        with contextlib.suppress(OSError):
            return path.stat().st_mtime
    return None


def removable(store: Path, candidates: Iterable[str], referred: set[str], now: float) -> list[str]:
    """The candidates that may be removed: snapshots of the store no run refers to, written
    more than `GRACE_S` before `now`; sorted."""
    chosen = []
    for ref in set(candidates) - referred:
        written = _written(store / ref)
        if written is not None and written <= now - GRACE_S:
            chosen.append(ref)
    return sorted(chosen)


def remove_snapshot(store: Path, ref: str) -> bool:
    """Remove a snapshot: its manifest, then its directory renamed out of its name and
    removed; whether it was there."""
    snapshot = store / ref
    with contextlib.suppress(FileNotFoundError):
        manifest_path(snapshot).unlink()
    hidden = snapshot.with_name(f"{REMOVING}{snapshot.name}-{secrets.token_hex(4)}")
    try:
        snapshot.rename(hidden)
    except FileNotFoundError:
        return False
    snapshot_store.remove_snapshot(hidden)
    return True


class Snapshots:
    """The snapshots of one store: uploads, what is missing, and removals (see the module)."""

    def __init__(self, store: Path, projection: IndexProjection) -> None:
        self.store = store
        self.projection = projection
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def start(self) -> None:
        """Remove what a killed service (or client) left below `snapshots/`: assemblies,
        uploads and removals in progress."""
        removed = await asyncio.to_thread(snapshot_store.remove_leftovers, self.store)
        if removed:
            log.warning("removed %d partial snapshots an earlier service left", removed)

    async def missing(self, name: str, files: list[FileEntry]) -> list[str]:
        """The paths whose content the latest snapshot of `name` lacks, of a file list checked
        already (`FileListCheck`)."""
        return await asyncio.to_thread(snapshot_store.lacking, self.store, name, files)

    async def upload(
        self, name: str, scan: Scan, archive: IO[bytes], max_bytes: int, limits: PathLimits
    ) -> SourceProvenance:
        """Write a snapshot from a scan and a tar whose members declare at most `max_bytes`
        (see `snapshot_store.upload`); SnapshotError, UploadTooLarge, MissingContent."""
        async with self._lock(name):
            return await asyncio.to_thread(
                functools.partial(
                    snapshot_store.upload,
                    self.store,
                    name,
                    scan,
                    archive,
                    max_bytes=max_bytes,
                    limits=limits,
                )
            )

    async def referred(self, excluding: Iterable[str] = ()) -> set[str] | None:
        """The snapshots the runs refer to, but those of `excluding`; None when the index
        cannot be read (then nothing is removed)."""
        try:
            by_run = await self.projection.snapshots()
        except INDEX_ERRORS as error:
            log.warning("the snapshots of the runs cannot be read; none is removed: %s", error)
            return None
        for run_id in excluding:
            by_run.pop(run_id, None)
        return {ref for refs in by_run.values() for ref in refs}

    async def of_runs(self, run_ids: Iterable[str]) -> set[str]:
        """The snapshots the runs refer to (none when the index cannot be read)."""
        try:
            by_run = await self.projection.snapshots()
        except INDEX_ERRORS as error:
            log.warning("the snapshots of the runs cannot be read: %s", error)
            return set()
        return {ref for run_id in run_ids for ref in by_run.get(run_id, ())}

    async def unreferred(
        self, candidates: Iterable[str] | None = None, excluding: Iterable[str] = ()
    ) -> tuple[list[str], int]:
        """The snapshots a removal would take (of `candidates`, None: every one of the store)
        once the runs of `excluding` are gone, and the bytes that frees. Nothing is removed."""
        referred = await self.referred(excluding)
        if referred is None:
            return [], 0
        return await asyncio.to_thread(self._choose, candidates, referred)

    def _choose(
        self, candidates: Iterable[str] | None, referred: set[str]
    ) -> tuple[list[str], int]:
        pool = stored_snapshots(self.store) if candidates is None else candidates
        chosen = removable(self.store, pool, referred, time.time())
        return chosen, freed_bytes(self.store / ref for ref in chosen)

    async def remove_unreferred(
        self, candidates: Iterable[str] | None = None
    ) -> tuple[list[str], int]:
        """Remove the snapshots of `candidates` (None: every one of the store) no run refers to
        and written more than `GRACE_S` ago; the ones removed and the bytes freed. Each source
        name is locked against uploads meanwhile."""
        pool = (
            await asyncio.to_thread(stored_snapshots, self.store)
            if candidates is None
            else set(candidates)
        )
        names = sorted({ref.split("/")[1] for ref in pool})
        async with contextlib.AsyncExitStack() as stack:
            for name in names:
                await stack.enter_async_context(self._lock(name))
            referred = await self.referred()
            if referred is None:
                return [], 0
            return await asyncio.to_thread(self._remove, pool, referred)

    def _remove(self, pool: Iterable[str], referred: set[str]) -> tuple[list[str], int]:
        chosen, freed = self._choose(pool, referred)
        removed = []
        for ref in chosen:
            try:
                if remove_snapshot(self.store, ref):
                    removed.append(ref)
            except OSError as error:
                log.warning("snapshot %s was not removed: %s", ref, error)
        return removed, freed
