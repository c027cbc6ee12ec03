"""Crash consistency: kill -9 the local service (or a worker) at a random moment, and check.

Used by `test_crash.py` with a few rounds in CI, and runnable for longer soaks:
`python tests/reliability/crash.py --rounds 50 --seed 7`.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from live_service import (
    LocalService,
    run_processes,
    start_service,
    stop_service,
)

from simrun_core.fold import RunFold
from simrun_core.store import read_log

N_UNITS = 30


def squares(n: int = N_UNITS) -> dict:
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": n, "sleep_s": 0.02}}
    return {"name": "crash", "tasks": [task]}


def crash_round(root: Path, rng: random.Random, target: str) -> list[str]:
    """One round: submit runs, kill the service or a worker at a random moment, restart, check.

    Returns the ids of the runs it submitted; raises AssertionError on a broken promise.
    """
    service = start_service(root)
    acknowledged: dict[str, int] = {}
    cancelled: set[str] = set()
    try:
        for _ in range(rng.randint(1, 3)):
            run = service.submit(squares())
            acknowledged[run["id"]] = run["seq"]
        if rng.random() < 0.3:
            victim = rng.choice(sorted(acknowledged))
            response = service.client.post(f"/runs/{victim}/cancel")
            if response.status_code == 200:
                cancelled.add(victim)
                acknowledged[victim] = response.json()["seq"]
        time.sleep(rng.uniform(0.0, 1.5))
        if target == "service":
            os.kill(service.process.pid, signal.SIGKILL)
            service.process.wait()
        else:
            pids = [pid for run_id in acknowledged for pid in run_processes(run_id)]
            if pids:
                os.kill(rng.choice(pids), signal.SIGKILL)
    finally:
        if target == "service":
            stop_service(service)
    if target == "service":
        service = start_service(root)
    try:
        for run_id, seq in acknowledged.items():
            end = service.wait(run_id, timeout=120)
            check_run(service, run_id, seq, end, run_id in cancelled)
    finally:
        stop_service(service)
    for run_id in acknowledged:
        assert run_processes(run_id) == [], f"run {run_id}: a process outlived the run"
    return list(acknowledged)


def cancel_round(root: Path, rng: random.Random) -> str:
    """One round: cancel a running run, kill -9 the service at a random moment after the cancel
    was acknowledged, start it again: the run ends cancelled and none of its processes is left.

    Returns the id of the run; raises AssertionError on a broken promise.
    """
    service = start_service(root)
    try:
        run = service.submit(squares(n=400))
        time.sleep(rng.uniform(0.0, 0.8))
        response = service.client.post(f"/runs/{run['id']}/cancel")
        assert response.status_code == 200, response.text
        acknowledged = response.json()["seq"]
        time.sleep(rng.uniform(0.0, 0.3))
        os.kill(service.process.pid, signal.SIGKILL)
        service.process.wait()
    finally:
        stop_service(service)
    service = start_service(root)
    try:
        end = service.wait(run["id"], timeout=120)
        check_run(service, run["id"], acknowledged, end, was_cancelled=True)
    finally:
        stop_service(service)
    assert run_processes(run["id"]) == [], f"run {run['id']}: a process outlived the run"
    return str(run["id"])


def check_run(
    service: LocalService, run_id: str, acknowledged_seq: int, end: dict, was_cancelled: bool
) -> None:
    """The promises for one run after a crash."""
    events = read_log(service.run_dir(run_id) / "events.jsonl")
    assert [event.seq for event in events] == list(range(1, len(events) + 1)), "a gap"
    assert len(events) >= acknowledged_seq, "an acknowledged event is lost"
    folder = RunFold()
    for event in events:
        folder.apply(event)
    assert folder.record is not None and folder.record.ended, f"run {run_id} did not end"
    state = folder.record.state
    assert end["state"] == state
    if was_cancelled:
        assert any(event.__struct_config__.tag == "cancel-requested" for event in events)
        assert state == "cancelled", f"run {run_id}: an acknowledged cancel ended {state}"
    if state == "succeeded":
        summary = service.run_dir(run_id) / "tasks/squares/out/summary.json"
        expected = sum(i * i for i in range(N_UNITS))
        assert f'"sum": {expected}' in summary.read_text()
    else:
        assert folder.record.message, f"run {run_id} ended {state} without a message"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--target", choices=["service", "worker", "both", "cancel"], default="both")
    args = parser.parse_args()
    print(f"seed {args.seed}", flush=True)
    rng = random.Random(args.seed)
    for number in range(args.rounds):
        target = args.target if args.target != "both" else rng.choice(["service", "worker"])
        with tempfile.TemporaryDirectory() as tmp:
            if target == "cancel":
                cancel_round(Path(tmp), rng)
                print(f"round {number}: killed the service after a cancel, the run ended cancelled")
                continue
            runs = crash_round(Path(tmp), rng, target)
        print(f"round {number}: killed the {target}, {len(runs)} runs ended as promised")


if __name__ == "__main__":
    try:
        main()
    except httpx.HTTPError as error:
        sys.exit(f"the service failed: {error}")
