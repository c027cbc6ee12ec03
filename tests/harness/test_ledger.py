"""The ledger: exclusive claims by file creation, releases, stale workers, restarts, and its
layout on disk (links in shards of 1,000 units)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simrun_api.workers import claims_by_worker
from simrun_harness.ledger import Ledger, LedgerCounts

from .helpers import ledger_entries, ledger_entry, wait_until

HAMMER = Path(__file__).with_name("ledger_hammer.py")


def test_claims_each_unit_once_then_none(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger", 5)
    claimed = [ledger.claim("w0") for _ in range(5)]
    assert sorted(claimed) == [0, 1, 2, 3, 4]
    assert ledger.claim("w0") is None
    assert ledger.counts() == LedgerCounts(pending=0, claimed=5, done=0, total=5)
    assert ledger.claims() == {"w0": [0, 1, 2, 3, 4]}


def test_two_ledger_objects_never_hand_out_one_unit_twice(tmp_path: Path) -> None:
    first, second = Ledger(tmp_path / "l", 6), Ledger(tmp_path / "l", 6)
    got = [first.claim("a"), second.claim("b"), first.claim("a"), second.claim("b")]
    while (index := second.claim("b")) is not None:
        got.append(index)
    assert first.claim("a") is None
    assert sorted(got) == list(range(6))
    assert set(first.claims()["a"]).isdisjoint(second.claims()["b"])


def test_complete_is_idempotent_and_counts(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger", 3)
    index = ledger.claim("w0")
    assert index is not None
    ledger.complete(index, "w0")
    ledger.complete(index, "w1")  # another worker computed it as well
    assert ledger.counts() == LedgerCounts(pending=2, claimed=0, done=1, total=3)
    assert ledger.missing() == sorted(set(range(3)) - {index})
    assert not ledger.complete_ledger()
    for other in ledger.missing():
        ledger.complete(other, "w0")
    assert ledger.complete_ledger()
    assert ledger.claim("w0") is None


def test_size_mismatch_is_refused(tmp_path: Path) -> None:
    Ledger(tmp_path / "ledger", 4)
    Ledger(tmp_path / "ledger", 4)
    with pytest.raises(ValueError, match="has 4 units, but the task has 5"):
        Ledger(tmp_path / "ledger", 5)


def test_invalid_worker_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="worker id"):
        Ledger(tmp_path / "ledger", 1).claim("../w0")


def test_release_makes_a_unit_claimable_at_the_next_epoch(tmp_path: Path) -> None:
    root = tmp_path / "ledger"
    holder, other = Ledger(root, 1), Ledger(root, 1)
    assert holder.claim("w0") == 0
    assert other.claim("w1") is None
    assert holder.release(0, "w0")
    assert not holder.release(0, "w0"), "a second release of the same claim does nothing"
    assert other.claim("w1") is None, "claim lists nothing: the release is not seen yet"
    assert other.refresh()
    assert other.claim("w1") == 0
    assert ledger_entries(root, "claim") == {"0.0": "w0", "0.1": "w1"}
    assert ledger_entries(root, "release") == {"0.0": "w0"}
    assert other.claims() == {"w1": [0]}


def test_release_by_another_worker_is_ignored(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger", 1)
    assert ledger.claim("w0") == 0
    assert not Ledger(tmp_path / "ledger", 1).release(0, "w1")
    assert ledger.claims() == {"w0": [0]}


def test_restarted_worker_releases_its_earlier_claims(tmp_path: Path) -> None:
    root = tmp_path / "ledger"
    earlier = Ledger(root, 4)
    mine = [earlier.claim("w0"), earlier.claim("w0"), earlier.claim("w0")]
    earlier.complete(mine[2], "w0")
    theirs = Ledger(root, 4).claim("w1")
    restarted = Ledger(root, 4)
    assert restarted.release_all("w0") == sorted(mine[:2])
    assert restarted.claims() == {"w1": [theirs]}
    assert sorted([restarted.claim("w0"), restarted.claim("w0")]) == sorted(mine[:2])
    assert restarted.claim("w0") is None


def test_release_stale_uses_heartbeat_mtimes(tmp_path: Path) -> None:
    root = tmp_path / "ledger"
    coordinator, dead, alive = Ledger(root, 4), Ledger(root, 4), Ledger(root, 4)
    for ledger, worker in ((coordinator, "w0"), (dead, "w1"), (alive, "w2")):
        ledger.heartbeat(worker)
    own = coordinator.claim("w0")
    lost = dead.claim("w1")
    kept = alive.claim("w2")
    long_ago = os.stat(root / "heartbeats" / "w1").st_mtime - 1000
    os.utime(root / "heartbeats" / "w1", (long_ago, long_ago))
    os.utime(root / "heartbeats" / "w0", (long_ago, long_ago))  # touched again by the call

    assert coordinator.release_stale(stale_s=100, reference="w0") == [lost]
    assert coordinator.claims() == {"w0": [own], "w2": [kept]}
    index = coordinator.claim("w0")
    if index != lost:  # the cursor may hand out the never-claimed unit first
        index = coordinator.claim("w0")
    assert index == lost
    assert os.readlink(ledger_entry(root, "claim", f"{lost}.1")) == "w0"
    assert os.readlink(ledger_entry(root, "release", f"{lost}.0")) == "w0", "released by w0"


def test_claim_without_heartbeat_is_stale(tmp_path: Path) -> None:
    root = tmp_path / "ledger"
    lost = Ledger(root, 2).claim("ghost")  # never touched a heartbeat
    coordinator = Ledger(root, 2)
    assert coordinator.release_stale(stale_s=100, reference="w0") == [lost]


def test_a_unit_done_after_its_claim_was_released_as_stale_is_not_claimed_again(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ledger"
    slow, coordinator, other = Ledger(root, 2), Ledger(root, 2), Ledger(root, 2)
    index = slow.claim("w1")  # w1 never touched a heartbeat: its claims are stale
    assert index is not None
    assert coordinator.release_stale(stale_s=100, reference="w0") == [index]
    slow.complete(index, "w1")  # it was slow, not dead: its unit is done after all
    assert other.claim("w2") == 1 - index
    assert coordinator.claim("w0") is None  # it saw the release, and then the unit done
    other.refresh()
    assert other.claim("w2") is None
    assert sorted(ledger_entries(root, "claim")) == sorted([f"{index}.0", f"{1 - index}.0"])


def test_a_worker_starting_while_the_coordinator_looks_keeps_its_claims(tmp_path: Path) -> None:
    """The coordinator lists the heartbeats before the claims; a worker whose first heartbeat
    and claim fall in between is not taken for one without a heartbeat (found by the hammer)."""
    root = tmp_path / "ledger"
    coordinator, starting = Ledger(root, 2), Ledger(root, 2)
    listed = coordinator._heartbeats

    def heartbeats_then_the_start() -> dict[str, float]:
        beats = listed()
        starting.heartbeat("w1")
        starting.claim("w1")
        return beats

    coordinator._heartbeats = heartbeats_then_the_start  # type: ignore[method-assign]
    assert coordinator.release_stale(stale_s=100, reference="w0") == []
    assert len(starting.claims()["w1"]) == 1


def test_fresh_claims_survive_release_stale(tmp_path: Path) -> None:
    root = tmp_path / "ledger"
    worker = Ledger(root, 2)
    worker.heartbeat("w1")
    worker.claim("w1")
    assert Ledger(root, 2).release_stale(stale_s=100, reference="w0") == []


@pytest.mark.parametrize("n_units", [300, pytest.param(3000, marks=pytest.mark.slow)])
def test_four_processes_hammering_one_ledger_hold_each_unit_exclusively(
    tmp_path: Path, n_units: int
) -> None:
    root = tmp_path / "ledger"
    (tmp_path / "holders").mkdir()
    (tmp_path / "ready").mkdir()
    names = ("w0", "w1", "w2", "w3")
    workers = [
        subprocess.Popen(
            [sys.executable, str(HAMMER), str(root), str(n_units), worker, f"seed-{worker}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for worker in names
    ]
    wait_until(lambda: len(os.listdir(tmp_path / "ready")) == 4, what="the hammers ready")
    (tmp_path / "go").touch()
    results = {}
    for name, worker in zip(names, workers, strict=True):
        out, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0
        results[name] = json.loads(out)

    for name, result in results.items():
        assert result["violations"] == [], (name, result["violations"])
        assert result["claims"], f"{name} claimed nothing"
    assert sum(len(result["releases"]) for result in results.values()) > 0
    assert sum(result["restarts"] for result in results.values()) > 0
    assert sum(result["stale_checks"] for result in results.values()) > 0

    # every (unit, epoch) was held by exactly one process, and it is the claim on disk
    held = [(i, e, name) for name, r in results.items() for i, e in r["claims"]]
    assert len({(i, e) for i, e, _ in held}) == len(held), "a claim held twice"
    claims = ledger_entries(root, "claim")
    on_disk = {tuple(map(int, n.split("."))): n for n in claims}
    assert set(on_disk) == {(i, e) for i, e, _ in held}
    for index, epoch, name in held:
        assert claims[f"{index}.{epoch}"] == name
    # each unit's epochs run 0..k; all but the last were released, by their holder
    released = [tuple(pair) for result in results.values() for pair in result["releases"]]
    assert len(set(released)) == len(released)
    releases = ledger_entries(root, "release")
    assert {tuple(map(int, n.split("."))) for n in releases} == set(released)
    for index in range(n_units):
        epochs = sorted(e for i, e in on_disk if i == index)
        assert epochs == list(range(len(epochs))), (index, epochs)
        assert {(index, e) for e in epochs[:-1]} <= set(released)
    # every unit was completed exactly once, by the holder of its last claim
    completes = [i for result in results.values() for i in result["completes"]]
    assert sorted(completes) == list(range(n_units))
    holder = {(i, e): name for i, e, name in held}
    done = ledger_entries(root, "done")
    for name, result in results.items():
        for index in result["completes"]:
            last = max(e for i, e in on_disk if i == index)
            assert holder[index, last] == name
            assert done[str(index)] == name
    ledger = Ledger(root, n_units)
    assert ledger.complete_ledger() and ledger.claims() == {}
    assert ledger.counts() == LedgerCounts(pending=0, claimed=0, done=n_units, total=n_units)


def test_entries_are_links_naming_the_worker_in_shards_of_1000_units(tmp_path: Path) -> None:
    root = tmp_path / "ledger"
    ledger = Ledger(root, 2500)
    claimed = {ledger.claim("w0") for _ in range(2500)}
    assert claimed == set(range(2500))
    assert sorted(os.listdir(root / "claim")) == ["0", "1", "2"]
    assert len(os.listdir(root / "claim" / "2")) == 500
    ledger.complete(1234, "w0")
    Ledger(root, 2500).complete(1234, "w1")  # the first completer stays
    assert ledger.release(2001, "w0")
    claim = root / "claim" / "1" / "1234.0"
    assert claim.is_symlink() and os.readlink(claim) == "w0"
    assert os.lstat(claim).st_size == 2, "the worker is the link's target, no data"
    assert not claim.exists(), "the link points nowhere"
    assert os.readlink(root / "done" / "1" / "1234") == "w0"
    assert os.readlink(root / "release" / "2" / "2001.0") == "w0"
    assert os.listdir(root / "done") == ["1"], "a shard is made when an entry needs it"
    counts = ledger.counts()
    assert counts == LedgerCounts(pending=1, claimed=2498, done=1, total=2500)


def test_the_hot_path_lists_each_done_shard_once_and_looks_up_only_units_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims, completions and releases over shard boundaries (shards made lazily): the first
    pass lists each shard of done/ once a ledger object and looks up no unit's entry but for
    a unit whose claim was released, before its next epoch is claimed."""
    root = tmp_path / "ledger"
    first, second = Ledger(root, 3000), Ledger(root, 3000)
    listed: list[str] = []
    looked_up: list[str] = []
    real_listdir, real_lexists = os.listdir, os.path.lexists

    def listdir(path: str) -> list[str]:
        listed.append(str(path))
        return real_listdir(path)

    def lexists(path: str) -> bool:
        looked_up.append(str(path))
        return real_lexists(path)

    def no_scan(*args: object, **kwargs: object) -> None:
        raise AssertionError("a directory was scanned")

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os.path, "lexists", lexists)
    monkeypatch.setattr(os, "scandir", no_scan)
    done: set[int] = set()
    released: set[int] = set()
    claiming = True
    while claiming:
        claiming = False
        for ledger, worker in ((first, "w0"), (second, "w1")):
            index = ledger.claim(worker)
            if index is None:
                continue
            claiming = True
            if index % 7 or index in released:
                ledger.complete(index, worker)
                done.add(index)
            else:  # given back once, and claimed again (at epoch 1) from the queue
                assert ledger.release(index, worker)
                released.add(index)
    monkeypatch.undo()
    assert done == set(range(3000)) and released == set(range(0, 3000, 7))
    shards = [str(root / "done" / str(shard)) for shard in range(3)]
    assert sorted(listed) == sorted(shards * 2)
    done_looked_up = [
        int(Path(path).name) for path in looked_up if path.startswith(str(root / "done"))
    ]
    assert set(done_looked_up) == released  # only units released, at most once an object
    assert len(done_looked_up) <= 2 * len(released)
    assert sorted(os.listdir(root / "release")) == ["0", "1", "2"]
    assert Ledger(root, 3000).complete_ledger()


