"""The background service after a SIGKILL and after being idle: the next command carries on."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from cli_helpers import cli_env, run_simrun, simrun_command, write_squares
from live_service import run_processes, wait_until
from unit_events import logged_units

from simrun_cli.local import pid_alive, read_service


def test_any_local_command_after_a_killed_service_ends_its_run(project: Path) -> None:
    write_squares(project, n=200, sleep_s=0.02)
    submitted = run_simrun("submit", "squares.yaml", "--local", "--no-wait", "--json", cwd=project)
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["id"]
    events = project / ".simrun/store/runs" / run_id / "events.jsonl"
    wait_until(lambda: len(logged_units(events)) >= 10, what="ten units")
    killed = read_service(project)
    assert killed is not None
    os.kill(killed.pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(killed.pid), what="the end of the killed service")
    waited = run_simrun("wait", run_id, "--local", "--timeout", "90", cwd=project)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    restarted = read_service(project)
    assert restarted is not None and restarted.pid != killed.pid
    status = run_simrun("status", run_id, "--local", "--json", cwd=project)
    assert '"state":"succeeded"' in status.stdout.replace(" ", "")
    assert run_processes(run_id) == []


def test_a_background_service_exits_when_idle(project: Path) -> None:
    service = subprocess.Popen(
        [*simrun_command(), "serve", "--local", "--idle-exit", "1"],
        cwd=project,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: read_service(project), timeout=30, what="service.json")
        assert service.wait(timeout=30) == 0
        assert not (project / ".simrun" / "service.json").exists()
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()


def test_submit_follows_its_run_to_the_end_across_a_killed_service(project: Path) -> None:
    """The service dies while `submit` follows the run: the command starts it again (on another
    port), the run goes on there and the command sees it succeed."""
    write_squares(project, n=200, sleep_s=0.02)
    command = subprocess.Popen(
        [*simrun_command(), "submit", "squares.yaml", "--local"],
        cwd=project,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert command.stdout is not None
        seen = []
        deadline = time.monotonic() + 60
        while not any(" units (" in line for line in seen):
            ready, _, _ = select.select(
                [command.stdout], [], [], max(0, deadline - time.monotonic())
            )
            assert ready, f"no unit line of submit within 60 s: {seen}"
            line = command.stdout.readline()
            assert line, (
                f"submit ended early: {seen} {command.stderr.read() if command.stderr else ''}"
            )
            seen.append(line.rstrip("\n"))
        killed = read_service(project)
        assert killed is not None
        os.kill(killed.pid, signal.SIGKILL)
        stdout, stderr = command.communicate(timeout=120)
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()
    assert command.returncode == 0, stdout + stderr
    lines = seen + stdout.splitlines()
    run_id = lines[0].split(" run ", 1)[1].split(":", 1)[0]
    assert lines[-1].startswith(f"run {run_id}: succeeded")
    restarted = read_service(project)
    assert restarted is not None and restarted.pid != killed.pid
    assert restarted.port != killed.port or restarted.instance != killed.instance
    assert run_processes(run_id) == []
