"""The unit ledger of a split task: exclusive creates of immutable files, never a rename.

The ledger of a task is the directory `<task_dir>/ledger/`:

- `size`: the number of units, created once (exclusively) by the first worker.
- `claim/<index>.<epoch>`: a claim of a unit, created exclusively (`O_CREAT|O_EXCL`, atomic on a
  local file system and on NFS v4.1); the file names the worker that holds it.
- `release/<index>.<epoch>`: the release of that claim, created exclusively as well; the next
  claim of the unit takes `epoch + 1`, and only once this file exists.
- `done/<index>`: the unit is computed; any worker may create it (unit outputs are
  deterministic), so creating it twice is harmless.
- `heartbeats/<worker>`: touched by each worker; its mtime is set by the file server, so
  heartbeats of workers on different servers compare without their clocks.

Files are only created while the task lives, so every worker on every host sees the same
history. The invariant is exclusivity: a unit is held by at most one live claim (a claim of
epoch `e` without a release of epoch `e`), because a claim of `e + 1` is only attempted once
the release of `e` exists, and each epoch can be claimed once.

A `Ledger` object keeps a little memory to make claims cheap: a cursor over the indices (a
first pass, from an offset of its own per worker so workers spread), the next epoch to try per
unit, and a queue of units seen released. `claim` never lists a directory; `refresh` (and
`release_stale`, which calls it) lists `release/` to find units that other workers gave back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
import zlib
from pathlib import Path

WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_CLAIM_NAME = re.compile(r"^(\d+)\.(\d+)$")
_SIZE_WAIT_S = 10.0


def check_worker_id(worker: str) -> str:
    """The worker id, or ValueError when it cannot name a file of the ledger."""
    if not WORKER_ID.fullmatch(worker):
        raise ValueError(
            f"worker id {worker!r} is invalid: use letters, digits, '_', '.' and '-' "
            "(at most 128, starting with a letter or digit)"
        )
    return worker


@dataclasses.dataclass(frozen=True)
class LedgerCounts:
    """The number of units per state: pending (free), claimed (held, not done), done."""

    pending: int
    claimed: int
    done: int
    total: int


@dataclasses.dataclass
class _Cursor:
    position: int
    remaining: int


class Ledger:
    """The ledger of a split task of `n_units` units below `root` (see the module).

    Raises ValueError when the ledger exists with another number of units.
    """

    def __init__(self, root: Path, n_units: int) -> None:
        if n_units < 0:
            raise ValueError(f"ledger {root}: the number of units is negative ({n_units})")
        self.root = root
        self.n_units = n_units
        self.claim_dir = root / "claim"
        self.release_dir = root / "release"
        self.done_dir = root / "done"
        self.heartbeat_dir = root / "heartbeats"
        for directory in (self.claim_dir, self.release_dir, self.done_dir, self.heartbeat_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._check_size()
        self._cursors: dict[str, _Cursor] = {}
        self._next_epoch: dict[int, int] = {}
        self._held: dict[int, int] = {}
        self._done: set[int] = set()
        self._requeue: set[int] = set()
        self._seen_releases: set[str] = set()
        self._owners: dict[str, str] = {}
        self._last_scan: float | None = None
        self._stale_seen: set[tuple[str, float]] = set()

    # -- the size -------------------------------------------------------------------------

    def _check_size(self) -> None:
        path = self.root / "size"
        if _create_exclusive(path, f"{self.n_units}\n"):
            return
        recorded = _read_size(path)
        if recorded != self.n_units:
            raise ValueError(
                f"ledger {self.root} has {recorded} units, but the task has {self.n_units}"
            )

    # -- claiming -------------------------------------------------------------------------

    def claim(self, worker: str) -> int | None:
        """Claim a pending unit for `worker`; None when none is pending as far as this object knows.

        The first pass walks a cursor over all indices (each visited once, from an offset of
        the worker); after it, only units seen released (`refresh`, `release_stale`,
        `release`) are tried. A claim therefore costs O(1) amortised and lists no directory.
        """
        check_worker_id(worker)
        cursor = self._cursors.get(worker)
        if cursor is None:
            start = zlib.crc32(worker.encode()) % self.n_units if self.n_units else 0
            cursor = self._cursors[worker] = _Cursor(start, self.n_units)
        while cursor.remaining > 0:
            index = cursor.position
            cursor.position = (cursor.position + 1) % self.n_units
            cursor.remaining -= 1
            if self._try_claim(index, worker):
                return index
        while self._requeue:
            index = min(self._requeue)
            self._requeue.discard(index)
            if self._try_claim(index, worker):
                return index
        return None

    def _try_claim(self, index: int, worker: str) -> bool:
        if index in self._done:
            return False
        if (self.done_dir / str(index)).exists():
            self._done.add(index)
            return False
        epoch = self._next_epoch.get(index, 0)
        while True:
            name = f"{index}.{epoch}"
            if _create_exclusive(self.claim_dir / name, f"{worker}\n"):
                self._next_epoch[index] = epoch
                self._held[index] = epoch
                self._owners[name] = worker
                return True
            if not (self.release_dir / name).exists():
                self._next_epoch[index] = epoch
                return False
            epoch += 1

    def refresh(self) -> bool:
        """List `release/` for units released since the last look; whether any is claimable now."""
        found = False
        for name, index, _ in _entries(self.release_dir):
            if name in self._seen_releases:
                continue
            self._seen_releases.add(name)
            if index < self.n_units and index not in self._done:
                self._requeue.add(index)
                found = True
        return found

    # -- completing and releasing -----------------------------------------------------------

    def complete(self, index: int, worker: str) -> None:
        """Mark a unit done (idempotent: any worker may complete any unit)."""
        self._check_index(index)
        _create_exclusive(self.done_dir / str(index), f"{worker}\n")
        self._done.add(index)
        self._held.pop(index, None)
        self._requeue.discard(index)

    def release(self, index: int, worker: str) -> bool:
        """Give back the claim `worker` holds on a unit; whether this call released it."""
        self._check_index(index)
        epoch = self._held.pop(index, None)
        if epoch is None:
            epoch = self._live_epoch(index)
            if epoch is None or self._owner(f"{index}.{epoch}") != worker:
                return False
        return self._release(index, epoch, worker)

    def release_all(self, worker: str) -> list[int]:
        """Release every unit `worker` holds and has not done, as a restarted worker does first.

        Returns the indices released, sorted.
        """
        check_worker_id(worker)
        done = self._done_indices()
        released = []
        for index, epoch in self._live_claims().items():
            if index not in done and self._owner(f"{index}.{epoch}") == worker:
                self._held.pop(index, None)
                if self._release(index, epoch, worker):
                    released.append(index)
        return sorted(released)

    def release_stale(self, stale_s: float, reference: str) -> list[int]:
        """Release the claims of workers whose heartbeat is older than `stale_s`.

        The heartbeat of `reference` (the coordinator) is touched and its mtime is "now"; a
        claim of another worker without a heartbeat, or with one older than `now - stale_s`,
        is released (a claim whose file names no worker, by the age of the file). The claims
        of `reference` are never released. Lists `release/` every call (see `refresh`); lists
        `claim/` and `done/` only when a worker became stale or `stale_s` passed since the
        last such scan. Returns the indices released, sorted.
        """
        now = self.heartbeat(reference)
        self.refresh()
        beats = self._heartbeats()
        oldest = now - stale_s
        stale = {(w, beat) for w, beat in beats.items() if beat < oldest and w != reference}
        due = self._last_scan is None or time.monotonic() - self._last_scan >= stale_s
        if not due and stale <= self._stale_seen:
            return []
        self._last_scan = time.monotonic()
        self._stale_seen |= stale
        done = self._done_indices()
        released = []
        for index, epoch in self._live_claims().items():
            if index in done:
                continue
            name = f"{index}.{epoch}"
            owner = self._owner(name)
            if owner == reference:
                continue
            if owner is None:
                created = _mtime(self.claim_dir / name)
                is_stale = created is not None and created < oldest
            else:
                beat = beats.get(owner)
                if beat is None or beat < oldest:
                    # Heartbeats were listed before the claims: a worker that started (or beat)
                    # in between must not lose its fresh claims, so look at its heartbeat again.
                    beat = _mtime(self.heartbeat_dir / owner)
                is_stale = beat is None or beat < oldest
            if is_stale and self._release(index, epoch, reference):
                released.append(index)
        return sorted(released)

    def _release(self, index: int, epoch: int, by: str) -> bool:
        name = f"{index}.{epoch}"
        self._seen_releases.add(name)
        if index not in self._done:
            self._requeue.add(index)
        return _create_exclusive(self.release_dir / name, f"{by}\n")

    # -- heartbeats -----------------------------------------------------------------------

    def heartbeat(self, worker: str) -> float:
        """Touch the heartbeat of `worker`; its new mtime, set by the file (server) clock.

        Raises OSError when the file cannot be touched.
        """
        check_worker_id(worker)
        path = self.heartbeat_dir / worker
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        os.utime(path)
        return os.stat(path).st_mtime

    def _heartbeats(self) -> dict[str, float]:
        beats = {}
        for entry in os.scandir(self.heartbeat_dir):
            with contextlib.suppress(FileNotFoundError):
                beats[entry.name] = entry.stat().st_mtime
        return beats

    # -- reading the state ------------------------------------------------------------------

    def missing(self) -> list[int]:
        """The units not done, sorted."""
        done = self._done_indices()
        return [index for index in range(self.n_units) if index not in done]

    def complete_ledger(self) -> bool:
        """Whether every unit is done."""
        if len(self._done) >= self.n_units:
            return True
        return len(self._done_indices()) >= self.n_units

    def counts(self) -> LedgerCounts:
        """The number of units per state."""
        done = self._done_indices()
        claimed = len(set(self._live_claims()) - done)
        return LedgerCounts(
            pending=self.n_units - len(done) - claimed,
            claimed=claimed,
            done=len(done),
            total=self.n_units,
        )

    def claims(self) -> dict[str, list[int]]:
        """The units held and not done, by worker id (`?` for a claim naming none), sorted."""
        done = self._done_indices()
        held: dict[str, list[int]] = {}
        for index, epoch in sorted(self._live_claims().items()):
            if index not in done:
                owner = self._owner(f"{index}.{epoch}") or "?"
                held.setdefault(owner, []).append(index)
        return held

    def _done_indices(self) -> set[int]:
        for entry in os.listdir(self.done_dir):
            if entry.isdigit() and int(entry) < self.n_units:
                self._done.add(int(entry))
        return set(self._done)

    def _live_claims(self) -> dict[int, int]:
        """The epoch of the live claim per unit: claimed and not released."""
        released = {name for name, _, _ in _entries(self.release_dir)}
        live: dict[int, int] = {}
        for name, index, epoch in _entries(self.claim_dir):
            if name not in released and index < self.n_units:
                live[index] = max(epoch, live.get(index, epoch))
        return live

    def _live_epoch(self, index: int) -> int | None:
        epoch = 0
        while (self.claim_dir / f"{index}.{epoch}").exists():
            if not (self.release_dir / f"{index}.{epoch}").exists():
                return epoch
            epoch += 1
        return None

    def _owner(self, name: str) -> str | None:
        """The worker a claim names (claim files are immutable, so it is cached)."""
        owner = self._owners.get(name)
        if owner is None:
            try:
                owner = (self.claim_dir / name).read_text().strip() or None
            except FileNotFoundError:
                owner = None
            if owner is not None:
                self._owners[name] = owner
        return owner

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.n_units:
            raise ValueError(f"ledger {self.root}: unit {index} is not in 0..{self.n_units - 1}")


def _create_exclusive(path: Path, text: str) -> bool:
    """Create a file with `text` unless it exists; whether this call created it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    return True


def _entries(directory: Path) -> list[tuple[str, int, int]]:
    """The `<index>.<epoch>` files of a directory as (name, index, epoch)."""
    entries = []
    for name in os.listdir(directory):
        match = _CLAIM_NAME.match(name)
        if match:
            entries.append((name, int(match[1]), int(match[2])))
    return entries


def _read_size(path: Path) -> int:
    """The size another worker wrote, waiting briefly for a size being written."""
    deadline = time.monotonic() + _SIZE_WAIT_S
    while True:
        text = path.read_text()
        if text.endswith("\n"):
            try:
                return int(text)
            except ValueError:
                raise ValueError(f"{path}: {text.strip()!r} is no number of units") from None
        if time.monotonic() > deadline:
            raise ValueError(f"{path}: the number of units was never written ({text!r})")
        time.sleep(0.01)


def _mtime(path: Path) -> float | None:
    """The mtime of a file, None when it does not exist."""
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return None
