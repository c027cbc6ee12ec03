"""Old runs stay readable: every golden log folds to the record it folded to when recorded.

A change of the fold or of the event types that would misread an old run fails here. New
fields of the record are allowed (a key the golden record lacks is not compared); a field
whose value changes, or a log that no longer folds, is a break. See `record.py` beside this.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from simrun_core.fold import RunFold, fold
from simrun_core.states import RunState
from simrun_core.store import read_log

GOLDEN = Path(__file__).parent
CASES = sorted(path.name for path in GOLDEN.iterdir() if (path / "events.jsonl").exists())
END_STATES = {
    "cancelled": RunState.CANCELLED,
    "failed": RunState.FAILED,
    "retried-after-kill": RunState.SUCCEEDED,
    "service-killed": RunState.SUCCEEDED,
    "succeeded": RunState.SUCCEEDED,
}


def test_every_case_of_the_issue_is_recorded():
    assert sorted(END_STATES) == CASES


def contained(expected: Any, actual: Any, where: str = "record") -> list[str]:
    """The places where `actual` differs from `expected`, ignoring keys `expected` lacks."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        problems = []
        for key, value in expected.items():
            if key not in actual:
                problems.append(f"{where}.{key} is gone")
            else:
                problems += contained(value, actual[key], f"{where}.{key}")
        return problems
    return [] if expected == actual else [f"{where}: {expected!r} became {actual!r}"]


@pytest.mark.parametrize("case", CASES)
def test_a_golden_log_folds_to_its_record(case: str):
    events = read_log(GOLDEN / case / "events.jsonl")
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    record = json.loads(msgspec.json.encode(fold(events)))
    expected = json.loads((GOLDEN / case / "record.json").read_text())
    assert contained(expected, record) == []


@pytest.mark.parametrize("case", CASES)
def test_every_prefix_of_a_golden_log_folds(case: str):
    folder = RunFold()
    for event in read_log(GOLDEN / case / "events.jsonl"):
        folder.apply(event)
        assert folder.record is not None and folder.record.seq == event.seq
    assert folder.record.state is END_STATES[case]