def test_the_first_pass_skips_units_done_before_it_lists_their_shard(tmp_path: Path) -> None:
    root = tmp_path / "ledger"
    earlier = Ledger(root, 4)
    done = set()
    for _ in range(3):
        index = earlier.claim("w1")
        assert index is not None
        earlier.complete(index, "w1")
        done.add(index)
    (left,) = set(range(4)) - done
    later = Ledger(root, 4)
    assert later.claim("w2") == left
    assert later.claim("w2") is None
    assert sorted(ledger_entries(root, "claim")) == [f"{index}.0" for index in range(4)]


def test_a_unit_done_after_its_shard_was_listed_is_not_claimed(tmp_path: Path) -> None:
    """The listing is stale, but the unit is still held by the claim of the worker that did
    it: the create of the same epoch fails, and no release of it exists."""
    root = tmp_path / "ledger"
    lister, doer = Ledger(root, 2), Ledger(root, 2)
    first = lister.claim("w1")  # lists the shard: nothing is done yet
    assert first is not None
    other = doer.claim("w2")
    assert other == 1 - first
    doer.complete(other, "w2")
    lister.complete(first, "w1")
    assert lister.claim("w1") is None and doer.claim("w2") is None
    assert sorted(ledger_entries(root, "claim")) == ["0.0", "1.0"]


