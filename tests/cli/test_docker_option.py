"""`simrun submit --local --docker` (issue 15): the run records `local_commands: docker` and its
`command` tasks run through the engine (a fake `docker` here, see tests/api/test_docker_commands);
refused without --local, and refused by the local service when no engine is installed."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from cli_helpers import cli_env, run_simrun
from fake_engine import calls, fake_engine, without_engines


def write_command(project: Path) -> None:
    task = {
        "id": "hello",
        "type": "command",
        "settings": {
            "image": "busybox:1",
            "args": ["python", "-c", "import sys; open(sys.argv[1] + '/hi', 'w')", "{out}"],
            "cores": 1,
            "memory_gb": 0.5,
        },
    }
    text = yaml.safe_dump({"name": "hello", "tasks": [task]}, sort_keys=False)
    (project / "hello.yaml").write_text(text)


def test_docker_needs_the_local_service(project: Path) -> None:
    write_command(project)
    refused = run_simrun("submit", "hello.yaml", "--docker", cwd=project)
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: --docker runs the command tasks of the local service")


def test_docker_is_refused_where_no_engine_is_installed(project: Path) -> None:
    write_command(project)
    env = cli_env(PATH=without_engines())
    refused = run_simrun("submit", "hello.yaml", "--local", "--docker", cwd=project, env=env)
    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.startswith(
        "error: hello.yaml: local_commands: neither docker nor podman is installed"
    ), refused.stderr
    assert json.loads(run_simrun("list", "--local", "--json", cwd=project, env=env).stdout) == []


def test_submit_docker_runs_the_command_in_its_image(project: Path) -> None:
    write_command(project)
    bin_dir = project / "bin"
    fake_engine(bin_dir, "docker")
    path = f"{bin_dir}:{without_engines()}"
    env = cli_env(PATH=path, FAKE_ENGINE_LOG=str(project / "engine.jsonl"))
    result = run_simrun("submit", "hello.yaml", "--local", "--docker", cwd=project, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].split(": ")[1].startswith("succeeded")
    [call] = calls(project)
    assert call["argv"][1] == "run" and "busybox:1" in call["argv"]
    [item] = json.loads(run_simrun("list", "--local", "--json", cwd=project, env=env).stdout)
    status = json.loads(
        run_simrun("status", item["id"], "--local", "--json", cwd=project, env=env).stdout
    )
    assert status["local_commands"] == "docker"
    out = project / ".simrun" / "store" / "runs" / item["id"] / "tasks" / "hello" / "out"
    assert (out / "hi").exists()
