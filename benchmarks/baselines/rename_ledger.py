"""The reference's ledger of renames (spec/24-simrun.ledger.md), for comparison only.

A directory with `pending/<i>`, `claimed/<worker>@<i>` and `done/<i>`; workers touch
`heartbeats/<worker>`. Every transition is one `os.rename`, atomic on a local file system and
on NFS v4, so a unit is held by at most one worker. A claim takes the lowest pending unit: it
lists `pending/` and renames the smallest index into `claimed/`; a rename that answers ENOENT
lost the race to another worker (or, on NFS, was a resent rename that happened already, which
the claim recognises by its target) and the claim lists again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class LedgerCounts:
    """The number of units per state."""

    pending: int
    claimed: int
    done: int
    total: int


class Ledger:
    """The ledger of `n_units` units below `root`, created (atomically) when it does not exist."""

    def __init__(self, root: Path, n_units: int) -> None:
        self.root = root
        self.n_units = n_units
        self.pending = root / "pending"
        self.claimed = root / "claimed"
        self.done = root / "done"
        self.heartbeats = root / "heartbeats"
        if not root.exists():
            self._create()

    def _create(self) -> None:
        """Build the ledger in a temporary directory beside it and rename it into place; a
        ledger another worker created first wins."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(dir=self.root.parent, prefix=f".{self.root.name}."))
        try:
            for name in ("pending", "claimed", "done"):
                (building / name).mkdir()
            for index in range(self.n_units):
                (building / "pending" / str(index)).touch()
            os.rename(building, self.root)
        except OSError:
            if not self.root.is_dir():
                raise
        finally:
            shutil.rmtree(building, ignore_errors=True)

    def claim(self, worker: str) -> int | None:
        """Claim the lowest pending unit, or return None when none is pending."""
        while True:
            names = os.listdir(self.pending)
            if not names:
                return None
            index = min(int(name) for name in names)
            target = self.claimed / f"{worker}@{index}"
            try:
                os.rename(self.pending / str(index), target)
            except FileNotFoundError:
                if target.exists():  # a resent rename (NFS) that happened already
                    return index
                continue  # another worker took it: list again
            return index

    def complete(self, index: int, worker: str) -> None:
        """Mark a unit claimed by `worker` as done."""
        os.rename(self.claimed / f"{worker}@{index}", self.done / str(index))

    def release(self, index: int, worker: str) -> None:
        """Return a unit claimed by `worker` to pending."""
        os.rename(self.claimed / f"{worker}@{index}", self.pending / str(index))

    def claims(self) -> dict[str, list[int]]:
        """The claimed units by worker id, the indices sorted."""
        held: dict[str, list[int]] = {}
        for name in os.listdir(self.claimed):
            worker, _, index = name.rpartition("@")
            held.setdefault(worker, []).append(int(index))
        return {worker: sorted(indices) for worker, indices in sorted(held.items())}

    def complete_ledger(self) -> bool:
        """Whether every unit is done."""
        return len(os.listdir(self.done)) >= self.n_units

    def counts(self) -> LedgerCounts:
        """The number of units per state."""
        return LedgerCounts(
            pending=len(os.listdir(self.pending)),
            claimed=len(os.listdir(self.claimed)),
            done=len(os.listdir(self.done)),
            total=self.n_units,
        )

    def heartbeat(self, worker: str) -> float:
        """Touch the heartbeat of `worker` (its directory created lazily); its mtime, set by the
        file server. Raises OSError when the time was not set."""
        self.heartbeats.mkdir(exist_ok=True)
        path = self.heartbeats / worker
        path.touch()
        os.utime(path)
        return path.stat().st_mtime

    def missing(self) -> list[int]:
        """The units not done, sorted."""
        done = {int(name) for name in os.listdir(self.done)}
        return [index for index in range(self.n_units) if index not in done]

    def release_all(self, worker: str) -> list[int]:
        """Free every unit claimed by `worker`, as a restarted worker does; the indices, sorted."""
        released = []
        for index in self.claims().get(worker, []):
            with contextlib.suppress(FileNotFoundError):
                self.release(index, worker)
                released.append(index)
        return sorted(released)

    def release_stale(self, stale_s: float, reference: str) -> list[int]:
        """Return the claims of workers without a recent heartbeat to pending.

        The heartbeat of `reference` is touched and its time is "now"; a claim of another
        worker with no heartbeat or one older than `now - stale_s` is released. The claims of
        `reference` are never released. Returns the indices released, sorted.
        """
        now = self.heartbeat(reference)
        released = []
        for worker, indices in self.claims().items():
            if worker == reference:
                continue
            try:
                beat: float | None = (self.heartbeats / worker).stat().st_mtime
            except FileNotFoundError:
                beat = None
            if beat is not None and beat >= now - stale_s:
                continue
            for index in indices:
                with contextlib.suppress(FileNotFoundError):
                    self.release(index, worker)
                    released.append(index)
        return sorted(released)
