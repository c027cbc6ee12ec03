"""The README's `compare` example is what the command prints for the runs it describes."""

from __future__ import annotations

import re
from pathlib import Path

from cli_helpers import cli_env, git, run_simrun

REPO = Path(__file__).resolve().parents[2]
RUN_ID = re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{6}\b")
HASH_PART = re.compile(r"\b[0-9a-f]{20,}\b")
STUDY = "name: squares\ntasks:\n  - {id: squares, type: demo.squares, settings: {n: 400}}\n"


def readme_compare() -> list[str]:
    """The lines of the README's `simrun compare` example, from its command line on."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("$ simrun compare "))
    end = next(n for n in range(start + 1, len(lines)) if not lines[n].strip())
    return lines[start:end]


def normal(lines: list[str]) -> list[str]:
    """Lines with run ids and pieces of hashes in the order they come, as `RUN<n>`/`HASH<n>`."""
    names: dict[str, str] = {}

    def name(kind: str) -> object:
        return lambda match: names.setdefault(match[0], f"{kind}{len(names)}")

    return [HASH_PART.sub(name("HASH"), RUN_ID.sub(name("RUN"), line)) for line in lines]


def test_the_compare_of_the_readme_is_what_compare_prints(project: Path) -> None:
    model = project / "model"
    model.mkdir()
    git(model, "init", "-q", "-b", "main")
    (model / "model.py").write_text("VALUE = 1\n")
    git(model, "add", ".")
    git(model, "commit", "-q", "-m", "first")
    (project / "study.yaml").write_text(STUDY)
    runs = []
    for value in (1, 2):
        (model / "model.py").write_text(f"VALUE = {value}\n")
        submit = ("submit", "study.yaml", "--group", "study", "--source", "model=model")
        result = run_simrun(*submit, "--local", "--json", cwd=project)
        assert result.returncode == 0, result.stdout + result.stderr
        runs.append(RUN_ID.search(result.stdout)[0])
    env = cli_env(COLUMNS="80")
    printed = run_simrun("compare", *runs, "--local", cwd=project, env=env)
    assert printed.returncode == 0, printed.stderr
    example = readme_compare()
    assert example[0].split()[3:] == [*example[1].split()[1:], "--local"], "of its runs"
    assert normal([f"$ simrun compare {' '.join(runs)} --local", *printed.stdout.splitlines()]) == (
        normal(example)
    )
