"""Task types only a run's snapshots have, on a real local service (issue 13): the service learns
them from the run's own environment (its venv, made at the submission and then run in), never
by importing them; a restart resumes the run with the types its `submitted` event recorded.

The plugin `treeplug` (`tree.sum`, split, and `tree.note`, a command) is a git working tree
nothing installs: not the service's environment (`find_spec` fails in its python), nor any
other. It is committed with `FACTOR = 1`, changed to 7 when its snapshot is taken (an
uncommitted change to the unit code) and to 100 after.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from editable_package import (
    git_commit_all,
    set_factor,
    write_broken_plugin,
    write_tree_plugin,
)
from live_service import LocalService, start_service, stop_service, wait_until
from unit_events import unit_indices

from simrun_api.backends.local import LocalBackend
from simrun_api.snapshot_types import snapshot_types
from simrun_cli.snapshots import snapshot_source
from simrun_core.plugins import load_task_types
from simrun_core.provenance import SourceProvenance
from simrun_core.wire import SubmitRequest

N = 8


def assert_not_installed(python: str) -> None:
    """The plugin is nowhere the service's python finds it."""
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec('treeplug') is not None)"
    assert subprocess.run([python, "-c", code]).returncode == 0, "treeplug is installed"


def plugin_snapshot(tmp_path: Path, store: Path, **meta: object) -> dict[str, Any]:
    """The snapshot of `treeplug`'s tree in the store, taken with an uncommitted FACTOR = 7."""
    tree = write_tree_plugin(tmp_path / "model", factor=1, **meta)
    git_commit_all(tree)
    set_factor(tree, 7)
    provenance: SourceProvenance = snapshot_source("model", tree, store)
    set_factor(tree, 100)
    return msgspec.to_builtins(provenance)


def sum_task(task_id: str = "sum", **settings: object) -> dict[str, Any]:
    return {"id": task_id, "type": "tree.sum", "settings": {"n": N, **settings}}


def note_task() -> dict[str, Any]:
    return {
        "id": "note",
        "type": "tree.note",
        "settings": {"word": "tree"},
        "inputs": {"values": "sum.values"},
    }


def out(service: LocalService, run_id: str, task: str, name: str) -> dict[str, Any]:
    path = service.run_dir(run_id) / "tasks" / task / "out" / name
    return json.loads(path.read_text())


def envs(service: LocalService) -> list[str]:
    directory = service.root / ".simrun" / "envs"
    return sorted(entry.name for entry in directory.iterdir()) if directory.exists() else []


def runs(service: LocalService) -> list[str]:
    directory = service.store / "runs"
    return sorted(entry.name for entry in directory.iterdir()) if directory.exists() else []


def test_a_type_only_the_snapshot_has_runs_its_code_through_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    assert_not_installed(sys.executable)
    service = start_service(root)
    try:
        source = plugin_snapshot(tmp_path, service.store)
        workflow = {"name": "tree", "tasks": [sum_task(sleep_s=0.3, scale=2.0), note_task()]}
        run = service.submit(workflow, sources=[source])
        run_id = run["id"]
        environment = root / ".simrun" / "envs" / run_id
        [submitted] = [e for e in service.events(run_id) if e["type"] == "submitted"]
        recorded = submitted["snapshot_types"]
        assert sorted(recorded) == ["tree.note", "tree.sum"]
        assert recorded["tree.sum"]["count_units"] == "treeplug.units:count_units"
        assert recorded["tree.sum"]["answers"][0]["units"] == N
        assert submitted["plans"]["sum"]["units"] == N
        wait_until(
            lambda: unit_indices(service.events(run_id)) != [],
            what="a unit done",
        )
        os.kill(service.process.pid, signal.SIGKILL)  # mid-run
        service.process.wait()
    finally:
        stop_service(service)
    done = unit_indices(service.events(run_id))
    assert 0 < len(done) < N, "killed mid-run"
    assert (environment / "ready").exists(), "the killed service left the run's venv"

    service = start_service(root)
    try:
        end = service.wait(run_id)
        assert end["state"] == "succeeded", end
        summary = out(service, run_id, "sum", "summary.json")
        assert summary["factor"] == 7, "the uncommitted change of the snapshot ran"
        assert summary["sum"] == 7 * 2.0 * sum(range(N))
        shadow = environment / "sources" / "model"
        assert summary["file"] == str(shadow / "src" / "treeplug" / "units.py")
        note = out(service, run_id, "note", "note.json")
        assert note == {
            "word": "tree",
            "values": N,
            "factor": 7,
            "prefix": str(environment / "venv"),
        }
        wait_until(lambda: not environment.exists(), what="the venv removed after the run")
        log = (service.run_dir(run_id) / "environment.log").read_text()
        installs = [line for line in log.splitlines() if line.startswith("$ ")]
        assert len(installs) == 1, "one venv: made at the submission, run in, resumed in"

        # What the run taught is learned for the type of the snapshot; an estimate of it asks
        # a venv of its own, which goes at once.
        response = service.client.post(
            "/estimate",
            json={
                "workflow": {"name": "again", "tasks": [sum_task(scale=2.0)]},
                "sources": [source],
            },
        )
        assert response.status_code == 200, response.text
        assert response.json()["sum"]["resources"]["source"].startswith("learned from 1 run")
        assert envs(service) == []
    finally:
        stop_service(service)


