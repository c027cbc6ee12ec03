"""The local service keeps its secrets (issue 25, item 9): `.simrun/service.log` is its user's
alone (0600, also one an older version left readable), and a broken `.simrun/tokens.yaml` is
reported by its line and column, its tokens neither in the terminal nor in the log."""

from __future__ import annotations

import stat
from pathlib import Path

from cli_helpers import run_simrun

SECRET = "tok-S3CRET-abcdef0123456789"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_broken_tokens_file_is_named_by_line_and_column_never_quoted(project: Path) -> None:
    simrun = project / ".simrun"
    simrun.mkdir()
    tokens = simrun / "tokens.yaml"
    tokens.write_text(f"{SECRET}: name: me\n")
    tokens.chmod(0o600)
    result = run_simrun("list", "--local", cwd=project, timeout=120)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "tokens.yaml: not valid YAML: line 1, column 34" in output, output
    assert "Traceback" not in output, output
    log = simrun / "service.log"
    assert SECRET not in output and SECRET not in log.read_text()
    assert mode(log) == 0o600


def test_the_service_log_is_private_also_one_left_readable(project: Path) -> None:
    simrun = project / ".simrun"
    simrun.mkdir()
    log = simrun / "service.log"
    log.write_text("the log of an older version\n")
    log.chmod(0o644)
    result = run_simrun("list", "--local", cwd=project, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert mode(log) == 0o600
    assert log.read_text().startswith("the log of an older version\n")
