"""The venv of a local run with snapshots (`local_env`) and how the local backend uses it: made
before the first process, its python the harness's, removed at the end of the run, a failure
failing the run, a cancel killing the installer, and what `recover` removes."""

from __future__ import annotations

import asyncio
import os
import site
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from editable_package import git_commit_all, set_version, write_plugin
from live_service import processes_in

from simrun_api.backends import local_env
from simrun_api.backends.base import RunSubmission
from simrun_api.backends.local import LocalBackend
from simrun_cli.snapshots import snapshot_source
from simrun_core import editable, exits
from simrun_core import events as ev
from simrun_core.fold import RunRecord, fold
from simrun_core.planner import Node, plan_task
from simrun_core.plugins import load_task_types
from simrun_core.provenance import SourceProvenance
from simrun_core.resources import resolve_resources
from simrun_core.store import LogWriter, RunPaths
from simrun_core.workflow import Priority, SplitMode, TaskSpec, Workflow

from .contract import Reports

RUN = "20260101-000000-0e0e0e"
INSTALLERS = [
    "pip",
    pytest.param(
        "uv", marks=pytest.mark.skipif(editable.uv_binary() is None, reason="no uv installed")
    ),
]


@pytest.fixture
def installer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The installer of the test: pip (uv hidden), or uv."""
    if request.param == "pip":
        monkeypatch.setattr(editable, "uv_binary", lambda: None)
    return str(request.param)


def plugin_snapshot(tmp_path: Path, store: Path, **meta: object) -> SourceProvenance:
    """The provenance of a snapshot of the plugin's working tree (with an uncommitted change)."""
    tree = write_plugin(tmp_path / "model", "committed", **meta)
    git_commit_all(tree)
    set_version(tree, "uncommitted")
    store.mkdir(parents=True, exist_ok=True)
    return snapshot_source("model", tree, store)


def run_python(python: Path, code: str) -> str:
    return subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


# -- the venv -------------------------------------------------------------------------------------


@pytest.mark.parametrize("installer", INSTALLERS, indirect=True)
def test_the_venv_sees_the_service_and_has_the_snapshots(tmp_path: Path, installer: str) -> None:
    provenance = plugin_snapshot(tmp_path, tmp_path / "store")
    assert provenance.snapshot is not None
    snapshot = str(tmp_path / "store" / provenance.snapshot)
    directory = tmp_path / "envs" / RUN
    log = tmp_path / "environment.log"

    python = local_env.create(directory, [snapshot], log)

    assert python == directory / "venv" / "bin" / "python"
    facts = run_python(
        python,
        "import sys, snapplug, simrun_harness; "
        "print(sys.prefix, snapplug.VERSION, snapplug.__file__, simrun_harness.__file__)",
    ).split()
    assert facts[:3] == [
        str(directory / "venv"),
        "uncommitted",
        str(directory / "sources" / "model" / "src" / "snapplug" / "__init__.py"),
    ]
    assert facts[3].startswith(str(Path(__file__).parents[2])), "simrun of the service"
    assert local_env.is_ready(directory, [snapshot])
    assert not local_env.is_ready(directory, [snapshot, snapshot])
    assert (installer == "uv") == ("uv pip install" in log.read_text())
    local_env.remove(directory)
    assert not directory.exists()


def test_the_site_dirs_are_those_of_this_python() -> None:
    dirs = local_env.base_site_dirs()
    assert dirs[0] == site.getsitepackages()[0]
    assert all(os.path.isdir(directory) for directory in dirs)


def test_the_installer_is_uv_on_path_else_pip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    programs = tmp_path / "bin"
    programs.mkdir()
    (programs / "uv").write_text("#!/bin/sh\nexit 0\n")
    (programs / "uv").chmod(0o755)
    monkeypatch.setenv("PATH", str(programs))
    python = tmp_path / "venv" / "bin" / "python"
    assert local_env.installer(python) == [
        str(programs / "uv"),
        "pip",
        "install",
        "--python",
        str(python),
    ]
    monkeypatch.setattr(editable, "uv_binary", lambda: None)
    assert local_env.installer(python) == [str(python), "-m", "pip", "install"]
    monkeypatch.setattr(editable, "has_pip", lambda: False)
    with pytest.raises(local_env.RunEnvironmentError, match="neither uv nor pip"):
        local_env.installer(python)


