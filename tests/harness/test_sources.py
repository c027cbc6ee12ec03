"""The sources of a run in a pod: shadow trees of read-only snapshots, their editable install
(pip and uv), and the harness that installs `SIMRUN_EDITABLE` and starts again.

The installs go into venvs of the tests that see this environment (`local_env.create` without
snapshots), never into the environment of the tests; the snapshots are real ones of a git
working tree (`simrun_cli.snapshots.snapshot_source`), read-only files in a store.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from editable_package import git_commit_all, set_version, tree_state, write_plugin
from live_service import processes_in

from simrun_api.backends import local_env
from simrun_cli.snapshots import snapshot_source
from simrun_core import editable
from simrun_core.events import WorkerReport
from simrun_harness.sources import (
    SOURCES_DIR,
    SOURCES_INSTALLED,
    install_editable,
    shadow_tree,
)

from .helpers import wait_until

INSTALLERS = [
    "pip",
    pytest.param(
        "uv", marks=pytest.mark.skipif(editable.uv_binary() is None, reason="uv is not installed")
    ),
]


@pytest.fixture
def installer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The installer a test installs with: pip (uv hidden) or uv."""
    if request.param == "pip":
        monkeypatch.setattr(editable, "uv_binary", lambda: None)
    return str(request.param)


def snapshot_of_plugin(tmp_path: Path, store: Path, **meta: object) -> tuple[Path, Path]:
    """A working tree of the plugin (committed `committed`, changed to `uncommitted`) and its
    snapshot in `store`; the tree then changes again (`later`), which the snapshot has not."""
    tree = write_plugin(tmp_path / "model", "committed", **meta)
    git_commit_all(tree)
    set_version(tree, "uncommitted")
    store.mkdir(parents=True, exist_ok=True)
    provenance = snapshot_source("model", tree, store)
    set_version(tree, "later")
    assert provenance.snapshot is not None
    return tree, store / provenance.snapshot


def empty_venv(directory: Path) -> Path:
    """A venv that sees this environment (its python)."""
    return local_env.create(directory, [], directory / "install.log")


# -- shadow trees ---------------------------------------------------------------------------------


