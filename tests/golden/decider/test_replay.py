"""Old runs are decided alike: the recorded messages of real runs, fed through `decide`, produce
the events they produced then. A change of the policy that would decide an old run differently
fails here; see `record.py` beside this for recording the cases anew."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay import replay_problems, replayed

HERE = Path(__file__).parent
CASES = sorted(path.name for path in HERE.iterdir() if (path / "messages.jsonl").exists())
EXPECTED = {
    "cancelled",
    "failed",
    "killed-for-memory",
    "retried-after-kill",
    "service-killed",
    "succeeded",
    "workflow-deleted-mid-run",
}


def test_every_case_of_the_issue_is_recorded():
    assert set(CASES) == EXPECTED


@pytest.mark.parametrize("case", CASES)
def test_a_recorded_run_is_decided_alike(case: str):
    assert replay_problems(HERE / case) == []


@pytest.mark.parametrize("case", CASES)
def test_a_replay_ends_the_run_as_it_ended(case: str):
    logged, produced = replayed(HERE / case)
    assert produced and type(produced[-1]) is type(logged[-1])
    assert type(produced[-1]).__name__ in {"Succeeded", "Failed", "Cancelled"}