@pytest.mark.parametrize("installer", INSTALLERS, indirect=True)
def test_a_failed_install_names_the_installers_error(tmp_path: Path, installer: str) -> None:
    provenance = plugin_snapshot(tmp_path, tmp_path / "store", fail="on purpose")
    snapshot = str(tmp_path / "store" / str(provenance.snapshot))
    with pytest.raises(local_env.RunEnvironmentError) as raised:
        local_env.create(tmp_path / "env", [snapshot], tmp_path / "environment.log")
    message = str(raised.value)
    assert message.startswith(f"{installer} exited with code "), message
    assert "the test backend fails as asked: on purpose" in message


def test_a_cancel_kills_the_installer(tmp_path: Path) -> None:
    provenance = plugin_snapshot(tmp_path, tmp_path / "store", sleep_s=60)
    snapshot = str(tmp_path / "store" / str(provenance.snapshot))
    began = time.monotonic()
    with pytest.raises(local_env.RunEnvironmentError, match="cancelled"):
        local_env.create(
            tmp_path / "env",
            [snapshot],
            tmp_path / "environment.log",
            cancelled=lambda: time.monotonic() - began > 1.0,
        )
    assert time.monotonic() - began < 10


# -- the local backend ----------------------------------------------------------------------------


def record_of(run_id: str, sources: list[SourceProvenance], *tasks: TaskSpec) -> RunRecord:
    """The record of a run of tasks (of installed types) with sources, as the service folds it."""
    types = load_task_types()
    plans = {}
    nodes = [Node(name="node", cores=2, memory_gb=4.0)]
    for spec in tasks:
        task_type = types[spec.type]
        decoded = task_type.decode_settings(spec.settings)
        resources = resolve_resources(spec, task_type, decoded)
        plans[spec.id] = plan_task(
            spec, task_type, resources, nodes, SplitMode.FASTEST, Priority.OWNER, None
        )
    submitted = ev.Submitted(
        seq=1,
        run=run_id,
        workflow=Workflow(name="env", tasks=list(tasks)),
        submitted_by="test",
        owner="test",
        sources=sources,
        plans=plans,
    )
    return fold([submitted])


def command(task_id: str, args: list[str]) -> TaskSpec:
    settings = {"image": "none", "args": args, "cores": 1, "memory_gb": 0.5}
    return TaskSpec(id=task_id, type="command", settings=settings)


def write_log(store: Path, record: RunRecord, *events: ev.Event) -> None:
    """The run's log as its actor would have written it (the submission, then `events`)."""
    paths = RunPaths(store, record.id)
    paths.dir.mkdir(parents=True, exist_ok=True)
    submitted = ev.Submitted(
        seq=1, run=record.id, workflow=record.workflow, submitted_by="test", owner="test"
    )
    writer = LogWriter(paths.events)
    try:
        writer.append(submitted)
        for seq, event in enumerate(events, start=2):
            writer.append(msgspec.structs.replace(event, seq=seq))
    finally:
        writer.close()


def backend_of(tmp_path: Path) -> LocalBackend:
    store = tmp_path / "store"
    return LocalBackend(store, tmp_path / "scratch", cores=2, memory_gb=4.0, envs=tmp_path / "envs")


READY = frozenset({"probe", "first", "second"})
"""The tasks of these runs the decider starts at their submission (none reads from another)."""

PROBE = (
    "import os, sys, shutil, snapplug; "
    "print(sys.prefix, snapplug.VERSION, shutil.which('python'), os.environ['PYTHONPATH'])"
)