def test_what_is_no_entry_of_its_shard_is_ignored(tmp_path: Path) -> None:
    root = tmp_path / "ledger"
    ledger = Ledger(root, 1500)
    (root / "claim" / "notes").mkdir()
    (root / "claim" / "7.0").touch()  # not in a shard
    (root / "claim" / "1").mkdir()
    os.symlink("w9", root / "claim" / "1" / "7.0")  # in the shard of 1000..1999
    os.symlink("w9", root / "done" / "7")  # not in a shard
    assert ledger.claims() == {} and ledger.counts().done == 0
    assert ledger.claim("w0") is not None


def test_a_claim_naming_no_worker_is_stale_by_its_age(tmp_path: Path) -> None:
    """An entry that is no link naming a worker (written by hand, or by another version) has
    no heartbeat to look at: its own mtime tells whether it is stale."""
    root = tmp_path / "ledger"
    ledger = Ledger(root, 2)
    (root / "claim" / "0").mkdir()
    claim = root / "claim" / "0" / "1.0"
    claim.write_text("")
    assert ledger.claims() == {"?": [1]}
    assert ledger.release_stale(stale_s=100, reference="w0") == []
    long_ago = os.lstat(claim).st_mtime - 1000
    os.utime(claim, (long_ago, long_ago))
    assert Ledger(root, 2).release_stale(stale_s=100, reference="w0") == [1]
    assert ledger.claims() == {}


