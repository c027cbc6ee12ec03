"""The unit ledger of a split task: exclusive creates of immutable entries, never a rename.

The ledger of a task is the directory `<task_dir>/ledger/` (its names and paths are defined in
`simrun_core.ledger_layout`, which the service reads it with):

- `size`: the number of units, created once (exclusively) by the first worker.
- `claim/<shard>/<index>.<epoch>`: a claim of a unit, created exclusively; it names the worker
  that holds it.
- `release/<shard>/<index>.<epoch>`: the release of that claim, created exclusively as well and
  naming the worker that released it; the next claim of the unit takes `epoch + 1`, and only
  once this entry exists.
- `done/<shard>/<index>`: the unit is computed, naming the worker that completed it first; any
  worker may create it (unit outputs are deterministic), so creating it twice is harmless.
- `heartbeats/<worker>`: a file touched by each worker; its mtime is set by the file server, so
  heartbeats of workers on different servers compare without their clocks.

`<shard>` is `index // 1000` (`SHARD_UNITS`): a directory holds the entries of 1,000 units at
most, whatever the size of the ledger. A create in a directory of 10^5 entries costs more than
in a small one (a deeper index to search and to update), and creates in one directory are
serialised by its lock (on NFS the directory is the server's hot spot as well), so workers on
different parts of the ledger would contend for nothing. Shard directories are created lazily,
the first time a `Ledger` object creates an entry in one (`mkdir`, an existing one is fine);
the object remembers which exist, so the hot path makes one create per entry.

Each per-unit entry is a symbolic link whose target is the worker id, never followed (it points
nowhere): `symlink(2)` fails with EEXIST when the name exists, so it is an exclusive create like
`O_CREAT|O_EXCL` (atomic on a local file system and on NFS v4.1), in one system call, and it
writes no data: on ext4 a target below 60 bytes is kept in the inode (a "fast" symlink), where a
regular file naming its worker costs a 4 KiB data block (written, and discarded when the run is
removed). The worker cannot be put in the entry's name instead: two workers would then create
two names for one epoch and both hold the unit. Read the worker with `os.readlink`; test for an
entry with `os.lstat` (`os.path.lexists`), not `exists`, which follows the link.

Entries are only created while the task lives, so every worker on every host sees the same
history. The invariant is exclusivity: a unit is held by at most one live claim (a claim of
epoch `e` without a release of epoch `e`), because a claim of `e + 1` is only attempted once
the release of `e` exists, and each epoch can be claimed once.

A `Ledger` object keeps a little memory to make claims cheap: a cursor over the indices (a
first pass, from an offset of its own per worker so workers spread), the next epoch to try per
unit, a queue of units seen released, and the shard directories it knows exist. The first pass
lists a shard of `done/` once, when it first comes to a unit of that shard, instead of looking
up each unit's entry (a unit done since by another worker is still held by that worker's
claim, so the stale list costs nothing but a failed create); a unit whose claim was released
is looked up in `done/` before its next epoch is claimed (a slow worker may have completed it
after its claim was released as stale). `refresh` (and `release_stale`, which calls it) lists
`release/` to find units that other workers gave back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import zlib
from pathlib import Path

from simrun_core import ledger_layout as layout
from simrun_core.ledger_layout import SHARD_UNITS, WORKER_ID

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

    shard_units = SHARD_UNITS  # the units of a shard directory (a test makes them fewer)

    def __init__(self, root: Path, n_units: int) -> None:
        if n_units < 0:
            raise ValueError(f"ledger {root}: the number of units is negative ({n_units})")
        self.root = root
        self.n_units = n_units
        self.claim_dir = root / layout.CLAIM
        self.release_dir = root / layout.RELEASE
        self.done_dir = root / layout.DONE
        self.heartbeat_dir = root / layout.HEARTBEATS
        for directory in (self.claim_dir, self.release_dir, self.done_dir, self.heartbeat_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self._check_size()
        self._claims, self._releases, self._dones = (
            str(directory) for directory in (self.claim_dir, self.release_dir, self.done_dir)
        )
        self._shards: set[str] = set()  # the shard directories known to exist
        self._listed_done: set[int] = set()  # the shards of done/ listed by the first pass
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
        path = self.root / layout.SIZE
        if _create_exclusive(path, f"{self.n_units}\n"):
            return
        recorded = _read_size(path)
        if recorded != self.n_units:
            raise ValueError(
                f"ledger {self.root} has {recorded} units, but the task has {self.n_units}"
            )

    # -- the entries ----------------------------------------------------------------------

    def _create(self, directory: str, index: int, name: str, worker: str) -> bool:
        """Create the entry `name` of unit `index` naming `worker` unless it exists; whether
        this call created it. Its shard directory is made the first time this object needs it."""
        shard = f"{directory}/{layout.shard(index, self.shard_units)}"
        if shard not in self._shards:
            with contextlib.suppress(FileExistsError):
                os.mkdir(shard)
            self._shards.add(shard)
        try:
            os.symlink(worker, f"{shard}/{name}")
        except FileExistsError:
            return False
        return True

    def _path(self, directory: str, index: int, name: str) -> str:
        return f"{directory}/{layout.shard(index, self.shard_units)}/{name}"

    def _exists(self, directory: str, index: int, name: str) -> bool:
        """Whether the entry exists (`lexists`: the link itself, never its target)."""
        return os.path.lexists(self._path(directory, index, name))

    # -- claiming -------------------------------------------------------------------------

    def claim(self, worker: str) -> int | None:
        """Claim a pending unit for `worker`; None when none is pending as far as this object knows.

        The first pass walks a cursor over all indices (each visited once, from an offset of
        the worker), listing each shard of `done/` once; after it, only units seen released
        (`refresh`, `release_stale`, `release`) are tried. A claim therefore costs O(1)
        amortised.
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
            shard = layout.shard(index, self.shard_units)
            if shard not in self._listed_done:
                self._list_done(shard)
            if self._try_claim(index, worker):
                return index
        while self._requeue:
            index = min(self._requeue)
            self._requeue.discard(index)
            if self._try_claim(index, worker):
                return index
        return None

    def _list_done(self, shard: int) -> None:
        """Learn the units done of one shard of `done/` (none when it does not exist yet)."""
        self._listed_done.add(shard)
        try:
            names = os.listdir(f"{self._dones}/{shard}")
        except FileNotFoundError:
            return
        self._learn_done(shard, names)

    def _learn_done(self, shard: int, names: list[str]) -> None:
        """Add the units of the `done/` entries `names` of one shard to those known done."""
        for name in names:
            entry = layout.parse_entry(name)
            if entry is None or entry[1] is not None:
                continue
            index = entry[0]
            if layout.shard(index, self.shard_units) == shard and index < self.n_units:
                self._done.add(index)

    def _try_claim(self, index: int, worker: str) -> bool:
        if index in self._done:
            return False
        epoch = self._next_epoch.get(index, 0)
        while True:
            name = layout.epoch_name(index, epoch)
            if self._create(self._claims, index, name, worker):
                self._next_epoch[index] = epoch
                self._held[index] = epoch
                self._owners[name] = worker
                return True
            if not self._exists(self._releases, index, name):
                self._next_epoch[index] = epoch
                return False
            if self._exists(self._dones, index, str(index)):  # done after its release
                self._done.add(index)
                return False
            epoch += 1

    def refresh(self) -> bool:
        """List `release/` for units released since the last look; whether any is claimable now."""
        found = False
        for name, index, _ in _entries(self._releases, self.shard_units):
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
        check_worker_id(worker)
        self._create(self._dones, index, str(index), worker)
        self._done.add(index)
        self._held.pop(index, None)
        self._requeue.discard(index)

    def release(self, index: int, worker: str) -> bool:
        """Give back the claim `worker` holds on a unit; whether this call released it."""
        self._check_index(index)
        check_worker_id(worker)
        epoch = self._held.pop(index, None)
        if epoch is None:
            epoch = self._live_epoch(index)
            if epoch is None or self._owner(index, epoch) != worker:
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
            if index not in done and self._owner(index, epoch) == worker:
                self._held.pop(index, None)
                if self._release(index, epoch, worker):
                    released.append(index)
        return sorted(released)

    def release_stale(self, stale_s: float, reference: str) -> list[int]:
        """Release the claims of workers whose heartbeat is older than `stale_s`.

        The heartbeat of `reference` (the coordinator) is touched and its mtime is "now"; a
        claim of another worker without a heartbeat, or with one older than `now - stale_s`,
        is released (a claim that names no worker, by its age). The claims of `reference` are
        never released. Lists `release/` every call (see `refresh`); lists `claim/` and
        `done/` only when a worker became stale or `stale_s` passed since the last such scan.
        Returns the indices released, sorted.
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
            owner = self._owner(index, epoch)
            if owner == reference:
                continue
            if owner is None:
                created = _mtime(self._path(self._claims, index, layout.epoch_name(index, epoch)))
                is_stale = created is not None and created < oldest
            else:
                beat = beats.get(owner)
                if beat is None or beat < oldest:
                    # Heartbeats were listed before the claims: a worker that started (or beat)
                    # in between must not lose its fresh claims, so look at its heartbeat again.
                    beat = _mtime(str(self.heartbeat_dir / owner))
                is_stale = beat is None or beat < oldest
            if is_stale and self._release(index, epoch, reference):
                released.append(index)
        return sorted(released)

    def _release(self, index: int, epoch: int, by: str) -> bool:
        name = layout.epoch_name(index, epoch)
        self._seen_releases.add(name)
        if index not in self._done:
            self._requeue.add(index)
        return self._create(self._releases, index, name, by)

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
                owner = self._owner(index, epoch) or "?"
                held.setdefault(owner, []).append(index)
        return held

    def _done_indices(self) -> set[int]:
        for shard, names in _shards(self._dones):
            self._learn_done(shard, names)
        return set(self._done)

    def _live_claims(self) -> dict[int, int]:
        """The epoch of the live claim per unit: claimed and not released."""
        released = {name for name, _, _ in _entries(self._releases, self.shard_units)}
        live: dict[int, int] = {}
        for name, index, epoch in _entries(self._claims, self.shard_units):
            if name not in released and index < self.n_units:
                live[index] = max(epoch, live.get(index, epoch))
        return live

    def _live_epoch(self, index: int) -> int | None:
        epoch = 0
        while self._exists(self._claims, index, layout.epoch_name(index, epoch)):
            if not self._exists(self._releases, index, layout.epoch_name(index, epoch)):
                return epoch
            epoch += 1
        return None

    def _owner(self, index: int, epoch: int) -> str | None:
        """The worker a claim names (claims are immutable, so it is cached)."""
        name = layout.epoch_name(index, epoch)
        owner = self._owners.get(name)
        if owner is None:
            owner = _target(self._path(self._claims, index, name))
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


def _shards(directory: str) -> list[tuple[int, list[str]]]:
    """The shard directories of a directory of entries as (shard, names of its entries);
    anything else in it (or a shard that is a link) is left alone."""
    shards = []
    with os.scandir(directory) as entries:
        found = [
            entry
            for entry in entries
            if entry.name.isdigit() and entry.is_dir(follow_symlinks=False)
        ]
    for entry in found:
        with contextlib.suppress(FileNotFoundError):
            shards.append((int(entry.name), os.listdir(entry.path)))
    return shards


def _entries(directory: str, shard_units: int) -> list[tuple[str, int, int]]:
    """The `<index>.<epoch>` entries of a directory (in their shards) as (name, index, epoch);
    an entry outside the shard of its index is none (the ledger would never look it up)."""
    entries = []
    for shard, names in _shards(directory):
        for name in names:
            entry = layout.parse_entry(name)
            if entry is None or entry[1] is None:
                continue
            index, epoch = entry
            if layout.shard(index, shard_units) == shard:
                entries.append((name, index, epoch))
    return entries


def _target(path: str) -> str | None:
    """The worker an entry names (the target of its link), None when it names none."""
    try:
        target = os.readlink(path)
    except OSError:  # none, or not a link
        return None
    return target if WORKER_ID.fullmatch(target) else None


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


def _mtime(path: str) -> float | None:
    """The mtime of a file or entry (a link itself, not followed), None when it does not exist."""
    try:
        return os.lstat(path).st_mtime
    except FileNotFoundError:
        return None
