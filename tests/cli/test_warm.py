"""The warm command process: commands run in its forks exactly as by themselves, only sooner."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import cli_env, run_simrun, simrun_command, wait_until, write_squares

from simrun_cli import warm_wire
from simrun_cli.local import pid_alive, read_service, stop_local

COLD = {"SIMRUN_WARM": "0"}
PATIENCE_S = 120.0
"""How long a process may take to start, take a request or end on a busy machine: a bound only
a hang exceeds; every wait below ends as soon as its condition holds."""


def warm_log(root: Path) -> list[str]:
    path = root / ".simrun" / "warm.log"
    return path.read_text().splitlines() if path.exists() else []


def answers(root: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(root / warm_wire.SOCKET))
        except OSError:
            return False
    return True


def ready(root: Path) -> bool:
    """Whether the warm process of the socket has started serving (`warm process N ...`), not
    only bound its socket (it answers then, and the requests wait for it)."""
    starts = [line for line in warm_log(root) if line.startswith("warm process")]
    return bool(starts) and "does not run" not in starts[-1]


def served(root: Path, before: int) -> list[str]:
    """The lines of warm.log after the first `before`: what the warm process ran since."""
    return [line for line in warm_log(root)[before:] if not line.startswith("warm process")]


def started(root: Path, command: str) -> int:
    """The pid of the fork running `command`, once the warm process has handed it over."""
    line = wait_until(
        lambda: [line for line in warm_log(root) if line.endswith(f": {command}")],
        timeout=PATIENCE_S,
        what=f"the warm process to run {command}",
    )
    return int(line[-1].split(":")[0])


class Project:
    """A project whose local service ran a run, with a warm process started for it."""

    def __init__(self, root: Path, run_id: str, env: dict[str, str]) -> None:
        self.root = root
        self.run_id = run_id
        self.env = env

    def simrun(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return run_simrun(*args, cwd=self.root, env={**self.env, **extra})

    def warm(self) -> None:
        """A warm process serves (a command starts one when the service runs)."""
        if not answers(self.root):
            self.simrun("list", "--local")
        wait_until(lambda: answers(self.root), PATIENCE_S, "the warm process to answer")
        wait_until(lambda: ready(self.root), PATIENCE_S, "the warm process to be ready")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    root = tmp_path_factory.mktemp("warm")
    extra = tmp_path_factory.mktemp("extra-path")  # a directory on sys.path the tests touch
    env = cli_env(PYTHONPATH=str(extra))
    write_squares(root, n=4)
    done = run_simrun("submit", "squares.yaml", "--local", "--json", cwd=root, env=env)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["id"]
    assert not answers(root), "the command that started the service starts no warm process"
    project = Project(root, run_id, env)
    try:
        project.warm()
        yield project
    finally:
        stop_local(root, timeout_s=60)


def test_a_command_runs_in_the_warm_process_with_the_same_output(project: Project) -> None:
    project.warm()
    for args in (
        ("status", project.run_id, "--local", "--json"),
        ("status", project.run_id, "--local"),
        ("list", "--local"),
        ("status", "20990101-000000-000000", "--local"),
        ("--help",),
        ("status", "--nope"),
    ):
        before = len(warm_log(project.root))
        warm = project.simrun(*args)
        ran = [line for line in served(project.root, before) if line.endswith(" ".join(args))]
        assert len(ran) == 1, args
        pid = ran[0].split(":")[0]
        end = f"{pid}: exit {warm.returncode}"
        wait_until(lambda end=end: end in warm_log(project.root), what=end)
        after = len(warm_log(project.root))
        cold = project.simrun(*args, **COLD)
        assert not served(project.root, after), "SIMRUN_WARM=0 runs the command itself"
        assert (warm.returncode, warm.stdout, warm.stderr) == (
            cold.returncode,
            cold.stdout,
            cold.stderr,
        ), args
    assert project.simrun("status", "20990101-000000-000000", "--local").returncode == 1


def test_the_command_has_the_environment_of_its_caller(project: Project) -> None:
    """The warm process has no SIMRUN_URL; the command of a caller that set one uses it."""
    project.warm()
    before = len(warm_log(project.root))
    done = project.simrun("list", SIMRUN_URL="http://127.0.0.1:9", SIMRUN_TOKEN="t")
    assert served(project.root, before)
    assert done.returncode == 1
    assert "cannot reach the service at http://127.0.0.1:9" in done.stderr


def test_the_socket_is_for_this_user_only(project: Project) -> None:
    project.warm()
    mode = (project.root / warm_wire.SOCKET).stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


def waiting_on_a_long_run(project: Project) -> tuple[str, subprocess.Popen[str], int]:
    """A long run submitted, and `simrun wait` on it running in the warm process: the run, the
    `simrun` process and the pid of the fork running its command."""
    project.warm()
    write_squares(project.root, n=4, sleep_s=30)
    submitted = project.simrun("submit", "squares.yaml", "--local", "--no-wait", "--json")
    run_id = json.loads(submitted.stdout)["id"]
    waiting = subprocess.Popen(
        [*simrun_command(), "wait", run_id, "--local"],
        cwd=project.root,
        env=project.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return run_id, waiting, started(project.root, f"wait {run_id} --local")


def test_ctrl_c_reaches_the_command(project: Project) -> None:
    """SIGINT to the `simrun` process interrupts the command in the warm process: exit 130."""
    run_id, waiting, pid = waiting_on_a_long_run(project)
    waiting.send_signal(signal.SIGINT)
    assert waiting.wait(timeout=PATIENCE_S) == 130, waiting.communicate()
    wait_until(
        lambda: f"{pid}: exit 130" in warm_log(project.root), PATIENCE_S, "the command to end"
    )
    assert project.simrun("cancel", run_id, "--local").returncode == 0


def test_a_killed_caller_ends_its_command(project: Project) -> None:
    run_id, waiting, pid = waiting_on_a_long_run(project)
    waiting.kill()
    waiting.communicate(timeout=PATIENCE_S)
    end = f"{pid}: exit -{signal.SIGTERM.value}"
    wait_until(
        lambda: end in warm_log(project.root),
        PATIENCE_S,
        "the command of the killed caller to end",
    )
    assert not pid_alive(pid)
    assert project.simrun("cancel", run_id, "--local").returncode == 0


def test_a_changed_installation_is_not_served(project: Project) -> None:
    """After a change of a directory on sys.path the request is refused, the command runs by
    itself and starts a warm process of the new installation."""
    project.warm()
    starts = [line for line in warm_log(project.root) if line.startswith("warm process")]
    extra = Path(project.env["PYTHONPATH"])
    later = time.time() + 5
    os.utime(extra, (later, later))
    before = len(warm_log(project.root))
    done = project.simrun("list", "--local", "--json")
    assert done.returncode == 0, done.stderr
    assert any(line.startswith("refused: stale") for line in served(project.root, before))
    wait_until(lambda: answers(project.root), what="a new warm process")
    now = wait_until(
        lambda: [line for line in warm_log(project.root) if line.startswith("warm process")][
            len(starts) :
        ],
        what="the start of a new warm process",
    )
    assert now[0] not in starts
    before = len(warm_log(project.root))
    assert project.simrun("list", "--local").returncode == 0
    assert not served(project.root, before)[0].startswith("refused")


def test_another_python_is_not_served(project: Project) -> None:
    """A request from a python with another sys.path is refused before anything runs."""
    project.warm()
    before = len(warm_log(project.root))
    done = run_simrun("list", "--local", cwd=project.root, env=cli_env())  # no PYTHONPATH
    assert done.returncode == 0, done.stderr
    lines = served(project.root, before)
    assert "refused: another python or sys.path" in lines
    assert not [line for line in lines if line.endswith(": list --local")]


def test_the_warm_process_ends_with_its_service(tmp_path: Path) -> None:
    write_squares(tmp_path, n=2)
    env = cli_env()
    assert run_simrun("submit", "squares.yaml", "--local", cwd=tmp_path, env=env).returncode == 0
    assert run_simrun("list", "--local", cwd=tmp_path, env=env).returncode == 0
    wait_until(lambda: answers(tmp_path), what="the warm process to answer")
    info = read_service(tmp_path)
    assert info is not None
    stop_local(tmp_path, timeout_s=60)
    wait_until(lambda: not (tmp_path / warm_wire.SOCKET).exists(), what="the socket to go")
    assert run_simrun("list", "--local", "--json", cwd=tmp_path, env=env).returncode == 0
    stop_local(tmp_path, timeout_s=60)


def test_the_command_has_the_time_zone_and_the_umask_of_its_caller(project: Project) -> None:
    project.warm()
    for zone in ("UTC0", "JST-9"):
        before = len(warm_log(project.root))
        warm = project.simrun("status", project.run_id, "--local", TZ=zone)
        assert served(project.root, before), zone
        cold = project.simrun("status", project.run_id, "--local", TZ=zone, **COLD)
        assert warm.stdout == cold.stdout, zone
    created = {
        zone: project.simrun("status", project.run_id, "--local", TZ=zone).stdout
        for zone in ("UTC0", "JST-9")
    }
    assert created["UTC0"] != created["JST-9"]
    target = project.root / "downloaded"
    before = len(warm_log(project.root))
    done = subprocess.run(
        [*simrun_command(), "outputs", project.run_id, "squares", "--local", "--to", str(target)],
        cwd=project.root,
        env=project.env,
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.umask(0o077),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert served(project.root, before)
    files = [path for path in target.rglob("*") if path.is_file()]
    assert files
    assert {stat.S_IMODE(path.stat().st_mode) & 0o077 for path in files} == {0}
