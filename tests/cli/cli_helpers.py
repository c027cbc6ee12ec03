"""Helpers of the CLI tests: the real `simrun` command, conditions with deadlines, events."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from live_service import wait_until  # noqa: F401 - shared with the tests here

from simrun_core import events as ev
from simrun_core.planner import PodShape, TaskPlan
from simrun_core.states import TaskState
from simrun_core.workflow import TaskSpec, Workflow

RUN_ID = "20250102-030405-abcdef"
T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def git(repo: Path, *args: str) -> str:
    """Run git in a repository with a fixed identity; its stdout."""
    result = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def simrun_command() -> list[str]:
    """The installed `simrun` console script (the one of this interpreter)."""
    script = Path(sys.executable).parent / "simrun"
    if script.exists():
        return [str(script)]
    found = shutil.which("simrun")
    if found is None:
        pytest.fail("the console script simrun is not installed: pip install -e '.[dev]'")
    return [found]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a command: without the service variables of the caller."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("SIMRUN_URL", "SIMRUN_TOKEN", "SIMRUN_STORE", "COLUMNS")
    }
    env.update(extra)
    return env


def run_simrun(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run `simrun ARGS` in `cwd`, stdout and stderr captured as text (not a terminal)."""
    return subprocess.run(
        [*simrun_command(), *args],
        cwd=cwd,
        env=env if env is not None else cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def write_squares(directory: Path, n: int = 20, sleep_s: float = 0.0, **settings: Any) -> Path:
    """A workflow file of one `demo.squares` task in `directory`."""
    path = directory / "squares.yaml"
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": n, "sleep_s": sleep_s}}
    task["settings"].update(settings)
    path.write_text(yaml.safe_dump({"name": "squares", "tasks": [task]}, sort_keys=False))
    return path


def plan(task: str, units: int | None) -> TaskPlan:
    """A plan of one pod for a task, split into `units` (None: unsplit)."""
    shape = PodShape(
        cores=2,
        memory_gb=1,
        processes=2,
        per_worker_gb=0.25,
        retry_memory_gb=2,
        retry_per_worker_gb=0.5,
    )
    return TaskPlan(
        task_id=task,
        pods=1,
        shape=shape,
        base_priority="owner",
        extra_priority="owner",
        units=units,
    )


def two_task_events(units: int = 10) -> list[ev.Event]:
    """A run of a split task `scan` and an unsplit `report`, submitted, scan running."""
    workflow = Workflow(
        name="fit",
        tasks=[
            TaskSpec(id="scan", type="demo.squares", settings={"n": units}),
            TaskSpec(id="report", type="command", inputs={"data": "scan.squares"}),
        ],
    )
    seconds = iter(range(1, 1000))

    def at() -> datetime:
        return T0 + timedelta(seconds=next(seconds))

    return [
        ev.Submitted(
            seq=1,
            time=T0,
            run=RUN_ID,
            workflow=workflow,
            submitted_by="mk",
            owner="mk",
            plans={"scan": plan("scan", units), "report": plan("report", None)},
        ),
        ev.WorkflowSubmitted(seq=2, time=at(), name=f"simrun-{RUN_ID}"),
        ev.TaskStateChanged(seq=3, time=at(), task="scan", state=TaskState.RUNNING),
    ]


def unit_events(first_seq: int, task: str, indexes: range) -> list[ev.Event]:
    """`unit-done` events of a task, one per index, seq counting from `first_seq`."""
    return [
        ev.UnitDone(
            seq=first_seq + offset,
            time=T0 + timedelta(seconds=100 + offset),
            task=task,
            index=index,
            worker="w0",
        )
        for offset, index in enumerate(indexes)
    ]