def test_a_shadow_tree_links_the_files_keeps_the_links_and_never_writes_into_the_source(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source"
    (source / "pkg" / "sub").mkdir(parents=True)
    (source / "pkg" / "__init__.py").write_text("X = 1\n")
    (source / "pkg" / "sub" / "data.txt").write_text("data")
    os.symlink("pkg/__init__.py", source / "link-to-file")
    os.symlink("pkg/sub", source / "link-to-dir")
    for path in [*source.rglob("*"), source]:
        if not path.is_symlink():
            path.chmod(0o555 if path.is_dir() else 0o444)
    before = tree_state(source)

    target = shadow_tree(source, tmp_path / "shadow")

    assert target == tmp_path / "shadow"
    for directory in ("", "pkg", "pkg/sub"):
        shadow_dir = target / directory
        assert shadow_dir.is_dir() and not shadow_dir.is_symlink()
        assert os.access(shadow_dir, os.W_OK)
    assert os.readlink(target / "pkg" / "__init__.py") == str(source / "pkg" / "__init__.py")
    assert (target / "pkg" / "sub" / "data.txt").read_text() == "data"
    assert os.readlink(target / "link-to-file") == "pkg/__init__.py"
    assert os.readlink(target / "link-to-dir") == "pkg/sub"
    assert (target / "link-to-dir" / "data.txt").read_text() == "data"  # within the shadow

    (target / "pkg" / "generated.txt").write_text("a backend's output")
    (target / "pkg" / "build").mkdir()
    if os.geteuid() != 0:  # root writes read-only files (a pod mounts snapshots read-only)
        with pytest.raises(PermissionError):
            (target / "pkg" / "__init__.py").write_text("X = 2\n")
    assert tree_state(source) == before


def test_a_shadow_tree_replaces_the_one_there(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "a.txt").write_text("a")
    target = tmp_path / "shadow"
    shadow_tree(source, target)
    (target / "left-over").mkdir()
    (target / "left-over" / "x").write_text("x")
    (source / "b.txt").write_text("b")

    shadow_tree(source, target)

    assert sorted(path.name for path in target.iterdir()) == ["a.txt", "b.txt"]


# -- editable installs ----------------------------------------------------------------------------


@pytest.mark.parametrize("installer", INSTALLERS, indirect=True)
def test_install_editable_installs_a_snapshot_from_its_shadow_tree(
    tmp_path: Path, installer: str
) -> None:
    _, snapshot = snapshot_of_plugin(tmp_path, tmp_path / "store")
    python = empty_venv(tmp_path / "env")
    before = tree_state(snapshot)
    shadows = tmp_path / "shadows"

    install_editable([str(snapshot)], str(python), shadows)

    imported = subprocess.run(
        [str(python), "-c", "import snapplug; print(snapplug.VERSION, snapplug.__file__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert imported == ["uncommitted", str(shadows / "model" / "src" / "snapplug" / "__init__.py")]
    assert (shadows / "model" / "_build" / "built-by.txt").exists(), "the backend wrote here"
    assert tree_state(snapshot) == before, "nothing was written into the snapshot"


def test_install_editable_of_nothing_installs_nothing(tmp_path: Path) -> None:
    install_editable([], "/nonexistent/python", tmp_path / "shadows")
    assert not (tmp_path / "shadows").exists()


@pytest.mark.parametrize("installer", INSTALLERS, indirect=True)
def test_a_failed_install_raises_with_the_installers_last_lines(
    tmp_path: Path, installer: str
) -> None:
    _, snapshot = snapshot_of_plugin(tmp_path, tmp_path / "store", fail="on purpose")
    python = empty_venv(tmp_path / "env")
    with pytest.raises(subprocess.CalledProcessError) as raised:
        install_editable([str(snapshot)], str(python), tmp_path / "shadows")
    assert raised.value.returncode != 0
    assert "the test backend fails as asked: on purpose" in raised.value.output


# -- the harness installs SIMRUN_EDITABLE ---------------------------------------------------------

RESTARTING = """\
import os, threading
from simrun_harness.sources import install_sources
print("start", os.environ.get("SIMRUN_SOURCES_INSTALLED"), flush=True)
install_sources(os.environ, threading.Event())
import snapplug
print("imported", snapplug.VERSION, flush=True)
"""


def test_install_sources_installs_then_starts_the_process_again(tmp_path: Path) -> None:
    _, snapshot = snapshot_of_plugin(tmp_path, tmp_path / "store")
    python = empty_venv(tmp_path / "env")
    env = {**os.environ, "SIMRUN_EDITABLE": str(snapshot), "TMPDIR": str(tmp_path)}
    env.pop(SOURCES_INSTALLED, None)

    done = subprocess.run(
        [str(python), "-c", RESTARTING], env=env, capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 0, done.stderr
    # The first interpreter installs and is replaced; the second imports the installed source.
    assert done.stdout.splitlines() == ["start None", "start 1", "imported uncommitted"]
    assert (tmp_path / SOURCES_DIR / "model" / "pyproject.toml").is_symlink()
    assert "installing the sources" in done.stderr


def plugin_task(make_task, tmp_path: Path, **meta: object):
    """A task of `snap.echo`, a type only its snapshot has, in a pod-like environment: its
    python a venv, `SIMRUN_EDITABLE` the snapshot relative to the store."""
    task = make_task({"word": "pod"}, task_type="snap.echo", task="echo")
    _, snapshot = snapshot_of_plugin(tmp_path, task.store, **meta)
    python = empty_venv(tmp_path / "env")
    task.env.update(
        SIMRUN_EDITABLE=str(snapshot.relative_to(task.store)),
        TMPDIR=str(tmp_path),
        PATH=os.pathsep.join([str(python.parent), os.environ.get("PATH", os.defpath)]),
    )
    task.env.pop("SIMRUN_WORKER")
    return task, python


def start_exec(task, python: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [str(python), "-m", "simrun_harness.exec"],
        env=task.env,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    task.processes.append(process)
    return process


def test_simrun_exec_installs_the_snapshots_and_runs_a_type_only_they_have(
    make_task, tmp_path: Path
) -> None:
    task, python = plugin_task(make_task, tmp_path)
    process = task.finish(start_exec(task, python), timeout=60)
    assert process.returncode == 0, process.stderr_text  # type: ignore[attr-defined]

    result = json.loads((task.task_dir / "out" / "result.json").read_text())
    shadow = tmp_path / SOURCES_DIR / "model"
    assert result["version"] == "uncommitted"
    assert result["file"] == str(shadow / "src" / "snapplug" / "__init__.py")
    assert result["prefix"] == str(python.parent.parent), "`python` of PATH ran the command"
    [report] = [e for e in task.events("echo") if isinstance(e, WorkerReport)]
    assert report.exit_code == 0
    # The start is the one before the install (kept across the restart), so the preparation
    # holds the install.
    assert report.started is not None and report.prepare_seconds > 0.05


def test_simrun_exec_reports_sources_that_cannot_be_installed(make_task, tmp_path: Path) -> None:
    task, python = plugin_task(make_task, tmp_path, fail="on purpose")
    process = task.finish(start_exec(task, python), timeout=60)
    assert process.returncode == 4, process.stderr_text  # type: ignore[attr-defined]
    report = task.report("echo")
    assert report.message is not None
    assert report.message.startswith("the sources of the run cannot be installed: ")
    assert "the test backend fails as asked: on purpose" in report.message


def test_a_sigterm_during_the_install_kills_the_installer_and_stops(
    make_task, tmp_path: Path
) -> None:
    task, python = plugin_task(make_task, tmp_path, sleep_s=60)
    process = start_exec(task, python)
    shadow = tmp_path / SOURCES_DIR / "model"
    wait_until(lambda: (shadow / "pyproject.toml").exists(), what="the shadow tree")
    wait_until(lambda: processes_in(shadow), what="the installer")  # it waits in the backend
    stopped_at = time.monotonic()
    process.send_signal(signal.SIGTERM)
    task.finish(process, timeout=20)
    assert process.returncode == 143, process.stderr_text  # type: ignore[attr-defined]
    assert time.monotonic() - stopped_at < 15
    assert task.report("echo").exit_code == 143
    assert not (task.task_dir / "out" / "result.json").exists()
    wait_until(lambda: not processes_in(shadow), what="the installer's end", timeout=10)


def test_install_sources_does_nothing_once_installed_or_without_snapshots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Neither an install nor a restart (which would replace this process): the calls are
    recorded instead, and a snapshot to install shows that they would be."""
    from simrun_harness import sources

    calls: list[str] = []
    monkeypatch.setattr(sources, "install_editable", lambda *_, **__: calls.append("install"))
    monkeypatch.setattr(sources, "restart", lambda *_, **__: calls.append("restart"))
    stop = threading.Event()

    sources.install_sources({}, stop)
    sources.install_sources({"SIMRUN_EDITABLE": "/nonexistent", SOURCES_INSTALLED: "1"}, stop)
    assert calls == [], "nothing to install, or installed already"

    sources.install_sources({"SIMRUN_EDITABLE": "/nonexistent"}, stop)
    assert calls == ["install", "restart"]


def test_a_snapshot_that_is_no_python_project_is_not_installed(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "model.py").write_text("VALUE = 1\n")
    install_editable([str(scripts)], "/nonexistent/python", tmp_path / "shadows")
    assert (tmp_path / "shadows" / "scripts" / "model.py").is_symlink(), "its shadow is there"
