"""The start of a command: the modules only some commands need are imported by those commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cli_helpers import cli_env, run_simrun

LAZY = ("httpx", "rich", "simrun_core.events", "simrun_core.planner", "yaml", "mcp")


def imported_by(code: str) -> list[str]:
    """Which of the lazy modules a fresh python imported after running `code`."""
    found = f"[m for m in {LAZY!r} if m in sys.modules]"
    probe = f"{code}\nimport json, sys\nprint(json.dumps({found}))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout.splitlines()[-1])


def test_the_command_line_starts_without_the_client_the_tables_and_the_workflow() -> None:
    assert imported_by("import simrun_cli.main") == []


def test_plain_lines_need_no_rich() -> None:
    """A command that follows a run off a terminal prints plain lines: rich stays unimported."""
    assert "rich" not in imported_by("import simrun_cli.follow")


def test_a_command_imports_neither_rich_nor_the_command_line_of_httpx_nor_async_support() -> None:
    """A command that prints plain lines; httpx and httpcore import those only if they can."""
    code = """
import atexit, json, sys
from simrun_cli.main import main
unused = ("rich", "httpx._main", "click", "pygments", "trio", "anyio")
atexit.register(lambda: print(json.dumps([m for m in unused if m in sys.modules])))
sys.argv = ["simrun", "list", "--json"]
main()
"""
    env = {**os.environ, "SIMRUN_URL": "http://127.0.0.1:9", "SIMRUN_TOKEN": "t"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 1
    assert "cannot reach the service at http://127.0.0.1:9" in done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


def imported_by_local_list(project: Path) -> list[str]:
    """Which of the modules a local command need not import `simrun list --local --json` did."""
    code = """
import atexit, json, sys
from simrun_cli.main import main
unused = ("simrun_core.environment", "rich", "anyio")
atexit.register(lambda: print(json.dumps([m for m in unused if m in sys.modules])))
sys.argv = ["simrun", "list", "--local", "--json"]
main()
"""
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_local_command_takes_its_environment_from_the_project_once_known(project: Path) -> None:
    """A command that finds the local service scans the installed distributions to compare its
    environment with the service's once; the next one takes it from `.simrun/environment.json`
    and imports neither `simrun_core.environment` nor rich to list the runs."""
    started = run_simrun("list", "--local", "--json", cwd=project)
    assert started.returncode == 0, started.stderr
    assert "simrun_core.environment" in imported_by_local_list(project)
    assert (project / ".simrun" / "environment.json").exists()
    assert imported_by_local_list(project) == []
