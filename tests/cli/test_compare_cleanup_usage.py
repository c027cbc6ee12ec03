"""`simrun compare`, `usage` and `cleanup` against the real local service: JSON of the API
shapes, tables within 80 columns."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from cli_helpers import git, run_simrun, write_squares

from simrun_cli.local import stop_local
from simrun_core.wire import CleanupResult, CompareTable, Usage


class TwoRuns:
    """A project with two runs of squares in the group `g` with the source `model`, a clean
    working tree for the first, a changed file for the second."""

    def __init__(self, root: Path, runs: list[str]) -> None:
        self.root = root
        self.runs = runs

    def simrun(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = run_simrun(*args, "--local", cwd=self.root)
        assert result.returncode == 0, result.stdout + result.stderr
        return result


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoRuns]:
    root = tmp_path_factory.mktemp("two-runs")
    model = root / "model"
    model.mkdir()
    git(model, "init", "-q", "-b", "main")
    (model / "model.py").write_text("VALUE = 1\n")
    git(model, "add", ".")
    git(model, "commit", "-q", "-m", "first")
    runs = []
    try:
        for n in (4, 6):
            write_squares(root, n=n)
            if n == 6:
                (model / "model.py").write_text("VALUE = 2\n")
            args = ["submit", "squares.yaml", "--local", "--json", "--source", "model=model"]
            result = run_simrun(*args, "--group", "g", cwd=root)
            assert result.returncode == 0, result.stdout + result.stderr
            runs.append(json.loads(result.stdout)["id"])
        yield TwoRuns(root, runs)
    finally:
        stop_local(root, timeout_s=60)


def fits(text: str, width: int = 80) -> None:
    too_long = [line for line in text.splitlines() if len(line) > width]
    assert not too_long, "\n".join(too_long)


def test_compare_json_is_the_table_of_the_api(two_runs: TwoRuns) -> None:
    answer = two_runs.simrun("compare", *two_runs.runs, "--json").stdout
    table = msgspec.json.decode(answer, type=CompareTable)
    assert table.columns[:4] == ["run", "group", "agent", "state"]
    assert [row["run"] for row in table.rows] == two_runs.runs
    assert all(row["group"] == "g" and row["state"] == "succeeded" for row in table.rows)
    assert [row["squares.sum"] for row in table.rows] == [
        sum(i * i for i in range(n)) for n in (4, 6)
    ]
    assert [row["model.changed_files"] for row in table.rows] == [[], ["M model.py"]]
    hashes = [row["model.diff_sha256"] for row in table.rows]
    assert all(hashes) and hashes[0] != hashes[1], "the second run had a changed model"
    assert "model.snapshot" not in table.columns, "the local mode records the working tree"


def test_compare_prints_the_runs_side_by_side_within_80_columns(two_runs: TwoRuns) -> None:
    text = two_runs.simrun("compare", *two_runs.runs).stdout
    fits(text)
    assert all(run in text for run in two_runs.runs)
    assert "squares.sum" in text and "─" in text


def test_usage_json_and_table(two_runs: TwoRuns) -> None:
    usage = msgspec.json.decode(two_runs.simrun("usage", "--json").stdout, type=Usage)
    assert set(usage.runs) == set(two_runs.runs) and all(size > 0 for size in usage.runs.values())
    assert set(usage.groups) == {"g"} and usage.groups["g"] >= max(usage.runs.values())
    text = two_runs.simrun("usage").stdout
    fits(text)
    rows = [line for line in text.splitlines() if line.startswith(tuple(two_runs.runs))]
    assert len(rows) == 2 and all(" g " in row and row.rstrip().endswith("B") for row in rows)


def test_cleanup_dry_run_lists_and_removes_nothing(two_runs: TwoRuns) -> None:
    dry = two_runs.simrun("cleanup", "--older-than", "0", "--dry-run", "--json").stdout
    result = msgspec.json.decode(dry, type=CleanupResult)
    assert result.dry_run and sorted(result.runs) == sorted(f"runs/{run}" for run in two_runs.runs)
    assert result.bytes_freed > 0
    other = two_runs.simrun("cleanup", "--older-than", "0", "--group", "other", "--json")
    assert msgspec.json.decode(other.stdout, type=CleanupResult).runs == []
    failed = two_runs.simrun("cleanup", "--older-than", "0", "--failed", "--dry-run")
    assert "nothing to remove" in failed.stdout
    recent = two_runs.simrun("cleanup", "--dry-run")
    assert "nothing to remove" in recent.stdout, "the runs ended less than 30 days ago"
    said = " ".join(recent.stdout.split())
    assert "ended 30 days ago or earlier (--older-than 30)" in said, "and it says so"
    listed = json.loads(two_runs.simrun("list", "--json").stdout)
    assert sorted(item["id"] for item in listed) == sorted(two_runs.runs)
    table = two_runs.simrun("cleanup", "--older-than", "0", "--dry-run").stdout
    fits(table)
    assert "would remove 2 runs" in table


def test_cleanup_removes_ended_runs(project: Path) -> None:
    write_squares(project, n=2)
    submitted = run_simrun("submit", "squares.yaml", "--local", "--json", cwd=project)
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["id"]
    result = run_simrun("cleanup", "--older-than", "0", "--local", cwd=project)
    assert result.returncode == 0, result.stderr
    assert run_id in result.stdout and "removed 1 run" in result.stdout
    assert not (project / ".simrun" / "store" / "runs" / run_id).exists()
    listed = run_simrun("list", "--local", "--json", cwd=project)
    assert json.loads(listed.stdout) == []


def test_negative_days_are_refused(tmp_path: Path) -> None:
    result = run_simrun("cleanup", "--older-than", "-1", "--local", cwd=tmp_path)
    assert result.returncode == 1 and "--older-than" in result.stderr
    assert not (tmp_path / ".simrun").exists()
