"""`simrun-exec` as a real process, with the test plugin type `harness_test_plugin:COPY`."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from simrun_core.events import WorkerReport

from .helpers import RUN_ID, HarnessTask, wait_until

COPY = "harness_test_plugin:COPY"


def copy_task(make_task, **settings: object) -> HarnessTask:
    """A task of the COPY type reading two outputs of an upstream task, `data` and `model`."""
    task: HarnessTask = make_task(settings, task_type=COPY, task="copy")
    upstream = task.store / "runs" / RUN_ID / "tasks" / "up" / "out"
    for port, files in {"data": {"a.txt": "A", "sub/b.txt": "B"}, "model": {"m.txt": "M"}}.items():
        for name, text in files.items():
            (upstream / port / name).parent.mkdir(parents=True, exist_ok=True)
            (upstream / port / name).write_text(text)
    task.env["SIMRUN_INPUTS"] = f"data=runs/{RUN_ID}/tasks/up/out/data\nmodel={upstream / 'model'}"
    task.env.pop("SIMRUN_WORKER")
    return task


def started(task: HarnessTask) -> dict:
    return json.loads((task.task_dir / "out" / "started").read_text())


def test_runs_the_command_with_staged_and_direct_inputs(make_task) -> None:
    task = copy_task(make_task)
    process = task.run("simrun-exec", SIMRUN_STAGE="data")
    assert process.returncode == 0, process.stderr_text

    facts = started(task)
    scratch = Path(task.env["SIMRUN_SCRATCH"])
    upstream = task.store / "runs" / RUN_ID / "tasks" / "up" / "out"
    assert facts["inputs"] == {"data": str(scratch / "data"), "model": str(upstream / "model")}
    assert facts["OMP_NUM_THREADS"] == facts["MKL_NUM_THREADS"] == "1"
    assert (scratch / "data" / "sub" / "b.txt").read_text() == "B"
    copied = task.task_dir / "out" / "copied"
    assert (copied / "data" / "sub" / "b.txt").read_text() == "B"
    assert (copied / "model" / "m.txt").read_text() == "M"

    events = task.events("copy")  # the worker is the task id without SIMRUN_WORKER
    assert [type(event) for event in events] == [WorkerReport]
    report = task.report("copy")
    assert (report.task, report.worker, report.exit_code, report.failed) == (
        "copy",
        "copy",
        0,
        False,
    )
    assert report.processes == 1 and report.per_worker_gb == 0.5
    assert report.peak_memory_bytes and report.peak_memory_bytes > 1 << 20
    assert report.cpu_seconds > 0
    said = [line for line in process.stderr_text.splitlines() if line.startswith("simrun ")]
    assert said[0].startswith("simrun harness: copy: running the command: "), said
    assert re.fullmatch(
        r"simrun harness: copy: the command ended with exit code 0 after \d+\.\d\d s", said[1]
    ), said


def test_failing_command_exits_3(make_task) -> None:
    task = copy_task(make_task, mode="fail")
    process = task.run("simrun-exec", SIMRUN_WORKER="x0")
    assert process.returncode == 3
    assert "copy_command: failing as asked" in process.stderr_text
    report = task.report("x0")
    assert (report.exit_code, report.failed) == (3, True)
    assert report.message.startswith("the command failed with exit code 2: ")


def test_command_killed_by_sigkill_exits_137(make_task) -> None:
    task = copy_task(make_task, mode="kill")
    process = task.run("simrun-exec")
    assert process.returncode == 137, process.stderr_text
    report = task.report("copy")
    assert (report.exit_code, report.failed) == (137, False)
    assert report.message == "the command was killed: signal SIGKILL"


def test_sigterm_is_passed_on_and_exits_143(make_task) -> None:
    task = copy_task(make_task, sleep_s=30)
    process = task.start("simrun-exec")
    wait_until(lambda: (task.task_dir / "out" / "started").exists(), what="the command")
    process.send_signal(signal.SIGTERM)  # the harness only: it must pass it on
    _, stderr = process.communicate(timeout=15)
    assert process.returncode == 143, stderr
    assert not Path(f"/proc/{started(task)['pid']}/cmdline").exists()
    report = task.report("copy")
    assert (report.exit_code, report.failed) == (143, False)
    assert report.message == "stopped on SIGTERM; the command ended with signal SIGTERM"


def test_command_ignoring_sigterm_is_killed_after_the_grace(make_task) -> None:
    task = copy_task(make_task, sleep_s=30, ignore_sigterm=True)
    process = task.start("simrun-exec", SIMRUN_GRACE_S="0.5")
    wait_until(lambda: (task.task_dir / "out" / "started").exists(), what="the command")
    time_signalled = time.monotonic()
    os.killpg(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=15)
    assert process.returncode == 143, stderr
    assert time.monotonic() - time_signalled >= 0.5
    assert task.report("copy").message.endswith("signal SIGKILL")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"SIMRUN_TASK_TYPE": "harness_test_plugin:BROKEN"}, "cannot start the command"),
        ({"SIMRUN_TASK_TYPE": "demo.squares"}, "'demo.squares' has no command to run"),
        ({"SIMRUN_STAGE": "other"}, "SIMRUN_STAGE: port 'other' is no input"),
        ({"SIMRUN_INPUTS": "data=runs/missing"}, "SIMRUN_INPUTS: input 'data'"),
    ],
)
def test_configuration_errors_exit_4(make_task, changes, message) -> None:
    task = copy_task(make_task)
    if changes.get("SIMRUN_INPUTS"):
        changes["SIMRUN_STAGE"] = "data"
    process = task.run("simrun-exec", **changes)
    assert process.returncode == 4
    assert message in process.stderr_text
    assert message in task.report("copy").message


def test_the_command_sees_the_provenance_of_its_task(make_task) -> None:
    task = copy_task(make_task)
    provenance = task.task_dir / "provenance.json"
    provenance.write_text('[{"name": "model", "commit": "abc123", "dirty": false}]')
    process = task.run("simrun-exec", SIMRUN_PROVENANCE=str(provenance))
    assert process.returncode == 0, process.stderr_text
    assert started(task)["SIMRUN_PROVENANCE"] == str(provenance)


def test_a_command_is_sized_as_one_process_unless_its_type_uses_cores(make_task) -> None:
    single = copy_task(make_task)
    process = single.run("simrun-exec", SIMRUN_CORES="2")
    assert process.returncode == 0, process.stderr_text
    assert started(single)["SIMRUN_CORES"] == "1"
    assert single.report("copy").processes == 1

    pool = copy_task(make_task)
    pool.env["SIMRUN_TASK_TYPE"] = "harness_test_plugin:POOL"
    expected = min(2, len(os.sched_getaffinity(0)))
    process = pool.run("simrun-exec", SIMRUN_CORES="2")
    assert process.returncode == 0, process.stderr_text
    assert started(pool)["SIMRUN_CORES"] == str(expected)
    assert pool.report("copy").processes == expected
    # the memory bounds the processes as for a worker: 0.75 GiB holds one of 0.5 GiB
    process = pool.run(
        "simrun-exec", SIMRUN_CORES="2", SIMRUN_MEMORY_LIMIT_GB="0.75", SIMRUN_ATTEMPT="1"
    )
    assert process.returncode == 0, process.stderr_text
    assert pool.report("copy", attempt=1).processes == 1
    assert json.loads((pool.task_dir / "out" / "started").read_text())["SIMRUN_CORES"] == "1"
