"""The spare harness process (`simrun_harness.spare`): what it becomes on its order, and how it
ends without one; the fork server (`--forks`) of the spares of any run."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from simrun_core.spare_order import (
    UNCLAIMED_RUN,
    SpareEnded,
    SpareNews,
    SpareOrder,
    SpareStarted,
)

from .helpers import RUN_ID, HarnessTask, wait_until

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


CLAIM = """
import sys
from simrun_harness.spare import claim_run, run_slot
slot = run_slot()
print(slot is not None and claim_run(slot, sys.argv[1]), flush=True)
sys.stdin.read()
"""


def test_a_spare_for_any_run_writes_its_run_over_the_placeholder_that_proc_shows() -> None:
    """/proc/<pid>/environ (what finds the processes of a run) shows the run it took up."""
    env = {**os.environ, "SIMRUN_RUN": UNCLAIMED_RUN}
    process = subprocess.Popen(
        [sys.executable, "-c", CLAIM, RUN_ID],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "True"
        entries = Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        assert f"SIMRUN_RUN={RUN_ID}".encode() in entries
        assert f"SIMRUN_RUN={UNCLAIMED_RUN}".encode() not in entries
    finally:
        process.communicate("", timeout=60)
    assert process.returncode == 0


def test_a_spare_that_cannot_take_the_run_starts_the_harness_anew(tmp_path: Path) -> None:
    """A run id longer than the placeholder: the spare execs the harness with the order's
    environment, which then runs (here it refuses the launch, naming its variable)."""
    log = tmp_path / "w0-0.log"
    fresh = tmp_path / "fresh"  # a python starting with the order's PYTHONPATH writes it
    fresh.mkdir()
    (fresh / "sitecustomize.py").write_text(
        "import pathlib\n"
        "shown = pathlib.Path('/proc/self/environ').read_bytes()\n"
        "pathlib.Path(__file__).with_name('environ').write_bytes(shown)\n"
    )
    long_run = "r" * (len(UNCLAIMED_RUN) + 1)
    order_env = {"SIMRUN_RUN": long_run, "PATH": os.environ["PATH"], "PYTHONPATH": str(fresh)}
    order = SpareOrder(entry="worker", env=order_env, cwd=str(tmp_path), log=str(log))
    done = subprocess.run(
        [sys.executable, "-m", "simrun_harness.spare"],
        env={**os.environ, "SIMRUN_RUN": UNCLAIMED_RUN},
        input=msgspec.json.encode(order),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 4, log.read_text()
    assert "simrun-worker: SIMRUN_TASK_DIR" in log.read_text()
    assert f"SIMRUN_RUN={long_run}".encode() in (fresh / "environ").read_bytes().split(b"\0")


class ForkServer:
    """`python -m simrun_harness.spare --forks` with its pipes: orders in, news out."""

    def __init__(self, **env: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "simrun_harness.spare", "--forks"],
            env={**os.environ, "SIMRUN_RUN": UNCLAIMED_RUN, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )

    def order(self, order: SpareOrder) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(msgspec.json.encode(order) + b"\n")
        self.process.stdin.flush()

    def news(self) -> SpareNews:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the fork server closed its stdout"
        return msgspec.json.decode(line, type=SpareNews)

    def waiting(self) -> list[int]:
        """The children of the server: its spares waiting (and the harnesses running)."""
        tasks = Path(f"/proc/{self.process.pid}/task")
        return [
            int(pid) for task in tasks.iterdir() for pid in (task / "children").read_text().split()
        ]

    def close(self) -> int:
        assert self.process.stdin is not None
        self.process.stdin.close()
        return self.process.wait(timeout=60)


def shows_run(pid: int) -> bool:
    """Whether /proc/<pid>/environ shows `SIMRUN_RUN` of `RUN_ID`."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return f"SIMRUN_RUN={RUN_ID}".encode() in environ


def test_the_fork_server_forks_the_harness_of_each_order_and_tells_its_pid_and_end(
    make_task: Callable[..., HarnessTask],
) -> None:
    server = ForkServer()
    try:
        for _ in range(2):  # the spare waiting is replaced by another after each order
            task = make_task({"n": 3, "sleep_s": 0.3})
            log = task.task_dir / "w0-0.log"
            env = task.environment(SIMRUN_RUN=RUN_ID)
            server.order(SpareOrder(entry="worker", env=env, cwd=str(task.task_dir), log=str(log)))
            started = server.news()
            assert isinstance(started, SpareStarted), started
            pid = started.pid
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            assert int(stat[1]) == server.process.pid  # a child of the server...
            assert os.getsid(pid) == pid  # ...in a session (and a process group) of its own
            wait_until(
                functools.partial(shows_run, pid), what="its run"
            )  # among the run's processes
            assert server.news() == SpareEnded(pid=pid, returncode=0), log.read_text()
            assert task.summary() == {"n": 3, "sum": 0 + 1 + 4}
            report = task.report()
            assert report.exit_code == 0 and report.units_done == 3
            assert 0 <= report.prepare_seconds < 5  # from its order, not the server's start
            assert report.cpu_seconds < 5  # its own, not the imports of the server
    finally:
        waiting = server.waiting()
        assert len(waiting) == 1  # the next spare, forked ahead
        assert server.close() == 0
    wait_until(lambda: not Path(f"/proc/{waiting[0]}").exists(), what="the spare's end")


def test_the_fork_server_tells_the_exit_code_of_a_harness_that_fails(tmp_path: Path) -> None:
    server = ForkServer()
    try:
        log = tmp_path / "w0-0.log"
        env = {"SIMRUN_RUN": RUN_ID, "PATH": os.environ["PATH"]}
        server.order(SpareOrder(entry="worker", env=env, cwd=str(tmp_path), log=str(log)))
        started = server.news()
        assert isinstance(started, SpareStarted)
        assert server.news() == SpareEnded(pid=started.pid, returncode=4)
        assert "simrun-worker: SIMRUN_TASK_DIR" in log.read_text()
        server.order(SpareOrder(entry="rm -rf", env=env, cwd=str(tmp_path), log=str(log)))
        refused = server.news()
        assert isinstance(refused, SpareStarted)
        assert server.news() == SpareEnded(pid=refused.pid, returncode=4)  # no order: exit 4
    finally:
        assert server.close() == 0


def test_the_fork_server_forks_the_next_spare_later_and_for_an_order_meanwhile_at_once(
    tmp_path: Path,
) -> None:
    """The next spare is not forked while the harness just handed its order starts; an order
    that comes before it is given a spare forked for it."""
    server = ForkServer(SIMRUN_SPARE_REFILL_S="3600")
    try:
        wait_until(lambda: len(server.waiting()) == 1, what="the first spare")
        log = tmp_path / "w0-0.log"
        env = {"SIMRUN_RUN": RUN_ID, "PATH": os.environ["PATH"]}
        for _ in range(2):
            server.order(SpareOrder(entry="worker", env=env, cwd=str(tmp_path), log=str(log)))
            started = server.news()
            assert isinstance(started, SpareStarted)
            assert server.news() == SpareEnded(pid=started.pid, returncode=4)
            assert server.waiting() == []  # the next spare is due in an hour
    finally:
        assert server.close() == 0
