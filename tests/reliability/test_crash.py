"""Crash consistency in CI: a few seeded rounds of kill -9 (see crash.py for long soaks)."""

from __future__ import annotations

import random

import pytest
from crash import cancel_round, crash_round

SEEDS = [11, 23, 37]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("target", ["service", "worker"])
def test_a_killed_process_loses_no_acknowledged_event_and_hangs_no_run(tmp_path, seed, target):
    print(f"seed {seed}, killing the {target}")
    crash_round(tmp_path, random.Random(seed), target)


CANCEL_SEEDS = [3, 5, 8, 13, 21, 34]


@pytest.mark.parametrize("seed", CANCEL_SEEDS)
def test_an_acknowledged_cancel_survives_a_kill_of_the_service(tmp_path, seed):
    """kill -9 of the service at a random moment after a cancel was answered: the next
    service ends the run cancelled (it does not resume it) and leaves no process."""
    cancel_round(tmp_path, random.Random(seed))
