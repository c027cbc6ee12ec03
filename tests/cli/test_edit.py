"""`simrun edit` as a real process against a real local service: it opens a session for a file
that does not exist yet, writes the saves of the browser (here: its HTTP requests) into the
file, refuses a save over a file changed on disk, submits a run as `submit` does, sends the
changes of the file and of the working tree, finds the service again after it restarted (the
session kept by the store), and closes the session on Ctrl-C or SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
from cli_helpers import cli_env, git, run_simrun, simrun_command, wait_until

from simrun_core.edits import file_version
from simrun_core.workflow import parse_workflow

LINK = re.compile(
    r"in the Editor:\n(?P<url>http://\S+)/ui/#/edit/(?P<session>[0-9a-f]+)$", re.MULTILINE
)
"""The link of the Editor `simrun edit` prints, on a line of its own."""
PATIENCE_S = 120.0
"""How long a step (a start, a round of the watch, a close) may take on a busy machine: a
bound only a hang exceeds; every wait below ends as soon as its condition holds."""


def model_repo(root: Path) -> Path:
    repo = root / "model"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "model.py").write_text("K = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "model")
    return repo


def start_edit(project: Path, *args: str) -> tuple[subprocess.Popen[str], Path]:
    out = project / "edit.out"
    process = subprocess.Popen(
        [*simrun_command(), "edit", *args],
        cwd=project,
        env=cli_env(),
        stdin=subprocess.DEVNULL,
        stdout=out.open("w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    return process, out


def linked(process: subprocess.Popen[str], out: Path) -> re.Match[str]:
    def found() -> re.Match[str] | None:
        assert process.poll() is None, out.read_text()
        return LINK.search(out.read_text())

    return wait_until(found, timeout=PATIENCE_S, what="simrun edit to print the link of the Editor")


def browser(project: Path, url: str) -> httpx.Client:
    token = json.loads((project / ".simrun" / "service.json").read_text())["token"]
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=90)


def ask(client: httpx.Client, session: str, **body: Any) -> dict[str, Any]:
    response = client.post(f"/edits/{session}/requests", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def ended(client: httpx.Client, run: str) -> dict[str, Any] | None:
    """The summary of a run once it ended, else None (after a wait of a few seconds)."""
    answer = client.get(f"/runs/{run}/wait", params={"timeout": 10}).json()
    return answer if answer["finished"] is not None else None


def workflow(n: int) -> dict[str, Any]:
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": n}}
    return {"name": "fit", "tasks": [task]}


def test_simrun_edit_saves_refuses_a_conflict_runs_and_closes_on_ctrl_c(project):
    repo = model_repo(project)
    process, out = start_edit(project, "fit.yaml", "--local", "--source", "model=model")
    try:
        match = linked(process, out)
        session = match["session"]
        client = browser(project, match["url"])
        opened = client.get(f"/edits/{session}").json()
        # A file that does not exist is a new workflow named by its stem, without tasks.
        assert opened["disk"] == {
            "version": None,
            "workflow": {"name": "fit", "tasks": []},
            "problems": [],
        }
        assert opened["path"] == str(project / "fit.yaml") and opened["connected"] is True
        assert opened["trees"][0]["branch"] == "main"
        assert opened["sources"][0]["name"] == "model"

        saved = ask(client, session, kind="save", workflow=workflow(3), base=None)
        assert saved["outcome"] == "saved"
        text = (project / "fit.yaml").read_text()
        assert text.splitlines() == [
            "name: fit",
            "tasks:",
            "  - id: squares",
            "    type: demo.squares",
            "    settings:",
            "      n: 3",
        ]
        assert saved["disk"]["version"] == file_version(text)

        # Another editor changes the file: the session has it within a few seconds, and a save
        # of a draft of the older version is refused with what is on disk now.
        (project / "fit.yaml").write_text(text.replace("n: 3", "n: 7"))
        changed = wait_until(
            lambda: (
                client.get(f"/edits/{session}").json()["disk"]["version"]
                != saved["disk"]["version"]
            ),
            timeout=PATIENCE_S,
            what="the change on disk to reach the session",
        )
        assert changed
        conflict = ask(
            client, session, kind="save", workflow=workflow(4), base=saved["disk"]["version"]
        )
        assert conflict["outcome"] == "conflict"
        assert conflict["disk"]["workflow"]["tasks"][0]["settings"] == {"n": 7}
        assert "n: 7" in (project / "fit.yaml").read_text()
        forced = ask(
            client,
            session,
            kind="save",
            workflow=workflow(4),
            base=saved["disk"]["version"],
            force=True,
        )
        assert forced["outcome"] == "saved"
        assert parse_workflow((project / "fit.yaml").read_text()).tasks[0].settings == {"n": 4}

        # A run submits the draft (not the file) with the sources recorded again.
        (repo / "notes.txt").write_text("draft\n")
        before = (project / "fit.yaml").read_text()
        run = ask(client, session, kind="run", workflow=workflow(5), group="study")
        assert run["outcome"] == "submitted", run
        finished = wait_until(
            lambda: ended(client, run["run"]), timeout=PATIENCE_S, what="the end of the run"
        )
        assert finished["state"] == "succeeded" and finished["group"] == "study"
        view = client.get(f"/runs/{run['run']}").json()
        assert view["workflow"]["tasks"][0]["settings"] == {"n": 5}
        assert view["sources"][0]["changed"] == ["?? notes.txt"]
        assert (project / "fit.yaml").read_text() == before
        trees = wait_until(
            lambda: client.get(f"/edits/{session}").json()["trees"][0]["changed"],
            timeout=PATIENCE_S,
            what="the state of the working tree",
        )
        assert trees == ["?? notes.txt"]

        refused = ask(
            client,
            session,
            kind="run",
            workflow={
                "name": "fit",
                "tasks": [{"id": "squares", "type": "demo.squares", "settings": {"n": "many"}}],
            },
        )
        assert refused["outcome"] == "refused"
        assert refused["errors"] == ["task 'squares': settings.n: expected `int`, got `str`"]

        process.send_signal(signal.SIGINT)
        assert process.wait(PATIENCE_S) == 0
        assert "closed the edit session" in out.read_text()
        closed = client.get(f"/edits/{session}").json()
        assert closed["connected"] is False and closed["closed"] is not None
        client.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_simrun_edit_ends_on_sigterm_and_a_source_that_is_no_tree_is_refused(project):
    (project / "fit.yaml").write_text("name: fit\ntasks: [")
    process, out = start_edit(project, "fit.yaml", "--local")
    try:
        match = linked(process, out)
        client = browser(project, match["url"])
        opened = client.get(f"/edits/{match['session']}").json()
        # A file that is no workflow: its problems, no workflow to show.
        assert opened["disk"]["workflow"] is None
        assert opened["disk"]["problems"][0].startswith("line 2, column 9: not valid YAML")
        process.send_signal(signal.SIGTERM)
        assert process.wait(PATIENCE_S) == 0
        assert client.get(f"/edits/{match['session']}").json()["closed"] is not None
        client.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    refused = subprocess.run(
        [*simrun_command(), "edit", "fit.yaml", "--local", "--source", "model=nowhere"],
        cwd=project,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1
    assert "source 'model'" in refused.stderr and "no directory" in refused.stderr


def test_simrun_edit_carries_on_across_a_restart_of_the_local_service(project):
    process, out = start_edit(project, "fit.yaml", "--local")
    try:
        match = linked(process, out)
        session = match["session"]
        stopped = run_simrun("serve", "--local", "--stop", cwd=project)
        assert stopped.returncode == 0, stopped.stderr
        # The next command of the directory starts the service again, on another port.
        assert run_simrun("list", "--local", cwd=project).returncode == 0
        moved = wait_until(
            lambda: re.search(
                r"the service moved, the Editor is now at:\n(http://\S+)/ui/", out.read_text()
            ),
            timeout=PATIENCE_S,
            what="simrun edit to find the service again",
        )
        client = browser(project, moved[1])
        kept = wait_until(
            lambda: client.get(f"/edits/{session}").json()["connected"],
            timeout=PATIENCE_S,
            what="the session kept by the store to be connected again",
        )
        assert kept
        saved = ask(client, session, kind="save", workflow=workflow(2), base=None)
        assert saved["outcome"] == "saved"
        assert parse_workflow((project / "fit.yaml").read_text()).tasks[0].settings == {"n": 2}
        process.send_signal(signal.SIGINT)
        assert process.wait(PATIENCE_S) == 0
        client.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
