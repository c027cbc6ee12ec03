"""The background service after a SIGKILL and after being idle: the next command carries on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from cli_helpers import cli_env, run_simrun, simrun_command, write_squares
from live_service import run_processes, wait_until

from simrun_cli.local import pid_alive, read_service


def test_any_local_command_after_a_killed_service_ends_its_run(project: Path) -> None:
    write_squares(project, n=200, sleep_s=0.02)
    submitted = run_simrun("submit", "squares.yaml", "--local", "--no-wait", "--json", cwd=project)
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["id"]
    events = project / ".simrun/store/runs" / run_id / "events.jsonl"
    wait_until(lambda: events.read_text().count('"unit-done"') >= 10, what="ten units")
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
