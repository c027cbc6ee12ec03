"""The environment of a local service: computed alike by the command and the service, and a
background service of another environment started again when it is idle, else used with a
warning."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import msgspec
import pytest
from cli_helpers import run_simrun, wait_until, write_squares

from simrun_cli import local
from simrun_cli.local import ensure_local, environment, pid_alive, read_service
from simrun_core.wire import RunView

FAKE = Path(__file__).with_name("fake_local_service.py")


def test_the_environment_follows_the_task_types_and_their_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert environment()["python"] == sys.executable
    before = environment()["types"]
    plugin = tmp_path / "simrun_test_plugin-1.2.dist-info"
    plugin.mkdir()
    (plugin / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: simrun-test-plugin\nVersion: 1.2\n"
    )
    (plugin / "entry_points.txt").write_text("[simrun.task_types]\nfit = somewhere:FIT\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with_plugin = environment()["types"]
    assert with_plugin != before, "a new plugin changes the types"
    (plugin / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: simrun-test-plugin\nVersion: 1.3\n"
    )
    upgraded = environment()["types"]
    assert upgraded not in (before, with_plugin), "an upgraded plugin changes the types"


def test_a_second_copy_of_an_installed_distribution_does_not_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = environment()["types"]
    copy = tmp_path / "simrun.egg-info"
    copy.mkdir()
    (copy / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: simrun\nVersion: 0.1.0\n")
    (copy / "entry_points.txt").write_text(
        "[simrun.task_types]\ncommand = simrun_core.task_types.command:COMMAND\n"
    )
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])
    assert environment()["types"] == before


def set_types(root: Path, types: str) -> None:
    """Edit the `types` of `service.json` on disk, as a service of another environment wrote it.

    The running service does not read the file again; the commands do.
    """
    path = root / ".simrun" / "service.json"
    info = json.loads(path.read_text())
    info["types"] = types
    path.write_text(json.dumps(info))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_idle_background_service_of_another_environment_is_started_again(
    project: Path,
) -> None:
    assert run_simrun("list", "--local", cwd=project).returncode == 0
    old = read_service(project)
    assert old is not None and old.background and old.types
    set_types(project, "0123456789abcdef")
    listed = run_simrun("list", "--local", "--json", cwd=project)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []
    assert "types 0123456789abcdef instead of" in listed.stderr
    assert "starting it again" in listed.stderr
    new = read_service(project)
    assert new is not None and new.pid != old.pid and not pid_alive(old.pid)
    assert new.types == old.types, "the environment of the commands"
    again = run_simrun("list", "--local", cwd=project)
    assert again.returncode == 0 and again.stderr == "", "the same environment runs on"
    assert read_service(project) == new


def test_a_busy_background_service_of_another_environment_is_used_with_a_warning(
    project: Path,
) -> None:
    write_squares(project, n=400, sleep_s=0.05)
    submitted = run_simrun("submit", "squares.yaml", "--local", "--no-wait", "--json", cwd=project)
    assert submitted.returncode == 0, submitted.stderr
    run = msgspec.json.decode(submitted.stdout, type=RunView)
    old = read_service(project)
    assert old is not None
    set_types(project, "0123456789abcdef")
    status = run_simrun("status", run.id, "--local", "--json", cwd=project)
    assert status.returncode == 0, status.stderr
    assert not msgspec.json.decode(status.stdout, type=RunView).ended
    assert status.stderr.startswith("warning: the local service")
    assert "1 live runs" in status.stderr and "uses it" in status.stderr
    assert read_service(project).pid == old.pid  # type: ignore[union-attr]
    assert pid_alive(old.pid)
    cancelled = run_simrun("cancel", run.id, "--local", cwd=project)
    assert cancelled.returncode == 0, cancelled.stderr


def test_a_foreground_service_of_another_environment_is_used_with_a_warning(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "serve_command", lambda: [sys.executable, str(FAKE)])
    monkeypatch.setenv("FAKE_FOREGROUND", "1")
    monkeypatch.setenv("FAKE_TYPES", "0123456789abcdef")
    warnings: list[str] = []
    first = ensure_local(project, warn=warnings.append)
    assert warnings == [], "a service it started runs this environment"
    again = ensure_local(project, warn=warnings.append)
    assert again.pid == first.pid and pid_alive(first.pid)
    [warning] = warnings
    assert "types 0123456789abcdef instead of" in warning and "foreground" in warning
    os.kill(first.pid, 15)
    wait_until(lambda: not pid_alive(first.pid), what="the end of the fake service")
