"""The appends of every run's log take turns: one thread at a time appends for the service."""

from __future__ import annotations

import threading
import time

from supervised import supervise
from test_recovery import two_squares_run

from simrun_api.actor import RunActor
from simrun_api.backends.fake import FakeBackend, Outcome
from simrun_core.states import RunState

RUNS = 8


def test_the_runs_of_a_service_append_one_at_a_time(tmp_path, monkeypatch) -> None:
    store = tmp_path / "store"
    runs = [f"20250102-030405-{number:06x}" for number in range(RUNS)]
    for run_id in runs:
        two_squares_run(store, run_id)
    inside = 0
    most = 0
    appends = 0
    lock = threading.Lock()
    append = RunActor._append

    def counted(self, numbered):
        nonlocal inside, most, appends
        with lock:
            inside += 1
            most = max(most, inside)
            appends += 1
        try:
            time.sleep(0.005)  # long enough for the appends of other runs to come meanwhile
            return append(self, numbered)
        finally:
            with lock:
                inside -= 1

    monkeypatch.setattr(RunActor, "_append", counted)
    backend = FakeBackend(store, autopilot=lambda pod: Outcome(exit_code=0))

    states: list[RunState] = []

    async def all_ended(supervisor) -> bool:
        states[:] = [supervisor.summary(run_id).state for run_id in runs]
        return all(state.ended for state in states)

    supervise(store, backend, all_ended)
    assert states == [RunState.SUCCEEDED] * RUNS
    assert appends >= RUNS * 3
    assert most == 1
