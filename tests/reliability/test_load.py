"""Load: runs submitted at once by five tokens to a service of `serve_from_config`, each a
`demo.squares` of 200 units without sleep. Every run must succeed with the right sum, no log
may have a gap (and every log folds), and `GET /me`, sampled all along in a thread, must keep
answering: every answer within `HANG_S`, a bound only a service that stopped answering breaks.
How fast it answers under such a load is a figure of `benchmarks/api.py` (its goal: a p99 of
200 ms), measured on a machine that does nothing else, not a test on a busy one.

The 50 runs of the issue take about 25 s on a machine of 2 cores, so they are in the normal
run; the numbers are printed (`-s` shows them) and are in the message of a failed assertion.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))

from service_helpers import (
    ConfiguredService,
    start_configured_service,
    stop_configured_service,
)

from simrun_core.events import UNITS_EVENTS, done_units
from simrun_core.fold import RunFold
from simrun_core.store import read_log

UNITS = 200
SUM = sum(i * i for i in range(UNITS))
HANG_S = 20.0
SAMPLE_EVERY_S = 0.02
# Five callers: the owner, their agent, two other people and an agent of one of them.
TOKENS = {
    "t-mk": {"name": "mk", "kind": "person"},
    "t-mk-bot": {"name": "mk-bot", "kind": "agent", "owner": "mk"},
    "t-ann": {"name": "ann", "kind": "person"},
    "t-bob": {"name": "bob", "kind": "person"},
    "t-bob-bot": {"name": "bob-bot", "kind": "agent", "owner": "bob"},
}


def squares(name: str) -> dict:
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": UNITS, "sleep_s": 0}}
    return {"name": name, "tasks": [task]}


@dataclasses.dataclass
class Latencies:
    """`GET /me` sampled in a thread until stopped: the seconds of each answer."""

    url: str
    token: str
    seconds: list[float] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=30) as client:
            while not self.stop.is_set():
                started = time.perf_counter()
                try:
                    response = client.get("/me")
                except httpx.HTTPError as error:
                    self.failures.append(repr(error))
                else:
                    self.seconds.append(time.perf_counter() - started)
                    if response.status_code != 200:
                        self.failures.append(f"{response.status_code} {response.text[:200]}")
                self.stop.wait(SAMPLE_EVERY_S)


def check_log(service: ConfiguredService, run_id: str) -> None:
    """The log of a run has every seq once in order, folds to `succeeded`, and has every unit
    done exactly once."""
    events = read_log(service.run_dir(run_id) / "events.jsonl")
    assert [event.seq for event in events] == list(range(1, len(events) + 1)), f"{run_id}: a gap"
    fold = RunFold()
    for event in events:
        fold.apply(event)
    assert fold.record is not None and fold.record.state == "succeeded", run_id
    units = Counter(
        index for e in events if isinstance(e, UNITS_EVENTS) for index, _ in done_units(e)
    )
    assert units == Counter(range(UNITS)), f"{run_id}: units done {sorted(units.items())[:5]}..."


def load(root: Path, runs: int, deadline_s: float) -> str:
    """Submit `runs` runs at once, spread over the five tokens, wait for their end and check
    them; the measured numbers as a line."""
    service = start_configured_service(root, tokens=TOKENS)
    latencies = Latencies(service.url, "t-ann")
    sampler = threading.Thread(target=latencies.run, name="sample-me")
    tokens = list(TOKENS)
    try:
        sampler.start()
        while len(latencies.seconds) < 5:  # a baseline before the load
            assert sampler.is_alive() and not latencies.failures, latencies.failures
            latencies.stop.wait(SAMPLE_EVERY_S)
        baseline = len(latencies.seconds)
        barrier = threading.Barrier(runs)

        def submit(number: int) -> tuple[str, str]:
            token = tokens[number % len(tokens)]
            with httpx.Client(
                base_url=service.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
            ) as client:
                barrier.wait(timeout=60)
                response = client.post("/runs", json={"workflow": squares(f"load-{number}")})
            assert response.status_code == 201, response.text
            return token, response.json()["id"]

        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=runs) as pool:
            submitted = list(pool.map(submit, range(runs)))
        submit_s = time.monotonic() - started
        assert len({run_id for _, run_id in submitted}) == runs

        client = service.clients["mk"]
        ends = {}
        for _, run_id in submitted:
            while True:
                remaining = deadline_s - (time.monotonic() - started)
                assert remaining > 0, f"the runs did not end within {deadline_s} s"
                answer = client.get(f"/runs/{run_id}/wait", params={"timeout": min(60, remaining)})
                assert answer.status_code == 200, answer.text
                if answer.json()["finished"] is not None:
                    ends[run_id] = answer.json()
                    break
        elapsed = time.monotonic() - started
    finally:
        latencies.stop.set()
        sampler.join(timeout=60)
        code = stop_configured_service(service)
    assert code == 0
    during = latencies.seconds[baseline:]
    summary = (
        f"{runs} runs of {UNITS} units by {len(TOKENS)} tokens: submitted in {submit_s:.2f} s, "
        f"all ended in {elapsed:.1f} s; GET /me {len(during)} samples: "
        f"p50 {1000 * quantile(during, 0.5):.1f} ms, p99 {1000 * quantile(during, 0.99):.1f} ms, "
        f"max {1000 * max(during):.1f} ms"
    )
    print(summary)
    assert not latencies.failures, latencies.failures[:5]
    for token, run_id in submitted:
        end = ends[run_id]
        assert end["state"] == "succeeded", (run_id, end)
        assert end["submitted_by"] == TOKENS[token]["name"]
        summary_json = service.run_dir(run_id) / "tasks/squares/out/summary.json"
        assert summary_json.read_text() == f'{{"n": {UNITS}, "sum": {SUM}}}', run_id
        check_log(service, run_id)
    assert len(during) >= 20, summary
    assert max(during) < HANG_S, summary
    return summary


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def test_fifty_runs_by_five_tokens_succeed_and_me_keeps_answering(tmp_path):
    load(tmp_path, runs=50, deadline_s=240)
