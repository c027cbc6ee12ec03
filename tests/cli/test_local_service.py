"""The `simrun` command against the real local service of a project directory.

Every command runs as its own process with `--local`, so the first one starts the service in the
background, as a user's would; the fixtures stop it at the end.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from cli_helpers import cli_env, git, run_simrun, simrun_command, wait_until, write_squares
from unit_events import unit_indices

from simrun_cli.local import pid_alive, read_service, stop_local
from simrun_core.wire import RunView


def run_id_of(stdout: str) -> str:
    """The run id of the first line of `submit`: `<clock> run <id>: submitting (...)`."""
    first = stdout.splitlines()[0]
    return first.split(" run ", 1)[1].split(":", 1)[0]


class FinishedRun:
    """A project with one run of squares that succeeded, submitted with a git source."""

    def __init__(self, root: Path, result: subprocess.CompletedProcess[str]) -> None:
        self.root = root
        self.result = result
        self.run_id = run_id_of(result.stdout)

    def simrun(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_simrun(*args, "--local", cwd=self.root)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FinishedRun]:
    root = tmp_path_factory.mktemp("finished")
    git(root, "init", "-q", "-b", "main")
    (root / "model.py").write_text("VALUE = 1\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    (root / "model.py").write_text("VALUE = 2\n")
    write_squares(root, n=20)
    result = run_simrun("submit", "squares.yaml", "--local", "--source", "model=.", cwd=root)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        yield FinishedRun(root, result)
    finally:
        stop_local(root, timeout_s=60)


def test_submit_local_follows_the_run_in_plain_lines(finished: FinishedRun) -> None:
    lines = finished.result.stdout.splitlines()
    assert "submitting (1 task)" in lines[0]
    assert any(line.endswith("squares: running") for line in lines)
    units = [line for line in lines if " units (" in line]
    assert units[-1].endswith("squares: 20/20 units (100%)")
    assert 1 <= len(units) <= 10
    assert any("squares: done" in line for line in lines)
    assert lines[-1].startswith(f"run {finished.run_id}: succeeded")


def test_the_source_is_recorded_with_its_git_state(finished: FinishedRun) -> None:
    status = finished.simrun("status", finished.run_id, "--json")
    record = msgspec.json.decode(status.stdout, type=RunView)
    [source] = record.sources
    assert source.name == "model"
    assert source.path == str(finished.root.resolve())
    assert source.branch == "main"
    assert source.commit == git(finished.root, "rev-parse", "HEAD")
    assert source.dirty and "M model.py" in source.changed and source.diff_sha256


def test_status_shows_the_tasks_and_their_units(finished: FinishedRun) -> None:
    result = finished.simrun("status", finished.run_id)
    assert result.returncode == 0, result.stderr
    assert finished.run_id in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("squares"))
    assert "done" in row and "20/20" in row


def test_replay_json_of_an_ended_run_is_status_json(finished: FinishedRun) -> None:
    status = finished.simrun("status", finished.run_id, "--json")
    replay = finished.simrun("replay", finished.run_id, "--json")
    assert status.returncode == replay.returncode == 0
    assert replay.stdout == status.stdout
    run = msgspec.json.decode(status.stdout, type=RunView)
    assert run.state == "succeeded" and run.tasks["squares"].done == 20


def test_replay_at_the_first_event_is_the_submitted_run(finished: FinishedRun) -> None:
    result = finished.simrun("replay", finished.run_id, "--at", "1", "--json")
    run = msgspec.json.decode(result.stdout, type=RunView)
    states = {task: view.state for task, view in run.tasks.items()}
    assert (run.seq, run.state, states) == (1, "submitting", {"squares": "waiting"})
    people = finished.simrun("replay", finished.run_id, "--at", "1")
    assert "submitting" in people.stdout and "waiting" in people.stdout


def test_history_is_the_whole_log(finished: FinishedRun) -> None:
    events = json.loads(finished.simrun("history", finished.run_id, "--json").stdout)
    record = msgspec.json.decode(
        finished.simrun("status", finished.run_id, "--json").stdout, type=RunView
    )
    assert [event["seq"] for event in events] == list(range(1, record.seq + 1))
    assert events[0]["type"] == "submitted" and events[-1]["type"] == "succeeded"
    assert sorted(unit_indices(events)) == list(range(20))
    table = finished.simrun("history", finished.run_id).stdout
    assert "units-done" in table and "task=squares" in table


def test_list_finds_the_run_by_its_state(finished: FinishedRun) -> None:
    items = json.loads(finished.simrun("list", "--json").stdout)
    assert [(item["id"], item["state"]) for item in items] == [(finished.run_id, "succeeded")]
    assert json.loads(finished.simrun("list", "--state", "failed", "--json").stdout) == []
    table = finished.simrun("list").stdout
    assert finished.run_id in table and "succeeded" in table


def test_outputs_lists_and_downloads_the_files(finished: FinishedRun) -> None:
    answer = finished.simrun("outputs", finished.run_id, "squares", "--limit", "0", "--json")
    listed = json.loads(answer.stdout)["files"]
    out = f"runs/{finished.run_id}/tasks/squares/out/"  # paths relative to the store
    assert all(file["path"].startswith(out) for file in listed), listed
    paths = {file["path"].removeprefix(out) for file in listed}
    assert paths == {f"squares/{index}.json" for index in range(20)} | {"summary.json"}
    store = finished.root / ".simrun" / "store"
    assert all((store / file["path"]).stat().st_size == file["bytes"] for file in listed)
    target = finished.root / "results"
    result = finished.simrun("outputs", finished.run_id, "squares", "--to", str(target), "--json")
    assert result.returncode == 0, result.stderr
    assert sorted(json.loads(result.stdout)) == sorted(str(target / path) for path in paths)
    assert json.loads((target / "squares" / "7.json").read_text())["square"] == 49
    assert json.loads((target / "summary.json").read_text())["sum"] == sum(i * i for i in range(20))


def test_outputs_lists_the_summary_first_and_says_what_the_limit_left_out(
    finished: FinishedRun,
) -> None:
    out = f"runs/{finished.run_id}/tasks/squares/out/"
    summary = finished.simrun("outputs", finished.run_id, "squares", "--glob", "summary*")
    assert summary.returncode == 0, summary.stderr
    listed = [line.split()[0] for line in summary.stdout.splitlines() if line.startswith("runs/")]
    assert listed == [f"{out}summary.json"] and summary.stderr == ""
    limited = finished.simrun("outputs", finished.run_id, "squares", "--limit", "3")
    listed = [line.split()[0] for line in limited.stdout.splitlines() if line.startswith("runs/")]
    assert listed == [f"{out}summary.json", f"{out}squares/0.json", f"{out}squares/1.json"]
    assert "18 more files not listed; --limit 0 lists all" in limited.stderr
    answer = finished.simrun("outputs", finished.run_id, "squares", "--limit", "2", "--json")
    assert json.loads(answer.stdout)["left_out"] == 19
    target = finished.root / "summary-only"
    fetched = finished.simrun(
        "outputs", finished.run_id, "squares", "--glob", "summary*", "--to", str(target)
    )
    assert fetched.returncode == 0, fetched.stderr
    assert [path.name for path in target.iterdir()] == ["summary.json"]
    negative = finished.simrun("outputs", finished.run_id, "squares", "--limit", "-1")
    assert negative.returncode != 0 and "--limit -1" in negative.stderr


def test_outputs_to_downloads_one_archive_and_says_so_in_one_line(finished: FinishedRun) -> None:
    target = finished.root / "in" / "one"
    result = finished.simrun("outputs", finished.run_id, "squares", "--to", str(target))
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(rf"21 files, \d+ B to {re.escape(str(target))}\n", result.stdout)
    files = sorted(str(path.relative_to(target)) for path in target.rglob("*") if path.is_file())
    assert files == sorted(["summary.json", *(f"squares/{index}.json" for index in range(20))])
    again = finished.simrun("outputs", finished.run_id, "squares", "--to", str(target))
    assert again.returncode == 0 and again.stdout == result.stdout, "into a directory that exists"
    assert sorted(path.name for path in target.iterdir()) == ["squares", "summary.json"]


def test_outputs_to_shows_a_progress_bar_on_a_terminal(finished: FinishedRun) -> None:
    target = finished.root / "barred"
    primary, secondary = pty.openpty()
    command = subprocess.Popen(
        [*simrun_command(), "outputs", finished.run_id, "squares", "--to", str(target), "--local"],
        cwd=finished.root,
        env=cli_env(TERM="xterm", COLUMNS="80"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=secondary,
    )
    os.close(secondary)
    screen = read_terminal(primary, command)
    assert command.returncode == 0, screen
    assert command.stdout is not None and command.stdout.read().startswith(b"21 files, ")
    assert "21 files of squares" in screen and "━" in screen and "KiB" in screen


def read_terminal(primary: int, command: subprocess.Popen[bytes]) -> str:
    """What a command wrote to a terminal until it closed it; the command has ended."""
    screen = b""
    try:
        while True:
            ready, _, _ = select.select([primary], [], [], 60)
            if not ready:
                pytest.fail(f"no output on the terminal within 60 s: {screen!r}")
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal closed with the command
                break
            if not chunk:
                break
            screen += chunk
        command.wait(timeout=60)
    finally:
        os.close(primary)
        if command.poll() is None:
            command.kill()
            command.wait()
    return screen.decode(errors="replace")


def test_outputs_to_a_place_that_cannot_take_them_is_refused(finished: FinishedRun) -> None:
    root = finished.root / "refused"
    root.mkdir()
    (root / "a-file").write_text("mine")
    (root / "in-the-way").mkdir()
    (root / "in-the-way" / "squares").write_text("a file where a directory goes")
    places = {
        "a-file": "it is a file, not a directory",
        "a-file/below/it": f"{root / 'a-file'} is a file, not a directory",
        "in-the-way": f"{root / 'in-the-way' / 'squares'} is a file, in the way",
    }
    unwritable = unwritable_directory(root)
    if unwritable is not None:
        places[str(unwritable / "new")] = f"{unwritable} is not writable"
    before = sorted(root.rglob("*"))
    for place, reason in places.items():
        target = root / place
        result = finished.simrun("outputs", finished.run_id, "squares", "--to", str(target))
        assert result.returncode == 1, (place, result.stdout)
        assert result.stderr.startswith(f"error: cannot download into {target}: {reason}")
        assert "Traceback" not in result.stderr and not result.stdout
        assert sorted(root.rglob("*")) == before, f"{place}: something was written"
    assert (root / "a-file").read_text() == "mine"


def unwritable_directory(root: Path) -> Path | None:
    """A directory this user cannot write: one of mode 0555, or /proc/sys for root."""
    locked = root / "locked"
    locked.mkdir(mode=0o555)
    if not os.access(locked, os.W_OK):
        return locked
    locked.rmdir()
    system = Path("/proc/sys")
    return system if system.is_dir() and not os.access(system, os.W_OK) else None


def test_history_filters_tails_and_shows_times(finished: FinishedRun) -> None:
    every = json.loads(finished.simrun("history", finished.run_id, "--json").stdout)
    units = finished.simrun(
        "history", finished.run_id, "--type", "units-done", "--tail", "3", "--json"
    )
    assert json.loads(units.stdout) == [e for e in every if e["type"] == "units-done"][-3:]
    states = finished.simrun(
        "history", finished.run_id, "--task", "squares", "--type", "task-state", "--json"
    )
    assert [e["state"] for e in json.loads(states.stdout)] == ["queued", "running", "done"]
    table = finished.simrun("history", finished.run_id, "--tail", "4")
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if re.match(r"\s*\d+\s", line)]
    assert [int(row.split()[0]) for row in rows] == [e["seq"] for e in every[-4:]]
    assert table.stderr == "the last 4 events shown; --tail 0 shows all\n"
    report = finished.simrun("history", finished.run_id, "--type", "worker-report").stdout
    assert re.search(r"started=\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}", report), report
    unknown = finished.simrun("history", finished.run_id, "--type", "unit_done")
    assert unknown.returncode == 1 and "--type unit_done: no event has this type" in unknown.stderr
    assert "unit-done" in unknown.stderr


def test_replay_beyond_the_last_event_says_how_many_there_are(finished: FinishedRun) -> None:
    last = msgspec.json.decode(
        finished.simrun("status", finished.run_id, "--json").stdout, type=RunView
    ).seq
    for args in (("--at", str(last + 1)), ("--at", "100000", "--json")):
        result = finished.simrun("replay", finished.run_id, *args)
        assert result.returncode == 1, result.stdout
        assert not result.stdout
        assert result.stderr == (
            f"error: --at {args[1]}: run {finished.run_id} has only {last} events\n"
        )
    assert finished.simrun("replay", finished.run_id, "--at", str(last)).returncode == 0


def test_tables_end_no_line_in_spaces_and_short_runs_take_tenths(finished: FinishedRun) -> None:
    for args in (("status", finished.run_id), ("list",), ("history", finished.run_id)):
        result = finished.simrun(*args)
        assert result.returncode == 0, result.stderr
        padded = [line for line in result.stdout.splitlines() if line != line.rstrip()]
        assert not padded, (args, padded)
    last = finished.result.stdout.splitlines()[-1]
    assert re.fullmatch(rf"run {finished.run_id}: succeeded after \d+(\.\d+)? s", last), last
    assert not last.endswith(" after 0s")


def test_logs_print_the_text_of_the_task(finished: FinishedRun) -> None:
    result = finished.simrun("logs", finished.run_id, "squares", "--tail", "0")
    assert result.returncode == 0, result.stderr
    assert "==> w0-0.log <==" in result.stdout


def test_a_refusal_prints_the_detail_and_exits_1(finished: FinishedRun) -> None:
    unknown = finished.simrun("status", "20990101-000000-000000")
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "error: run '20990101-000000-000000' does not exist"
    ended = finished.simrun("cancel", finished.run_id)
    assert ended.returncode == 1
    assert ended.stderr.startswith("error: ") and "has ended" in ended.stderr


def test_wait_times_out_then_a_cancelled_run_exits_1(project: Path) -> None:
    write_squares(project, n=40, sleep_s=0.5)
    submitted = run_simrun("submit", "squares.yaml", "--local", "--no-wait", "--json", cwd=project)
    assert submitted.returncode == 0, submitted.stderr
    record = msgspec.json.decode(submitted.stdout, type=RunView)
    assert record.state == "submitting"

    waited = run_simrun("wait", record.id, "--local", "--timeout", "0.5", cwd=project)
    assert waited.returncode == 2, waited.stderr
    assert waited.stdout.startswith(f"run {record.id} is still ")
    assert waited.stdout.endswith(" after 0.5 s\n") and not waited.stderr

    cancelled = run_simrun("cancel", record.id, "--local", "--json", cwd=project)
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["cancel_requested"]

    ended = run_simrun("wait", record.id, "--local", "--json", cwd=project)
    assert ended.returncode == 1
    assert json.loads(ended.stdout)["state"] == "cancelled"
    assert f"run {record.id} cancelled" in ended.stderr

    people = run_simrun("wait", record.id, "--local", cwd=project)
    assert people.returncode == 1
    output = people.stdout + people.stderr
    assert output.count("cancelled") == 2, "the state and the message, once: " + output
    [line] = output.splitlines()
    assert line.startswith(f"run {record.id}: cancelled after ") and ": cancelled by " in line


def test_submit_wait_gives_up_at_its_timeout_with_exit_2(project: Path) -> None:
    write_squares(project, n=40, sleep_s=0.5)
    result = run_simrun("submit", "squares.yaml", "--local", "--timeout", "1", cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].endswith(" is still running after 1 s")
    assert "is still" not in result.stderr


def test_a_failed_run_exits_1_with_its_message(project: Path) -> None:
    write_squares(project, n=6, fail_at=3)
    result = run_simrun("submit", "squares.yaml", "--local", cwd=project)
    assert result.returncode == 1, result.stdout + result.stderr
    run_id = run_id_of(result.stdout)
    last = result.stdout.splitlines()[-1]
    assert last.startswith(f"run {run_id}: failed after ") and "task 'squares' failed" in last
    assert not result.stderr, "the end of the run is said once"
    # under the task's line: the end of its log and the command that shows more
    lines = result.stdout.splitlines()
    failed = next(i for i, line in enumerate(lines) if " squares: failed after " in line)
    log = lines[failed + 1 : -2]
    assert log and all(line.startswith("  | ") for line in log), lines
    assert any("RuntimeError: unit 3 fails as fail_at asks" in line for line in log), log
    assert lines[-2] == f"  more of its log: simrun logs {run_id} squares --local"


def test_submit_no_wait_ends_with_the_command_that_follows_the_run(project: Path) -> None:
    write_squares(project, n=2)
    result = run_simrun("submit", "squares.yaml", "--local", "--no-wait", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    first, follow = result.stdout.splitlines()
    run_id = first.split(" ", 2)[1].rstrip(":")
    assert first == f"run {run_id}: submitting"
    assert follow == f"follow it to its end: simrun wait {run_id} --local"
    waited = run_simrun(*follow.split(": ", 1)[1].split()[1:], cwd=project)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert waited.stdout.startswith(f"run {run_id}: succeeded")


def test_concurrent_commands_start_one_service(project: Path) -> None:
    commands = [
        subprocess.Popen(
            [*simrun_command(), "list", "--local", "--json"],
            cwd=project,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [command.communicate(timeout=120) for command in commands]
    assert [command.returncode for command in commands] == [0, 0, 0], outputs
    assert all(json.loads(stdout) == [] for stdout, _ in outputs)
    info = read_service(project)
    assert info is not None and pid_alive(info.pid)
    assert "runs already" not in (project / ".simrun" / "service.log").read_text()


def test_serve_local_while_the_service_runs_says_where_it_is(project: Path) -> None:
    assert run_simrun("list", "--local", cwd=project).returncode == 0
    info = read_service(project)
    assert info is not None
    second = run_simrun("serve", "--local", cwd=project, timeout=60)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.splitlines() == [
        f"the local service of {project} runs already (pid {info.pid})",
        f"simrun at {info.url}/ui/ (token in {project / '.simrun' / 'service.json'})",
    ]
    assert second.stderr == ""
    assert read_service(project) == info, "the running service is left as it is"


def test_serve_local_stop_stops_the_background_service(project: Path) -> None:
    assert run_simrun("list", "--local", cwd=project).returncode == 0
    info = read_service(project)
    assert info is not None and info.background
    result = run_simrun("serve", "--local", "--stop", cwd=project)
    assert result.returncode == 0, result.stderr
    assert f"stopped the local service at {info.url} (pid {info.pid})" in result.stdout
    assert not pid_alive(info.pid)
    assert not (project / ".simrun" / "service.json").exists()


def test_serve_local_in_the_foreground_serves_the_commands(project: Path) -> None:
    service = subprocess.Popen(
        [*simrun_command(), "serve", "--local"],
        cwd=project,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        info = wait_until(lambda: read_service(project), timeout=30, what="service.json")
        assert info.pid == service.pid and not info.background
        listed = run_simrun("list", "--local", "--json", cwd=project)
        assert listed.returncode == 0, listed.stderr
        assert read_service(project) == info, "the command used the running service"
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=60) == 0
        assert not (project / ".simrun" / "service.json").exists()
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()


def test_submit_on_a_terminal_draws_live_lines(project: Path) -> None:
    write_squares(project, n=10)
    primary, secondary = pty.openpty()
    command = subprocess.Popen(
        [*simrun_command(), "submit", "squares.yaml", "--local"],
        cwd=project,
        env=cli_env(TERM="xterm", COLUMNS="80"),
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=subprocess.PIPE,
    )
    os.close(secondary)
    screen = b""
    try:
        while True:
            ready, _, _ = select.select([primary], [], [], 60)
            if not ready:
                pytest.fail(f"no output of submit on a terminal within 60 s: {screen!r}")
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # the terminal closed with the command
                break
            if not chunk:
                break
            screen += chunk
        assert command.wait(timeout=60) == 0, command.stderr.read() if command.stderr else ""
    finally:
        os.close(primary)
        if command.poll() is None:
            command.kill()
            command.wait()
    text = screen.decode(errors="replace")
    assert "\x1b[" in text, "a live display redraws with escape sequences"
    assert "squares" in text and "10/10" in text and "succeeded" in text


def test_submit_wait_json_prints_the_final_record(project: Path) -> None:
    write_squares(project, n=4)
    result = run_simrun("submit", "squares.yaml", "--local", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    run = msgspec.json.decode(result.stdout, type=RunView)
    assert run.state == "succeeded" and run.tasks["squares"].done == 4
    status = run_simrun("status", run.id, "--local", "--json", cwd=project)
    assert status.stdout == result.stdout


EMPTY_RUN_ID = "the run id is empty: give the id of a run (simrun list)"


@pytest.mark.parametrize(
    "args",
    [
        ("status", ""),
        ("history", ""),
        ("cancel", ""),
        ("wait", ""),
        ("replay", ""),
        ("logs", "", "squares"),
        ("outputs", "", "squares"),
        ("outputs", "", "squares", "--to", "out"),
        ("compare", "20990101-000000-000000", ""),
        ("status", "  "),
    ],
)
def test_an_empty_run_id_is_refused_as_one_before_any_request(project: Path, args) -> None:
    result = run_simrun(*args, "--local", cwd=project)
    assert result.returncode == 1, result.stdout
    expected = EMPTY_RUN_ID.replace("empty:", "empty ('  '):") if "  " in args else EMPTY_RUN_ID
    assert result.stderr == f"error: {expected}\n"
    assert not (project / ".simrun").exists(), "no service was started for it"
    assert not (project / "out").exists()


def test_an_empty_task_id_is_refused_as_one(project: Path) -> None:
    for command in ("logs", "outputs"):
        result = run_simrun(command, "20990101-000000-000000", "", "--local", cwd=project)
        assert result.returncode == 1, result.stdout
        assert result.stderr == (
            "error: the task id is empty: give the id of a task (simrun status RUN)\n"
        )
    assert not (project / ".simrun").exists()
