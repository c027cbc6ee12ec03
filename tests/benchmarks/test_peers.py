"""The peers benchmark: its plan of works and rounds, a missing peer's row, the peers' scripts."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.common import FULL, SMOKE
from benchmarks.peers import (
    PEERS,
    SIMRUN,
    PeerWork,
    Sample,
    await_peer,
    check_peers,
    peer_environment,
    peer_row,
    peer_works,
    round_orders,
    run_peer,
    start_peer,
    stop_peer,
)

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "run"
# What each peer's script imports first: a package of that name that fails to import makes the
# peer missing, as if it were not installed.
PEER_PACKAGES = {"dask": "distributed", "ray": "ray", "snakemake": "snakemake"}


def installed(peer: str) -> bool:
    """Whether the peer's package imports here (the extra `bench`)."""
    return importlib.util.find_spec(PEER_PACKAGES[peer]) is not None


def test_rounds_rotate_the_first_contender_and_drop_those_without_repetitions_left() -> None:
    orders = round_orders({"simrun": 3, "dask": 3, "snakemake": 1})

    assert orders == [
        ["simrun", "dask", "snakemake"],
        ["dask", "simrun"],
        ["simrun", "dask"],
    ]
    assert round_orders({"simrun": 0}) == []


def test_the_full_size_runs_the_works_of_the_issue_and_snakemake_only_up_to_its_limit() -> None:
    works = {work.key: work for work in peer_works(FULL)}

    assert list(works) == ["squares", "chain", "zero-1000", "zero-20000"]
    squares, chain = works["squares"], works["chain"]
    assert (squares.kind, squares.count, squares.sleep_s) == ("squares", 200, 0.05)
    assert (chain.kind, chain.count) == ("chain", 5)
    assert chain.work_s == pytest.approx(5 * FULL.chain_sleep_s)
    assert squares.work_s == 0.0
    assert squares.reps == {"simrun": 3, "dask": 3, "ray": 3, "snakemake": 1}
    assert chain.reps == squares.reps
    assert works["zero-1000"].reps == {"simrun": 3, "dask": 3, "ray": 3, "snakemake": 1}
    assert works["zero-20000"].reps == {"simrun": 1, "dask": 1, "ray": 1, "snakemake": 0}
    assert {peer.name for peer in PEERS} == {"dask", "ray", "snakemake"}


def shadow_packages(directory: Path) -> Path:
    """A directory of packages named like the peers that fail to import."""
    for package in {*PEER_PACKAGES.values(), "dask"}:
        (directory / package).mkdir(parents=True)
        (directory / package / "__init__.py").write_text(
            'raise ImportError("made missing by the test")\n'
        )
    return directory


