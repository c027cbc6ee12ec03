"""`simrun logs RUN TASK` of a split task that ran quietly says what its coordinator did."""

from __future__ import annotations

import re
from pathlib import Path

from cli_helpers import run_simrun, write_squares


def test_the_log_of_a_quiet_split_task_says_its_units_and_its_merge(project: Path) -> None:
    write_squares(project, n=30)
    submitted = run_simrun("submit", "squares.yaml", "--local", "--no-wait", "--json", cwd=project)
    assert submitted.returncode == 0, submitted.stderr
    run_id = re.search(r'"id":\s*"([^"]+)"', submitted.stdout)
    assert run_id is not None, submitted.stdout
    waited = run_simrun("wait", run_id[1], "--local", cwd=project)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    logs = run_simrun("logs", run_id[1], "squares", "--local", cwd=project)
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()
    assert "==> w0-0.log <==" in lines[0], lines
    said = [line for line in lines if line.startswith("simrun harness: w0: ")]
    assert said[0].startswith(
        "simrun harness: w0: the coordinator of task 'squares' (demo.squares): 30 units, "
    ), said
    assert re.fullmatch(
        r"simrun harness: w0: computed 30 of the 30 units in \d+\.\d\d s "
        r"\(\d+\.\d\d s of units in \d+ processes\)",
        said[1],
    ), said
    assert re.fullmatch(r"simrun harness: w0: merged the 30 units in \d+\.\d\d s", said[2]), said