REFUSALS = [
    pytest.param(
        [sum_task(n="many")],
        ["task 'sum': settings.n: expected `int`, got `str`"],
        id="a setting the plugin refuses",
    ),
    pytest.param(
        [sum_task(n=5000)],
        ["task 'sum': settings: counting its units failed: ValueError: at most 1000 numbers"],
        id="units the plugin cannot count",
    ),
    pytest.param(
        [sum_task(), {"id": "x", "type": "tree.nope", "settings": {}}],
        ["task 'x': type: unknown task type 'tree.nope' (known: "],
        id="a type neither has",
    ),
    pytest.param(
        [sum_task(colour="red")],
        ["task 'sum': settings: unknown setting 'colour'"],
        id="an unknown setting",
    ),
]


@pytest.fixture
def refusing(tmp_path: Path) -> Any:
    root = tmp_path / "project"
    root.mkdir()
    service = start_service(root)
    try:
        yield service, plugin_snapshot(tmp_path, service.store)
    finally:
        stop_service(service)


@pytest.mark.parametrize(("tasks", "errors"), REFUSALS)
def test_a_refused_task_of_a_snapshot_type_is_named_and_leaves_nothing(
    refusing: tuple[LocalService, dict[str, Any]], tasks: list[dict[str, Any]], errors: list[str]
) -> None:
    service, source = refusing
    body = {"workflow": {"name": "refused", "tasks": tasks}, "sources": [source]}
    response = service.client.post("/runs", json=body)
    assert response.status_code == 422, response.text
    found = response.json()["errors"]
    assert len(found) == len(errors), found
    for text, expected in zip(found, errors, strict=True):
        assert text.startswith(expected), found
    if "tree.nope" in errors[0]:
        assert "tree.sum" in found[0], "the types of the snapshot are known"
    assert envs(service) == [], "the venv of the refused submission is gone"
    assert runs(service) == []


def test_a_type_whose_plugin_raises_or_whose_venv_fails_is_refused_naming_why(
    tmp_path: Path,
) -> None:
    root = tmp_path / "project"
    root.mkdir()
    service = start_service(root)
    try:
        broken = write_broken_plugin(tmp_path / "broken")
        git_commit_all(broken)
        source = msgspec.to_builtins(snapshot_source("model", broken, service.store))
        task = {"id": "b", "type": "tree.broken", "settings": {}}
        body = {"workflow": {"name": "broken", "tasks": [task]}, "sources": [source]}
        response = service.client.post("/runs", json=body)
        assert response.status_code == 422, response.text
        assert response.json()["errors"] == [
            "task 'b': type: the task type 'tree.broken' of the snapshots cannot be loaded: "
            "RuntimeError: the plugin breaks as it is imported"
        ]
        assert envs(service) == [] and runs(service) == []

        failing = plugin_snapshot(tmp_path / "failing", service.store, fail="no build today")
        body = {"workflow": {"name": "failing", "tasks": [sum_task()]}, "sources": [failing]}
        response = service.client.post("/runs", json=body)
        assert response.status_code == 422, response.text
        [error] = response.json()["errors"]
        assert error.startswith(
            "task 'sum': type: the task type 'tree.sum' is none of the service's, and the "
            "environment of the snapshots cannot be asked about it: "
        ), error
        assert "no build today" in error
        assert envs(service) == [] and runs(service) == []
    finally:
        stop_service(service)


def test_a_submission_abandoned_while_its_venv_is_made_kills_the_installer_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    backend = LocalBackend(tmp_path / "store", tmp_path / "scratch", envs=tmp_path / "envs")
    backend.store.mkdir()
    source = plugin_snapshot(tmp_path, backend.store, sleep_s=30)
    request = msgspec.convert(
        {"workflow": {"name": "slow", "tasks": [sum_task()]}, "sources": [source]}, SubmitRequest
    )
    run_id = "20260101-000000-0b0b0b"
    environment = tmp_path / "envs" / run_id

    async def scenario() -> None:
        asking = asyncio.create_task(
            snapshot_types(backend, backend.store, load_task_types(), request, run_id)
        )
        while not (environment / "environment.log").exists():
            await asyncio.sleep(0.02)
        began = time.monotonic()
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
        while environment.exists():
            assert time.monotonic() - began < 10, "the venv of the abandoned submission stays"
            await asyncio.sleep(0.02)

    asyncio.run(scenario())
