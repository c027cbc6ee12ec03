"""Runs with snapshots on a real local service: the code of the snapshot runs, in a venv of the
run, never an installed copy nor the working tree as it is now; the venv goes at the end of the
run, and one a killed service left is removed by the next.

The service runs in a venv of its own that sees this environment and has an installed copy of
the plugin (`VERSION = "installed"`): the service plans with its own `snap.echo` and the run
still runs the snapshot's (a type only a snapshot has is asked of the run's venv instead,
`test_snapshot_type_runs.py`). The working tree of
the plugin is a git repository nothing installs, committed with `VERSION = "committed"`,
changed to `"uncommitted"` when its snapshot is taken, and to `"later"` after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import msgspec
from editable_package import git_commit_all, install_copy, set_version, write_plugin
from live_service import LocalService, command, start_service, stop_service, wait_until

from simrun_api.backends import local_env
from simrun_cli.snapshots import snapshot_source
from simrun_core.provenance import SourceProvenance

PROBE = "import sys, shutil, snapplug; print(sys.prefix, snapplug.VERSION, shutil.which('python'))"


def service_python(tmp_path: Path) -> str:
    """A venv for the service that sees this environment, with an installed copy of the
    plugin."""
    python = local_env.create(tmp_path / "service-venv", [], tmp_path / "service-venv.log")
    site_packages = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    install_copy(Path(site_packages), "installed")
    return str(python)


def snapshot(tmp_path: Path, service: LocalService) -> SourceProvenance:
    """The snapshot of the plugin's working tree in the service's store (see the module)."""
    tree = write_plugin(tmp_path / "model", "committed")
    git_commit_all(tree)
    set_version(tree, "uncommitted")
    provenance = snapshot_source("model", tree, service.store)
    set_version(tree, "later")
    return provenance


def echo(task_id: str, **settings: object) -> dict[str, object]:
    return {"id": task_id, "type": "snap.echo", "settings": settings}


def result(service: LocalService, run_id: str, task: str) -> dict[str, str]:
    path = service.run_dir(run_id) / "tasks" / task / "out" / "result.json"
    return json.loads(path.read_text())


def test_a_run_with_a_snapshot_runs_the_snapshots_code_in_a_venv_of_its_own(
    tmp_path: Path,
) -> None:
    python = service_python(tmp_path)
    root = tmp_path / "project"
    root.mkdir()
    service = start_service(root, python)
    try:
        installed = subprocess.run(
            [python, "-c", "import snapplug; print(snapplug.VERSION)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert installed == "installed", "the service's environment has a copy of the plugin"
        provenance = snapshot(tmp_path, service)
        workflow = {
            "name": "snapshots",
            "tasks": [
                echo("echo", word="snap"),
                {**echo("again"), "inputs": {"after": "echo.out"}},
                command("probe", ["python", "-c", PROBE]),
            ],
        }
        run = service.submit(workflow, sources=[msgspec.to_builtins(provenance)])
        environment = root / ".simrun" / "envs" / run["id"]

        end = service.wait(run["id"])

        assert end["state"] == "succeeded", end
        produced = result(service, run["id"], "echo")
        assert produced["version"] == "uncommitted"
        shadow = environment / "sources" / "model"
        assert produced["file"] == str(shadow / "src" / "snapplug" / "__init__.py")
        assert produced["prefix"] == str(environment / "venv")
        assert produced["word"] == "snap"
        venv_python = environment / "venv" / "bin" / "python"
        # The harness ran with the venv's python: started for its task, or as the spare
        # started ahead (the task after the first harness task of the run is handed to it).
        harnesses = [f"simrun_harness.{entry}" for entry in ("exec", "spare")]
        assert produced["harness"][:2] == [str(venv_python), "-m"]
        assert produced["harness"][2] in harnesses
        again = result(service, run["id"], "again")
        assert again["version"] == "uncommitted"
        assert again["harness"][:3] == [str(venv_python), "-m", "simrun_harness.spare"]
        probe = service.client.get(f"/runs/{run['id']}/logs/probe").text
        assert f"{environment / 'venv'} uncommitted {venv_python}" in probe
        wait_until(lambda: not environment.exists(), what="the venv removed after the run")
        snapshot_dir = service.store / str(provenance.snapshot)
        assert not (snapshot_dir / "_build" / "built-by.txt").exists(), "written into the shadow"
    finally:
        stop_service(service)


def test_a_killed_service_leaves_a_venv_that_the_next_one_removes(tmp_path: Path) -> None:
    python = service_python(tmp_path)
    root = tmp_path / "project"
    root.mkdir()
    envs = root / ".simrun" / "envs"
    service = start_service(root, python)
    try:
        provenance = snapshot(tmp_path, service)
        workflow = {"name": "killed", "tasks": [echo("echo", sleep_s=2.0)]}
        run = service.submit(workflow, sources=[msgspec.to_builtins(provenance)])
        wait_until(
            lambda: any(e["type"] == "pod-started" for e in service.events(run["id"])),
            what="the start of the pod",
        )
        assert (envs / run["id"] / "venv" / "bin" / "python").exists()
        os.kill(service.process.pid, signal.SIGKILL)
        service.process.wait()
    finally:
        stop_service(service)
    assert (envs / run["id"]).exists(), "the killed service left its venv"
    gone = envs / "20260101-000000-0a0a0a"  # the venv of a run that is gone
    (gone / "venv").mkdir(parents=True)

    service = start_service(root, python)
    try:
        wait_until(lambda: not gone.exists(), what="the venv of a run that is gone removed")
        end = service.wait(run["id"])
        assert end["state"] == "succeeded", end
        assert result(service, run["id"], "echo")["version"] == "uncommitted"
        wait_until(lambda: not (envs / run["id"]).exists(), what="the venv removed at the end")
        installer_log = (service.run_dir(run["id"]) / "environment.log").read_text()
        installs = [line for line in installer_log.splitlines() if line.startswith("$ ")]
        assert len(installs) == 1, "the resumed run reused the complete venv the service left"
    finally:
        stop_service(service)
