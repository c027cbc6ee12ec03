"""The refusals of the command line: they name what is wrong, exit 1 and change nothing."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import cli_env, run_simrun, write_squares


def test_python_m_simrun_cli_lists_the_commands(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "simrun_cli", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    for command in ("submit", "wait", "status", "list", "logs", "outputs", "cancel"):
        assert command in result.stdout
    for command in ("history", "replay", "serve", "compare", "cleanup", "usage", "estimate"):
        assert command in result.stdout


def test_timeout_without_wait_is_refused_before_anything_happens(tmp_path: Path) -> None:
    workflow = write_squares(tmp_path)
    result = run_simrun(
        "submit", str(workflow), "--local", "--no-wait", "--timeout", "5", cwd=tmp_path
    )
    assert result.returncode == 1
    assert "--timeout" in result.stderr and "--wait" in result.stderr
    assert not (tmp_path / ".simrun").exists()


def test_timeout_is_refused_on_the_cluster_where_no_wait_is_the_default(tmp_path: Path) -> None:
    workflow = write_squares(tmp_path)
    env = cli_env(SIMRUN_URL="http://127.0.0.1:9", SIMRUN_TOKEN="t")
    result = run_simrun("submit", str(workflow), "--timeout", "5", cwd=tmp_path, env=env)
    assert result.returncode == 1
    assert "--timeout" in result.stderr and "needs --wait" in result.stderr


def test_a_bad_workflow_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    workflow = tmp_path / "cycle.yaml"
    workflow.write_text(
        "name: cycle\n"
        "tasks:\n"
        "  - {id: a, type: demo.squares, settings: {n: 1}, inputs: {after: b.squares}}\n"
        "  - {id: b, type: demo.squares, settings: {n: 1}, inputs: {after: a.squares}}\n"
    )
    result = run_simrun("submit", str(workflow), "--local", cwd=tmp_path)
    assert result.returncode == 1
    assert "cycle.yaml" in result.stderr and "cycle" in result.stderr
    assert not list(tmp_path.glob(".simrun/store/runs/*"))
    assert not (tmp_path / ".simrun" / "service.json").exists()


def test_an_unknown_field_names_the_task(tmp_path: Path) -> None:
    workflow = tmp_path / "typo.yaml"
    workflow.write_text("name: typo\ntasks:\n  - {id: scan, type: demo.squares, setings: {}}\n")
    result = run_simrun("submit", str(workflow), "--local", cwd=tmp_path)
    assert result.returncode == 1
    assert "task 'scan'" in result.stderr and "setings" in result.stderr
    assert not (tmp_path / ".simrun").exists()


BAD_FIELD_AND_SETTING = (
    "name: bad\ntasks:\n"
    "  - {id: scan, type: demo.squares, settings: {n: '100'}, resources: {workers: two}}\n"
)


def test_a_refused_workflow_names_every_problem_and_starts_no_service(tmp_path: Path) -> None:
    """A wrong field and a wrong setting at once, found by the types installed here: the local
    service is not started for a workflow it would refuse."""
    (tmp_path / "bad.yaml").write_text(BAD_FIELD_AND_SETTING)
    result = run_simrun("submit", "bad.yaml", "--local", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: bad.yaml: task 'scan': resources.workers: expected `int | null`, got `str`",
        "error: bad.yaml: task 'scan': settings.n: expected `int`, got `str`",
    ]
    assert not (tmp_path / ".simrun").exists()


def test_a_running_local_service_adds_what_only_it_finds(project: Path) -> None:
    """With the local service running, a refused workflow is checked by it too: a task that
    fits on no node of it is named beside a wrong field."""
    write_squares(project)
    started = run_simrun("validate", "squares.yaml", "--local", cwd=project)
    assert started.returncode == 0, started.stderr
    (project / "big.yaml").write_text(
        "name: big\ntasks:\n"
        "  - {id: a, type: command, setings: {}, settings: "
        "{image: i, cores: 1, memory_gb: 100000, args: [echo]}}\n"
    )
    result = run_simrun("submit", "big.yaml", "--local", cwd=project)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == "error: big.yaml: task 'a': setings: unknown field", lines
    assert "settings.memory_gb: 1 core and 100,000 GiB fits on no node" in lines[1], lines
    assert len(lines) == 2, lines


def test_a_missing_workflow_file_is_named(tmp_path: Path) -> None:
    result = run_simrun("submit", "nowhere.yaml", "--local", cwd=tmp_path)
    assert result.returncode == 1
    assert "nowhere.yaml" in result.stderr and "cannot be read" in result.stderr


def test_a_source_that_is_no_git_working_tree_is_named(tmp_path: Path) -> None:
    workflow = write_squares(tmp_path)
    plain = tmp_path / "plain"
    plain.mkdir()
    result = run_simrun(
        "submit", str(workflow), "--local", "--source", f"model={plain}", cwd=tmp_path
    )
    assert result.returncode == 1
    assert str(plain) in result.stderr and "no git working tree" in result.stderr
    assert not (tmp_path / ".simrun").exists()


def test_a_source_without_name_or_path_is_refused(tmp_path: Path) -> None:
    workflow = write_squares(tmp_path)
    result = run_simrun("submit", str(workflow), "--local", "--source", "model", cwd=tmp_path)
    assert result.returncode == 1
    assert "NAME=PATH" in result.stderr


def test_without_simrun_url_the_command_says_what_to_set(tmp_path: Path) -> None:
    result = run_simrun("list", cwd=tmp_path)
    assert result.returncode == 1
    assert "SIMRUN_URL" in result.stderr and "SIMRUN_TOKEN" in result.stderr
    assert "--local" in result.stderr


def test_a_service_that_cannot_be_reached_is_named_by_its_url(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    result = run_simrun(
        "status", "some-run", cwd=tmp_path, env=cli_env(SIMRUN_URL=url, SIMRUN_TOKEN="t")
    )
    assert result.returncode == 1
    assert f"cannot reach the service at {url}" in result.stderr


def test_negative_numbers_are_refused(tmp_path: Path) -> None:
    env = cli_env(SIMRUN_URL="http://127.0.0.1:9", SIMRUN_TOKEN="t")
    for args, option in (
        (("wait", "r", "--timeout", "-1"), "--timeout"),
        (("logs", "r", "t", "--tail", "-1"), "--tail"),
        (("replay", "r", "--at", "0"), "--at"),
    ):
        result = run_simrun(*args, cwd=tmp_path, env=env)
        assert result.returncode == 1, args
        assert option in result.stderr


def test_stop_without_a_service_says_none_runs(tmp_path: Path) -> None:
    result = run_simrun("serve", "--local", "--stop", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no local service runs" in result.stdout


def test_stop_is_for_the_local_service_only(tmp_path: Path) -> None:
    result = run_simrun("serve", "--stop", cwd=tmp_path)
    assert result.returncode == 1
    assert "--local" in result.stderr


def test_a_wrong_use_exits_1_so_that_2_always_means_a_timeout(tmp_path: Path) -> None:
    for args in (
        ("wait",),
        ("bogus",),
        ("list", "--state", "nope"),
        ("wait", "r", "--timeout", "x"),
    ):
        result = run_simrun(*args, cwd=tmp_path)
        assert result.returncode == 1, args
        assert result.stderr.strip() and not result.stdout.strip(), args


def test_serve_with_a_bad_settings_file_names_it(tmp_path: Path) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text("store: s\ndb: d\ntokens: t\nowner: me\nbogus: 1\n")
    result = run_simrun("serve", cwd=tmp_path, env=cli_env(SIMRUN_CONFIG=str(settings)))
    assert result.returncode == 1
    assert f"settings file {settings}: unknown settings: bogus" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("kubeconfig", ["missing", "not: [yaml\n"], ids=["missing", "broken"])
def test_serve_with_a_kubeconfig_that_cannot_be_loaded_is_one_line(
    tmp_path: Path, kubeconfig: str
) -> None:
    """`backend: argo` outside a cluster: the kubeconfig is checked before the server starts."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("a-token-of-the-test-that-is-long-enough: {name: me, kind: person}\n")
    tokens.chmod(0o600)
    settings = tmp_path / "settings.yaml"
    settings.write_text(
        f"store: {tmp_path / 'store'}\ndb: {tmp_path / 'index.db'}\ntokens: {tokens}\n"
        "owner: me\nbackend: argo\n"
    )
    path = tmp_path / "kubeconfig"
    if kubeconfig != "missing":
        path.write_text(kubeconfig)
    env = cli_env(SIMRUN_CONFIG=str(settings), KUBECONFIG=str(path))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    result = run_simrun("serve", "--port", "1", cwd=tmp_path, env=env, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        f"error: the service of SIMRUN_CONFIG cannot start: settings file {settings}: "
        f"backend argo: KUBECONFIG={path}: "
    ), line
    assert ("does not exist" if kubeconfig == "missing" else "not valid YAML") in line