def test_a_peer_that_cannot_be_imported_gives_a_row_saying_it_was_skipped(tmp_path: Path) -> None:
    shadow = shadow_packages(tmp_path / "shadow")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow), str(ROOT)]))
    results = tmp_path / "RESULTS.md"
    done = subprocess.run(
        [sys.executable, str(RUN), "peers", "--size", "smoke", "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=150,
        cwd=tmp_path,
        env=env,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed: none" in done.stdout
    rows = [line for line in results.read_text().splitlines() if line.startswith("| peers: ")]
    assert len(rows) == len(peer_works(SMOKE)) * len(PEERS)
    for peer in PEERS:
        skipped = f"skipped: {peer.name} not installed (pip install -e .[bench])"
        theirs = [row for row in rows if row.split(" | ")[0].endswith(f"vs {peer.name}")]
        assert theirs and all(skipped in row for row in theirs), rows
    for row in rows:  # nothing to compare with: simrun is not measured either
        assert row.split(" | ")[1:3] == ["-", "-"], row


@pytest.mark.slow
@pytest.mark.parametrize("peer", [peer.name for peer in PEERS])
def test_each_installed_peer_runs_the_squares_and_the_chain(peer: str, tmp_path: Path) -> None:
    if not installed(peer):
        pytest.skip(f"{peer} is not installed (pip install -e .[bench])")
    session = start_peer(next(p for p in PEERS if p.name == peer), peer_environment())
    try:
        await_peer(session, print)
        squares = PeerWork("squares", "3 units", "squares", 3, 0.01, {SIMRUN: 1})
        chain = PeerWork("chain", "chain of 2", "chain", 2, 0.0, {SIMRUN: 1})
        sample = run_peer(session, squares, tmp_path / "squares")
        chained = run_peer(session, chain, tmp_path / "chain")
    finally:
        stop_peer(session)

    summary = json.loads((tmp_path / "squares" / "summary.json").read_text())
    assert summary == {"n": 3, "sum": 0 + 1 + 4}
    assert json.loads((tmp_path / "chain" / "t2" / "summary.json").read_text()) == {
        "n": 1,
        "sum": 0,
    }
    assert (tmp_path / "chain" / "t1" / "summary.json").exists()
    for done in (sample, chained):
        assert 0 < done.phases["work_s"] < done.wall_s


def test_the_check_of_a_peer_that_does_not_import_says_how_to_install_it(
    tmp_path: Path,
) -> None:
    shadow = shadow_packages(tmp_path / "shadow")
    env = dict(peer_environment(), PYTHONPATH=str(shadow))

    reasons = check_peers(PEERS, env, print)

    assert reasons == {
        peer.name: f"{peer.name} not installed (pip install -e .[bench])" for peer in PEERS
    }


@pytest.mark.skipif(not all(map(installed, PEER_PACKAGES)), reason="the extra bench is not here")
def test_the_check_of_installed_peers_finds_nothing_wrong() -> None:
    assert check_peers(PEERS, peer_environment(), print) == {}


def sample(wall_s: float, **phases: float) -> Sample:
    """A sample of plain values."""
    return Sample(wall_s, phases)


def test_a_row_holds_simrun_to_the_peer_on_many_units_and_shows_the_chain_per_task() -> None:
    squares = PeerWork("squares", "200 units x 0.05 s", "squares", 200, 0.05, {})
    chain = PeerWork("chain", "chain of 5", "chain", 5, 0.02, {})
    samples = {
        ("squares", SIMRUN): [sample(5.6, service_s=5.2), sample(5.4), sample(9.0)],
        ("squares", "dask"): [sample(5.5, work_s=5.1), sample(5.3), sample(5.2)],
        ("chain", SIMRUN): [sample(0.6), sample(0.7)],
        ("chain", "dask"): [sample(1.1), sample(1.2)],
    }

    lost = peer_row(squares, "dask", samples, {}, {}, FULL)
    chained = peer_row(chain, "dask", samples, {}, {}, FULL)

    assert (lost.simrun, lost.baseline, lost.goal, lost.met) == (5.6, 5.3, "simrun <= dask", False)
    assert "5.200 s" in lost.gap and "5.100 s" in lost.gap
    assert chained.simrun == pytest.approx((0.65 - 0.1) / 5)
    assert chained.baseline == pytest.approx((1.15 - 0.1) / 5)
    assert chained.met is None


def test_a_peer_that_failed_or_was_not_run_gives_a_row_that_says_why() -> None:
    work = PeerWork("zero-20000", "20,000 units x 0 s", "squares", 20_000, 0.0, {})
    samples = {("zero-20000", SIMRUN): [sample(8.0)]}
    failed = {("zero-20000", "ray"): "ray took over 600 s"}

    timed_out = peer_row(work, "ray", samples, {}, failed, FULL)
    not_run = peer_row(work, "snakemake", samples, {}, failed, FULL)
    missing = peer_row(work, "dask", samples, {"dask": "dask not installed (x)"}, failed, FULL)

    assert timed_out.goal == "skipped: ray took over 600 s (see the log)"
    assert not_run.goal == "skipped: snakemake above 1,000 units (a process per job)"
    assert missing.goal == "skipped: dask not installed (x)"
    for row in (timed_out, not_run, missing):
        assert (row.simrun, row.baseline, row.met) == (8.0, None, None)
