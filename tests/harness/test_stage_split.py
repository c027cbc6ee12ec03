"""`stage` on a split task (issue 15): `simrun-worker` copies the ports of `SIMRUN_STAGE` into
its scratch before its units, and the setup, the units and the merge read the copies; the
type is `stage_plugin:READ` (tests/harness/plugins), whose units note where they read."""

from __future__ import annotations

import json
from pathlib import Path

from .helpers import RUN_ID, HarnessTask

READ = "stage_plugin:READ"
N = 4


def read_task(make_task) -> HarnessTask:
    """A task of `test.read` whose input `data` is an output of an upstream task."""
    task: HarnessTask = make_task({"n": N}, task_type=READ, task="read")
    upstream = task.store / "runs" / RUN_ID / "tasks" / "up" / "out" / "data"
    upstream.mkdir(parents=True)
    for index in range(N):
        (upstream / f"{index}.txt").write_text(f"text {index}")
    task.env["SIMRUN_INPUTS"] = f"data=runs/{RUN_ID}/tasks/up/out/data"
    return task


def seen(task: HarnessTask) -> list[dict[str, object]]:
    out = task.task_dir / "out" / "seen"
    return [json.loads((out / f"{index}.json").read_text()) for index in range(N)]


def test_the_units_of_a_split_task_read_the_staged_copies(make_task) -> None:
    task = read_task(make_task)
    process = task.run("simrun-worker", SIMRUN_STAGE="data")
    assert process.returncode == 0, process.stderr_text

    copy = Path(task.env["SIMRUN_SCRATCH"]) / "data"
    assert sorted(path.name for path in copy.iterdir()) == [f"{i}.txt" for i in range(N)]
    for index, unit in enumerate(seen(task)):
        assert unit == {"path": str(copy), "in_scratch": True, "text": f"text {index}"}
    summary = task.summary()
    assert summary["merge"] == {"path": str(copy), "in_scratch": True}
    assert summary["texts"] == [f"text {i}" for i in range(N)]
    assert task.report().exit_code == 0


def test_without_stage_the_units_read_the_store(make_task) -> None:
    task = read_task(make_task)
    process = task.run("simrun-worker")
    assert process.returncode == 0, process.stderr_text
    upstream = task.store / "runs" / RUN_ID / "tasks" / "up" / "out" / "data"
    assert {unit["path"] for unit in seen(task)} == {str(upstream)}
    assert not (Path(task.env["SIMRUN_SCRATCH"]) / "data").exists()


def test_simrun_merge_reads_the_staged_copies_too(make_task) -> None:
    task = read_task(make_task)
    computed = task.run("simrun-worker", SIMRUN_MERGE="0")
    assert computed.returncode == 0, computed.stderr_text
    merged = task.run("simrun-merge", SIMRUN_STAGE="data", SIMRUN_WORKER=None)
    assert merged.returncode == 0, merged.stderr_text
    copy = Path(task.env["SIMRUN_SCRATCH"]) / "data"
    assert task.summary()["merge"] == {"path": str(copy), "in_scratch": True}


def test_a_staged_input_that_is_missing_is_a_configuration_error(make_task) -> None:
    task = read_task(make_task)
    task.env["SIMRUN_INPUTS"] = f"data=runs/{RUN_ID}/tasks/up/out/nothing"
    process = task.run("simrun-worker", SIMRUN_STAGE="data")
    assert process.returncode == 4, process.stderr_text
    assert "input 'data'" in process.stderr_text and "cannot stage it" in process.stderr_text
    assert not (task.task_dir / "out" / "seen").exists(), "no unit ran"
