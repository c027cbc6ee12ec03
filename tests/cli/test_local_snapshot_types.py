"""`simrun submit --local --snapshot` of a workflow whose task types only the model's working
tree has (issue 13): a plugin package in the tree, installed nowhere, runs with the tree's code,
an uncommitted change included, and the run's venv is gone after the run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from cli_helpers import run_simrun, wait_until
from editable_package import git_commit_all, set_factor, write_tree_plugin

N = 5


def test_submit_local_snapshot_runs_a_type_of_the_working_tree(project: Path) -> None:
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('treeplug') is not None)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0, "treeplug is installed"
    tree = write_tree_plugin(project / "model", factor=1)
    git_commit_all(tree)
    set_factor(tree, 3)  # uncommitted
    tasks = [
        {"id": "sum", "type": "tree.sum", "settings": {"n": N}},
        {"id": "note", "type": "tree.note", "inputs": {"values": "sum.values"}},
    ]
    workflow = project / "tree.yaml"
    workflow.write_text(yaml.safe_dump({"name": "tree", "tasks": tasks}, sort_keys=False))

    result = run_simrun(
        "submit", "tree.yaml", "--local", "--snapshot", "--source", "model=model", cwd=project
    )

    assert result.returncode == 0, result.stdout + result.stderr
    first = result.stdout.splitlines()[0]
    run_id = first.split(" run ", 1)[1].split(":", 1)[0]
    assert result.stdout.splitlines()[-1].startswith(f"run {run_id}: succeeded")
    outputs = project / ".simrun" / "store" / "runs" / run_id / "tasks"
    summary = json.loads((outputs / "sum" / "out" / "summary.json").read_text())
    assert summary["factor"] == 3 and summary["sum"] == 3 * sum(range(N))
    note = json.loads((outputs / "note" / "out" / "note.json").read_text())
    assert note["factor"] == 3 and note["values"] == N
    environment = project / ".simrun" / "envs" / run_id
    assert note["prefix"] == str(environment / "venv")
    wait_until(lambda: not environment.exists(), what="the venv removed after the run")