def test_the_service_reads_the_claims_the_ledger_holds(tmp_path: Path) -> None:
    """`simrun_api.workers.claims_by_worker` (the workers view) reads the same layout."""
    root = tmp_path / "ledger"
    assert claims_by_worker(root) == {}
    first, second = Ledger(root, 2100), Ledger(root, 2100)
    mine = [first.claim("w0") for _ in range(1500)]
    while second.claim("w1") is not None:  # the 600 others
        pass
    for index in mine[:300]:
        first.complete(index, "w0")
    for index in mine[300:350]:
        first.release(index, "w0")
    second.refresh()
    again = [second.claim("w1") for _ in range(20)]  # released ones, at epoch 1
    assert set(again) <= set(mine[300:350])
    assert claims_by_worker(root) == {"w0": 1150, "w1": 620}
    assert {worker: len(units) for worker, units in first.claims().items()} == {
        "w0": 1150,
        "w1": 620,
    }


def test_the_first_pass_does_not_claim_a_unit_done_after_its_stale_release(
    tmp_path: Path,
) -> None:
    """Hypothesis found it: the shard was listed before, the unit's claim was released as
    stale, and its slow worker completed it; the next epoch must not be claimed."""
    root = tmp_path / "ledger"
    lister, slow = Ledger(root, 4), Ledger(root, 4)
    assert lister.claim("w2") is not None  # lists the shard: nothing is done yet
    index = slow.claim("w0")
    assert index is not None
    assert index in Ledger(root, 4).release_stale(stale_s=100, reference="w1")
    slow.complete(index, "w0")
    claimed = []
    while (unit := lister.claim("w2")) is not None:
        claimed.append(unit)
    assert index not in claimed
