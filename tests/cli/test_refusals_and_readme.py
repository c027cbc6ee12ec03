"""The README's demo line end to end, and each invalid workflow refused by `submit --local`."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_helpers import run_simrun

REPO = Path(__file__).resolve().parents[2]

SQ = "type: demo.squares, settings: {n: 2}"
INVALID = {
    "cycle": (
        f"  - {{id: a, {SQ}, inputs: {{x: b.squares}}}}\n"
        f"  - {{id: b, {SQ}, inputs: {{x: a.squares}}}}\n",
        "the inputs of tasks 'a', 'b' form a cycle",
    ),
    "duplicate": (f"  - {{id: a, {SQ}}}\n  - {{id: a, {SQ}}}\n", "task 'a': the id is used twice"),
    "unknown-type": ("  - {id: a, type: no.such, settings: {}}\n", "unknown task type 'no.such'"),
    "unknown-setting": (
        "  - {id: a, type: demo.squares, settings: {n: 2, nn: 3}}\n",
        "task 'a': settings: unknown setting 'nn'",
    ),
    "unknown-input": (
        f"  - {{id: a, {SQ}, inputs: {{x: ghost.out}}}}\n",
        "input 'x' names unknown task 'ghost'",
    ),
    "bad-id": (f"  - {{id: Scan_1, {SQ}}}\n", "task 'Scan_1': the id must match"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_an_invalid_workflow_is_refused_naming_it(project: Path, case: str) -> None:
    tasks, needle = INVALID[case]
    (project / "bad.yaml").write_text(f"name: bad\ntasks:\n{tasks}")
    result = run_simrun("submit", "bad.yaml", "--local", cwd=project)
    assert result.returncode == 1, result.stdout
    assert needle in result.stderr, result.stderr
    assert not list(project.glob(".simrun/store/runs/*"))


def test_the_demo_of_the_readme_sums_a_thousand_squares(project: Path) -> None:
    readme = (REPO / "README.md").read_text().splitlines()
    assert readme[0] == "pip install -e . && simrun submit examples/squares.yaml --local"
    assert readme[1] == "pip install -e '.[dev]' && python -m pytest -n auto -q"
    (project / "examples").mkdir()
    shutil.copy(REPO / "examples" / "squares.yaml", project / "examples")
    result = run_simrun("submit", "examples/squares.yaml", "--local", cwd=project, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].split(": ")[1].startswith("succeeded")
    (summary,) = project.glob(".simrun/store/runs/*/tasks/squares/out/summary.json")
    assert json.loads(summary.read_text()) == {"n": 1000, "sum": sum(i * i for i in range(1000))}


def test_ci_runs_the_test_line_of_the_readme() -> None:
    script = (REPO / ".ci" / "run").read_text()
    (grep,) = [line for line in script.splitlines() if line.startswith("line=$(grep")]
    pattern = grep.split("'")[1]
    chosen = subprocess.run(
        ["grep", "-m1", "-E", pattern, "README.md"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    assert chosen == (REPO / "README.md").read_text().splitlines()[1]
    assert 'eval "$line"' in script