def test_a_run_with_snapshots_runs_in_its_venv_which_goes_at_its_end(tmp_path: Path) -> None:
    backend = backend_of(tmp_path)
    provenance = plugin_snapshot(tmp_path, backend.store)
    record = record_of(RUN, [provenance], command("probe", ["python", "-c", PROBE]))
    environment = tmp_path / "envs" / RUN

    async def scenario() -> None:
        reports = Reports()
        await backend.submit(RunSubmission(record, load_task_types(), ready=READY), reports)
        end = await reports.ended("probe", 0)
        assert end.phase == "succeeded", end
        await until(lambda: not backend.has(RUN))

    asyncio.run(scenario())
    [log] = RunPaths(backend.store, RUN).logs("probe").glob("*.log")
    prefix, version, python, python_path = log.read_text().split()
    assert prefix == str(environment / "venv")
    assert version == "uncommitted"
    assert python == str(environment / "venv" / "bin" / "python"), "the venv first on PATH"
    assert python_path.split(os.pathsep)[0] == str(environment / "sources" / "model")
    assert not environment.exists(), "the venv is removed at the end of the run"
    assert (RunPaths(backend.store, RUN).dir / "environment.log").exists()


async def until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_venv_that_cannot_be_made_fails_the_first_pod_with_the_installers_error(
    tmp_path: Path,
) -> None:
    backend = backend_of(tmp_path)
    provenance = plugin_snapshot(tmp_path, backend.store, fail="on purpose")
    record = record_of(RUN, [provenance], command("first", ["true"]), command("second", ["true"]))

    async def scenario() -> None:
        reports = Reports()
        await backend.submit(RunSubmission(record, load_task_types(), ready=READY), reports)
        end = await reports.ended("first", 0)
        assert end.exit_code == exits.CONFIGURATION
        assert end.message is not None
        assert end.message.startswith("the environment of the run cannot be created: ")
        assert "the test backend fails as asked: on purpose" in end.message
        await until(lambda: not backend.has(RUN))
        assert reports.of("second") == [], "nothing else was started"

        failures: list[str] = []
        told = RunSubmission(
            record, load_task_types(), ready=READY, environment_failed=failures.append
        )
        other = Reports()
        await backend.submit(told, other)
        await until(lambda: failures and not backend.has(RUN))
        assert other.changes == [], "told through environment_failed, no pod failed"
        assert "the test backend fails as asked: on purpose" in failures[0]

    asyncio.run(scenario())
    assert not (tmp_path / "envs" / RUN).exists()


def test_a_cancel_while_the_venv_is_made_kills_the_installer(tmp_path: Path) -> None:
    backend = backend_of(tmp_path)
    provenance = plugin_snapshot(tmp_path, backend.store, sleep_s=60)
    record = record_of(RUN, [provenance], command("first", ["true"]))

    async def scenario() -> None:
        reports = Reports()
        await backend.submit(RunSubmission(record, load_task_types(), ready=READY), reports)
        shadow = tmp_path / "envs" / RUN / "sources" / "model"
        await until(lambda: processes_in(shadow))  # the installer, waiting in the backend
        began = time.monotonic()
        await backend.cancel(RUN)
        assert time.monotonic() - began < 5
        assert not backend.has(RUN)
        assert reports.changes == []
        await until(lambda: not processes_in(shadow), timeout=10)

    asyncio.run(scenario())
    assert not (tmp_path / "envs" / RUN).exists()


def test_recover_removes_the_venvs_of_runs_that_ended_or_are_gone(tmp_path: Path) -> None:
    backend = backend_of(tmp_path)
    envs = tmp_path / "envs"
    live = record_of("20260101-000000-111111", [], command("a", ["true"]))
    ended = record_of("20260101-000000-222222", [], command("a", ["true"]))
    write_log(backend.store, live)
    write_log(backend.store, ended, ev.Succeeded())
    for run_id in (live.id, ended.id, "20260101-000000-333333"):  # the last one is gone
        (envs / run_id / "venv" / "bin").mkdir(parents=True)
        (envs / run_id / "sources" / "model").mkdir(parents=True)
        (envs / run_id / "sources" / "model" / "link").symlink_to(sys.executable)

    assert asyncio.run(backend.recover()) == 2

    assert sorted(path.name for path in envs.iterdir()) == [live.id]
    assert Path(sys.executable).exists()


def test_a_snapshot_that_is_no_python_project_makes_a_venv_without_installing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "model.py").write_text("VALUE = 1\n")
    monkeypatch.setattr(editable, "uv_binary", lambda: pytest.fail("no installer is needed"))
    python = local_env.create(tmp_path / "env", [str(scripts)], tmp_path / "install.log")
    assert python.exists()
    assert (tmp_path / "env" / "sources").exists()
