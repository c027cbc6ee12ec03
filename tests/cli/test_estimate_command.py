"""`simrun estimate --local` before and after a run: the hint, then what the run taught."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import run_simrun, write_squares

from simrun_core.resources import LEARNED_FROM_RUNS


def test_estimate_shows_the_hint_then_the_learned_resources(project: Path) -> None:
    write_squares(project, n=30, sleep_s=0.01)
    before = run_simrun("estimate", "squares.yaml", "--local", cwd=project)
    assert before.returncode == 0, before.stderr
    assert "plugin hint" in before.stdout
    assert "N runs" not in before.stdout, "what N counts, only with learned resources"
    assert all(len(line) <= 80 for line in before.stdout.splitlines())
    assert run_simrun("submit", "squares.yaml", "--local", cwd=project).returncode == 0
    after = run_simrun("estimate", "squares.yaml", "--local", cwd=project)
    assert "learned from 1 run" in after.stdout, after.stdout
    assert LEARNED_FROM_RUNS in " ".join(after.stdout.split()), "what N counts"
    assert all(len(line) <= 80 for line in after.stdout.splitlines())
    found = json.loads(
        run_simrun("estimate", "squares.yaml", "--local", "--json", cwd=project).stdout
    )
    assert found["squares"]["resources"]["seconds_per_unit"] > 0
    assert found["squares"]["seconds"] > 0


def test_estimate_of_an_invalid_workflow_exits_1_naming_it(project: Path) -> None:
    (project / "bad.yaml").write_text("name: b\ntasks:\n  - {id: a, type: nope}\n")
    result = run_simrun("estimate", "bad.yaml", "--local", cwd=project)
    assert result.returncode == 1
    assert "unknown task type 'nope'" in result.stderr
