"""The ledger under random interleavings of its operations by several workers (hypothesis).

Several `Ledger` objects (one per worker) share one directory. Hypothesis drives claims,
completes, releases (by the holder and by others), stale heartbeats and the release of stale
claims, and restarts (a new object releasing the claims of the worker's earlier incarnation).
The ledgers keep 2 units per shard directory (not 1,000), so the units span two shards. A
model tracks what must be on disk; after every step the files are read directly and checked
against it and against the invariants of the ledger:

- each (unit, epoch) is claimed once, a unit's epochs run 0..k, and every epoch but the last is
  released: a unit is held by at most one live claim;
- a done unit stays done, keeps its first completer, and is never claimed again;
- the counts, `missing`, `claims` and `complete_ledger` of every object agree with the files;
- a claim after a `refresh` finds a unit whenever one is pending.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from simrun_harness.ledger import Ledger, LedgerCounts

from .helpers import ledger_entries

N_UNITS = 4
SHARD_UNITS = 2
WORKERS = ("w0", "w1", "w2")
STALE_S = 100.0


class SmallShards(Ledger):
    """The ledger with shards of `SHARD_UNITS` units."""

    shard_units = SHARD_UNITS


workers = st.sampled_from(WORKERS)
picks = st.integers(min_value=0, max_value=N_UNITS - 1)


class LedgerMachine(RuleBasedStateMachine):
    """Workers on one ledger, and the model of the files they must leave."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="simrun-ledger-machine-"))
        self.root = self.dir / "ledger"
        self.ledgers = {worker: SmallShards(self.root, N_UNITS) for worker in WORKERS}
        self.claimed: dict[tuple[int, int], str] = {}  # (index, epoch) -> the claiming worker
        self.released: set[tuple[int, int]] = set()
        self.done: dict[int, str] = {}  # index -> the first worker to complete it
        self.claims_when_done: dict[int, int] = {}
        self.believed: dict[str, dict[int, int]] = {worker: {} for worker in WORKERS}
        self.stale_beats: dict[str, float] = {}  # worker -> the old mtime it was given
        self.stale_seen: dict[str, set[tuple[str, float]]] = {worker: set() for worker in WORKERS}
        self.scanned: set[str] = set()  # the objects that listed the claims once already
        self.ages = itertools.count()

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the model ----------------------------------------------------------------------

    def live(self, index: int) -> tuple[int, str] | None:
        """The epoch and holder of the unit's claim without a release."""
        for (unit, epoch), owner in self.claimed.items():
            if unit == index and (unit, epoch) not in self.released:
                return epoch, owner
        return None

    def pending(self) -> list[int]:
        return [i for i in range(N_UNITS) if i not in self.done and self.live(i) is None]

    def held(self) -> dict[str, list[int]]:
        held: dict[str, list[int]] = {}
        for index in range(N_UNITS):
            live = self.live(index)
            if live is not None and index not in self.done:
                held.setdefault(live[1], []).append(index)
        return held

    def record_claim(self, worker: str, index: int | None) -> None:
        if index is None:
            return
        assert index not in self.done, f"{worker} claimed unit {index}, which is done"
        holder = self.live(index)
        assert holder is None, f"{worker} claimed unit {index}, held as {holder}"
        epoch = sum(1 for unit, _ in self.claimed if unit == index)
        self.claimed[index, epoch] = worker
        self.believed[worker][index] = epoch

    def heartbeat_path(self, worker: str) -> Path:
        return self.root / "heartbeats" / worker

    # -- the rules ----------------------------------------------------------------------

    @rule(worker=workers)
    def claim(self, worker: str) -> None:
        self.record_claim(worker, self.ledgers[worker].claim(worker))

    @rule(worker=workers, most=st.integers(min_value=2, max_value=N_UNITS))
    def fill(self, worker: str, most: int) -> None:
        """Claim up to `most` units, as a worker filling its pool does."""
        for _ in range(most):
            index = self.ledgers[worker].claim(worker)
            self.record_claim(worker, index)
            if index is None:
                return

    @rule(worker=workers)
    def claim_after_refresh(self, worker: str) -> None:
        ledger = self.ledgers[worker]
        ledger.refresh()
        pending = self.pending()
        index = ledger.claim(worker)
        if index is None:
            assert pending == [], f"{worker} found nothing after a refresh; pending: {pending}"
        self.record_claim(worker, index)

    @rule(worker=workers, pick=picks)
    def complete(self, worker: str, pick: int) -> None:
        believed = sorted(self.believed[worker])
        if not believed:
            return
        index = believed[pick % len(believed)]
        self.ledgers[worker].complete(index, worker)
        del self.believed[worker][index]
        if index not in self.done:
            self.done[index] = worker
            self.claims_when_done[index] = sum(1 for unit, _ in self.claimed if unit == index)

    @rule(worker=workers, pick=picks)
    def complete_a_done_unit_again(self, worker: str, pick: int) -> None:
        done = sorted(self.done)
        if not done:
            return
        index = done[pick % len(done)]
        self.ledgers[worker].complete(index, worker)
        self.believed[worker].pop(index, None)

    @rule(worker=workers, pick=picks)
    def release(self, worker: str, pick: int) -> None:
        believed = sorted(self.believed[worker])
        if not believed:
            return
        index = believed[pick % len(believed)]
        epoch = self.believed[worker].pop(index)
        expected = (index, epoch) not in self.released  # not released as stale meanwhile
        assert self.ledgers[worker].release(index, worker) is expected
        self.released.add((index, epoch))

    @rule(worker=workers, index=picks)
    def release_by_another(self, worker: str, index: int) -> None:
        live = self.live(index)
        if index in self.believed[worker] or (live is not None and live[1] == worker):
            return
        assert self.ledgers[worker].release(index, worker) is False

    @rule(worker=workers)
    def restart(self, worker: str) -> None:
        expected = sorted(self.held().get(worker, []))
        self.ledgers[worker] = SmallShards(self.root, N_UNITS)
        assert self.ledgers[worker].release_all(worker) == expected
        for index in expected:
            self.released.add((index, self.live(index)[0]))  # type: ignore[index]
        self.believed[worker] = {}
        self.stale_seen[worker] = set()
        self.scanned.discard(worker)

    @rule(worker=workers)
    def beat(self, worker: str) -> None:
        self.ledgers[worker].heartbeat(worker)
        self.stale_beats.pop(worker, None)

    @rule(worker=workers)
    def go_stale(self, worker: str) -> None:
        path = self.heartbeat_path(worker)
        path.touch()
        old = path.stat().st_mtime - 1000 - next(self.ages)
        os.utime(path, (old, old))
        self.stale_beats[worker] = os.stat(path).st_mtime

    def expected_stale(self, reference: str) -> list[int]:
        beats = set(os.listdir(self.root / "heartbeats"))
        stale = []
        for owner, indices in self.held().items():
            if owner != reference and (owner not in beats or owner in self.stale_beats):
                stale.extend(indices)
        return sorted(stale)

    def released_as_stale(self, released: list[int], expected: list[int]) -> None:
        assert set(released) <= set(expected), (released, expected)
        for index in released:
            self.released.add((index, self.live(index)[0]))  # type: ignore[index]

    @rule(reference=workers)
    def release_stale(self, reference: str) -> None:
        """The coordinator's periodic look: exact when it lists the claims, which it does on
        its first look and whenever a worker became stale that it did not see stale before."""
        self.stale_beats.pop(reference, None)  # its heartbeat is touched by the call
        expected = self.expected_stale(reference)
        stale = {(w, beat) for w, beat in self.stale_beats.items() if w != reference}
        lists = reference not in self.scanned or not stale <= self.stale_seen[reference]
        released = self.ledgers[reference].release_stale(STALE_S, reference)
        if lists:
            assert released == expected
        else:
            assert released == []
        self.scanned.add(reference)
        self.stale_seen[reference] |= stale
        self.released_as_stale(released, expected)

    @rule(reference=workers)
    def release_stale_by_a_new_coordinator(self, reference: str) -> None:
        self.stale_beats.pop(reference, None)
        expected = self.expected_stale(reference)
        released = SmallShards(self.root, N_UNITS).release_stale(STALE_S, reference)
        assert released == expected
        self.released_as_stale(released, expected)

    # -- the invariants -------------------------------------------------------------------

    @invariant()
    def files_match_the_model(self) -> None:
        claims = {_pair(name): owner for name, owner in _ls(self, "claim").items()}
        assert claims == self.claimed
        releases = {_pair(name) for name in _ls(self, "release")}
        assert releases == self.released
        done = {int(name): worker for name, worker in _ls(self, "done").items()}
        assert done == self.done

    @invariant()
    def a_unit_is_held_by_at_most_one_live_claim(self) -> None:
        claims = {_pair(name) for name in _ls(self, "claim")}
        releases = {_pair(name) for name in _ls(self, "release")}
        assert releases <= claims, "a release without its claim"
        for index in range(N_UNITS):
            epochs = sorted(epoch for unit, epoch in claims if unit == index)
            assert epochs == list(range(len(epochs))), f"unit {index} skipped epochs: {epochs}"
            live = [epoch for epoch in epochs if (index, epoch) not in releases]
            assert live in ([], epochs[-1:]), f"unit {index}: live claims {live} of {epochs}"

    @invariant()
    def done_units_are_never_claimed_again(self) -> None:
        for index, claims in self.claims_when_done.items():
            assert sum(1 for unit, _ in self.claimed if unit == index) == claims
            assert str(index) in _ls(self, "done")

    def check_reads(self, ledger: Ledger) -> None:
        """The counts, `missing`, `claims` and `complete_ledger` of an object agree with the
        model. (Reading fills the object's memory of done units, so the worker objects read
        in a rule of their own, not after every step, lest it hide a claim of a done unit.)"""
        held = self.held()
        claimed = sum(len(indices) for indices in held.values())
        counts = LedgerCounts(
            pending=N_UNITS - len(self.done) - claimed,
            claimed=claimed,
            done=len(self.done),
            total=N_UNITS,
        )
        assert ledger.counts() == counts
        assert ledger.missing() == sorted(set(range(N_UNITS)) - set(self.done))
        assert ledger.claims() == held
        assert ledger.complete_ledger() is (len(self.done) == N_UNITS)

    @rule(worker=workers)
    def read_the_state(self, worker: str) -> None:
        self.check_reads(self.ledgers[worker])

    @invariant()
    def a_new_object_reads_the_state_of_the_model(self) -> None:
        self.check_reads(SmallShards(self.root, N_UNITS))


def _ls(machine: LedgerMachine, directory: str) -> dict[str, str]:
    """The entries of a directory of the ledger (across its shards), with the worker each names."""
    return ledger_entries(machine.root, directory, SHARD_UNITS)


def _pair(name: str) -> tuple[int, int]:
    index, epoch = name.split(".")
    return int(index), int(epoch)


LedgerMachine.TestCase.settings = settings(
    max_examples=50, stateful_step_count=30, deadline=None, database=None
)
TestLedgerMachine = LedgerMachine.TestCase


@pytest.mark.slow
class TestLedgerMachineLonger(LedgerMachine.TestCase):  # type: ignore[name-defined]
    """More and longer interleavings, which find the rarer paths (a slow worker completing a
    unit after its claim was released as stale) without the targeted tests' help."""

    settings = settings(max_examples=300, stateful_step_count=50, deadline=None, database=None)
