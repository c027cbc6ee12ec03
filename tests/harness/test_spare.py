"""The spare harness process (`simrun_harness.spare`): what it becomes on its order, and how it
ends without one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec

from simrun_core.spare_order import SpareOrder

BECOME = """
import json, os, sys
from simrun_core.spare_order import SpareOrder
from simrun_harness.spare import become
import msgspec
order = msgspec.json.decode(sys.argv[1], type=SpareOrder)
become(order, list(sys.path))
import model_module
print(json.dumps({
    "cwd": os.getcwd(),
    "env": dict(os.environ),
    "path": sys.path[:2],
    "module": model_module.__file__,
    "stdin": sys.stdin.read(),
}))
print("and the errors", file=sys.stderr)
"""


def test_a_spare_takes_the_environment_directory_path_and_log_of_its_task(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model_module.py").write_text("")
    task = tmp_path / "task"
    task.mkdir()
    log = tmp_path / "w0-0.log"
    log.write_text("earlier\n")
    env = {"PYTHONPATH": str(model), "SIMRUN_RUN": "r1", "PATH": "/usr/bin:/bin"}
    order = SpareOrder(entry="worker", env=env, cwd=str(task), log=str(log))
    done = subprocess.run(
        [sys.executable, "-c", BECOME, msgspec.json.encode(order).decode()],
        cwd=tmp_path,
        input="not for the task",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == done.stderr == ""  # both went to the log
    earlier, line, errors = log.read_text().splitlines()
    assert earlier == "earlier" and errors == "and the errors"
    seen = json.loads(line)
    assert seen["cwd"] == str(task)
    assert seen["env"] == env  # nothing of the spare's own environment is left
    assert seen["path"] == [str(task), str(model)]  # as `python -m` in the task's directory
    assert seen["module"] == str(model / "model_module.py")
    assert seen["stdin"] == ""


def spare(stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "simrun_harness.spare"],
        input=stdin,
        capture_output=True,
        timeout=60,
    )


def test_a_spare_whose_service_went_away_ends_without_doing_anything() -> None:
    done = spare(b"")
    assert done.returncode == 0
    assert done.stdout == done.stderr == b""


def test_a_spare_refuses_an_order_that_is_none() -> None:
    done = spare(b'{"entry": "rm -rf", "env": {}, "cwd": "/", "log": "/dev/null"}')
    assert done.returncode == 4
    assert b"simrun-spare: the order is not one" in done.stderr
    done = spare(b"{not json")
    assert done.returncode == 4
