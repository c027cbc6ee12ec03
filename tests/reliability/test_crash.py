"""Crash consistency in CI: a few seeded rounds of kill -9 (see crash.py for long soaks)."""

from __future__ import annotations

import random

import pytest
from crash import crash_round

SEEDS = [11, 23, 37]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("target", ["service", "worker"])
def test_a_killed_process_loses_no_acknowledged_event_and_hangs_no_run(tmp_path, seed, target):
    print(f"seed {seed}, killing the {target}")
    crash_round(tmp_path, random.Random(seed), target)
