"""Who is who, over HTTP against a service of `serve_from_config` (issue 25, items 1 and 9;
issue 24, item 7):

- an identity is its name, kind and person: an agent never passes for a person of its name,
  nor for another agent of its name (cancel, remove, edit sessions);
- `tokens.yaml` refuses entries that would be taken for one another, naming their lines, and
  no refusal of it quotes what it holds (its tokens);
- a token added to `tokens.yaml` works and one removed stops working within seconds, without
  a restart; an edit the service cannot use keeps the tokens it had and is logged;
- the access log does not show a secret put in a URL's query.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from live_service import command, python, run_processes, wait_until
from service_helpers import (
    TOKENS,
    ConfiguredService,
    start_configured_service,
    stop_configured_service,
)

SLEEP = python("import time; time.sleep(600)")
TAKES_EFFECT_S = 10.0
"""A generous bound on "within seconds" (the file is looked at every second): only a service
that does not read the file again misses it."""

OPENING = {
    "path": "/home/root/study/fit.yaml",
    "machine": "laptop",
    "disk": {"version": "v0", "workflow": {"name": "fit", "tasks": []}, "problems": []},
    "sources": [],
    "trees": [],
    "group": None,
}

# Two agents of one name acting for two people: two identities.
HELPERS = {
    "t-mk": {"name": "mk", "kind": "person"},
    "t-ann": {"name": "ann", "kind": "person"},
    "t-bob": {"name": "bob", "kind": "person"},
    "t-helper-of-ann": {"name": "helper", "kind": "agent", "owner": "ann"},
    "t-helper-of-bob": {"name": "helper", "kind": "agent", "owner": "bob"},
}


def client(service: ConfiguredService, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=service.url, headers={"Authorization": f"Bearer {token}"}, timeout=90
    )


def write_tokens_file(root: Path, tokens: dict[str, Any] | str) -> None:
    """Replace `tokens.yaml` as an operator's editor does: written in place, 0600."""
    path = root / "tokens.yaml"
    path.write_text(tokens if isinstance(tokens, str) else yaml.safe_dump(tokens))
    path.chmod(0o600)


def running_sleeper(service: ConfiguredService, who: httpx.Client, name: str) -> str:
    response = who.post("/runs", json={"workflow": {"name": name, "tasks": [command("s", SLEEP)]}})
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    wait_until(lambda: run_processes(run_id), what=f"the run {run_id} to run")
    # The process starts before the service records it: wait for the record too, so that
    # the log compared afterwards changes only by what a stranger would make it do.
    wait_until(
        lambda: who.get(f"/runs/{run_id}").json()["tasks"]["s"]["state"] == "running",
        what=f"the run {run_id} to be recorded as running",
    )
    return run_id


def open_edit_session(who: httpx.Client) -> str:
    response = who.post("/edits", json=OPENING)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def assert_strangers(
    service: ConfiguredService, stranger: httpx.Client, run_id: str, session: str
) -> None:
    """`stranger` may neither cancel nor remove the run, nor see or use the edit session;
    the run goes on unchanged."""
    log = (service.run_dir(run_id) / "events.jsonl").read_bytes()
    refused = stranger.post(f"/runs/{run_id}/cancel")
    assert refused.status_code == 403, refused.text
    assert stranger.delete(f"/runs/{run_id}").status_code == 403
    assert (service.run_dir(run_id) / "events.jsonl").read_bytes() == log
    for method, path in (
        ("GET", f"/edits/{session}"),
        ("POST", f"/edits/{session}/close"),
        ("GET", f"/edits/{session}/requests"),
    ):
        response = stranger.request(method, path, params={"timeout": 0})
        assert response.status_code == 403, (method, path, response.text)
    listed = stranger.get("/edits")
    assert listed.status_code == 200
    assert session not in [item["id"] for item in listed.json()]


@pytest.fixture
def helpers(tmp_path: Path) -> Iterator[ConfiguredService]:
    started = start_configured_service(tmp_path, tokens=HELPERS)
    try:
        yield started
    finally:
        assert stop_configured_service(started) == 0


def test_an_agent_is_not_another_agent_of_its_name(helpers):
    of_ann, of_bob = client(helpers, "t-helper-of-ann"), client(helpers, "t-helper-of-bob")
    assert of_bob.get("/me").json() == {"name": "helper", "kind": "agent", "owner": "bob"}
    run_id = running_sleeper(helpers, of_ann, "ann-helper-runs")
    session = open_edit_session(of_ann)

    assert_strangers(helpers, of_bob, run_id, session)
    assert of_ann.get(f"/edits/{session}").status_code == 200
    assert [item["id"] for item in of_ann.get("/edits").json()] == [session]
    assert of_ann.post(f"/runs/{run_id}/cancel").status_code == 200
    assert helpers.wait(run_id)["state"] == "cancelled"


def test_an_agent_is_not_the_person_of_its_name(tmp_path):
    """The case of issue 25: a person `root`; then, the tokens file changed, an agent `root`
    acting for `someone` (the file refuses both at once, see below)."""
    tokens = {
        "t-mk": {"name": "mk", "kind": "person"},
        "t-root": {"name": "root", "kind": "person"},
        "t-someone": {"name": "someone", "kind": "person"},
    }
    service = start_configured_service(tmp_path, tokens=tokens)
    try:
        person = client(service, "t-root")
        run_id = running_sleeper(service, person, "root-runs")
        session = open_edit_session(person)

        del tokens["t-root"]
        tokens["t-agent-root"] = {"name": "root", "kind": "agent", "owner": "someone"}
        write_tokens_file(tmp_path, tokens)
        agent = client(service, "t-agent-root")
        wait_until(
            lambda: agent.get("/me").status_code == 200,
            timeout=TAKES_EFFECT_S,
            what="the agent's new token to work",
        )
        assert agent.get("/me").json() == {"name": "root", "kind": "agent", "owner": "someone"}

        assert_strangers(service, agent, run_id, session)
        refused = agent.post(f"/runs/{run_id}/cancel")
        assert refused.json()["detail"] == f"root may not cancel run {run_id!r}"
        # nor is the run of the person `root` the run of someone's agent
        assert_strangers(service, client(service, "t-someone"), run_id, session)
        assert client(service, "t-mk").post(f"/runs/{run_id}/cancel").status_code == 200
        assert service.wait(run_id)["state"] == "cancelled"
    finally:
        assert stop_configured_service(service) == 0


def serve(root: Path, tokens: str) -> subprocess.CompletedProcess[str]:
    """`serve_from_config` on a tokens file of this text, expected not to start."""
    write_tokens_file(root, tokens)
    settings = {"store": "store", "db": "db.sqlite", "tokens": "tokens.yaml", "owner": "mk"}
    (root / "settings.yaml").write_text(yaml.safe_dump(settings))
    return subprocess.run(
        [sys.executable, "-c", "import simrun_api.app as app; app.serve_from_config(0)"],
        env={**os.environ, "SIMRUN_CONFIG": str(root / "settings.yaml")},
        capture_output=True,
        text=True,
        timeout=60,
    )


CONFUSED = {
    "a person and an agent of one name": (
        "t-secret-1: {name: root, kind: person}\n"
        "t-secret-2: {name: mk, kind: person}\n"
        "t-secret-3: {name: root, kind: agent, owner: someone}\n",
        "lines 1 and 3",
    ),
    "two persons of one name": (
        "t-secret-1: {name: mk, kind: person}\nt-secret-2: {name: mk}\n",
        "lines 1 and 2",
    ),
    "one agent of one person twice": (
        "t-secret-1: {name: mk}\n"
        "t-secret-2: {name: bot, kind: agent, owner: mk}\n"
        "t-secret-3: {name: bot, kind: agent, owner: mk}\n",
        "lines 2 and 3",
    ),
    "the same token twice": (
        "t-secret-1: {name: mk}\nt-secret-1: {name: ann}\n",
        "lines 1 and 2",
    ),
}


@pytest.mark.parametrize("what", sorted(CONFUSED))
def test_a_tokens_file_of_identities_that_would_be_confused_is_refused(tmp_path, what):
    text, lines = CONFUSED[what]
    done = serve(tmp_path, text)
    assert done.returncode != 0
    assert f"{lines}: {what}" in done.stderr, done.stderr
    assert "t-secret" not in done.stdout + done.stderr


BROKEN = {
    "a mapping in a plain scalar": ("t-secret-1: name: mk\n", "line 1, column 17"),
    "an undefined alias": ("t-a: {name: mk}\nt-b: *t-secret-2\n", "line 2, column 6"),
    "an unknown tag": ("t-a: !t-secret-3 {name: mk}\n", "line 1, column 6"),
    "an unterminated quote": ("t-a: {name: mk}\n't-secret-4: {name: ann}\n", "line 3, column 1"),
    "a tab": ("t-a: {name: mk}\nt-b:\t't-secret-5'\n", "line 2, column 5"),
    "a token indented as a field": (
        "t-a:\n  name: mk\n  t-secret-6: {name: ann}\n",
        "line 3: an unknown field",
    ),
    "a token as a kind": ("t-a: {name: mk, kind: t-secret-7}\n", "line 1: kind: person or agent"),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_errors_about_the_tokens_file_name_lines_and_never_its_content(tmp_path, what):
    text, where = BROKEN[what]
    done = serve(tmp_path, text)
    assert done.returncode != 0
    assert where in done.stderr, done.stderr
    assert "t-secret" not in done.stdout + done.stderr, done.stderr


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ConfiguredService]:
    started = start_configured_service(tmp_path)
    try:
        yield started
    finally:
        assert stop_configured_service(started) == 0


def status(service: ConfiguredService, token: str) -> int:
    with client(service, token) as caller:
        return caller.get("/me").status_code


def test_tokens_added_and_removed_take_effect_without_a_restart(service):
    tokens = dict(TOKENS)
    tokens["t-newcomer"] = {"name": "newcomer", "kind": "person"}
    del tokens["t-ann-bot"]
    write_tokens_file(service.root, tokens)
    wait_until(
        lambda: status(service, "t-newcomer") == 200,
        timeout=TAKES_EFFECT_S,
        what="an added token to work",
    )
    wait_until(
        lambda: status(service, "t-ann-bot") == 401,
        timeout=TAKES_EFFECT_S,
        what="a removed token to stop working",
    )
    assert status(service, "t-mk") == status(service, "t-ann") == 200

    log = service.root / "service.log"
    for broken, where in (
        ("t-mk: {name: mk}\nt-secret-1: name: oops\n", "line 2, column 17"),
        ("t-mk: {name: mk}\nt-secret-2: {name: mk, kind: agent, owner: ann}\n", "lines 1 and 2"),
    ):
        write_tokens_file(service.root, broken)
        wait_until(
            lambda where=where: where in log.read_text(),
            timeout=TAKES_EFFECT_S,
            what="the service to log the tokens file it cannot use",
        )
        assert status(service, "t-newcomer") == status(service, "t-mk") == 200
        assert status(service, "t-secret-2") == 401
    assert "keeps the 4 tokens it had" in log.read_text()
    assert "t-secret" not in log.read_text()

    write_tokens_file(service.root, TOKENS)
    wait_until(
        lambda: status(service, "t-newcomer") == 401 and status(service, "t-ann-bot") == 200,
        timeout=TAKES_EFFECT_S,
        what="the mended file to be read",
    )


def test_the_access_log_shows_no_secret_of_a_query(service):
    secrets = ["s3cr3t-token", "s3cr3t-access", "s3cr3t-key", "s3cr3t-password", "s3cr3t-pass"]
    params = {
        "token": secrets[0],
        "access_token": secrets[1],
        "api_key": secrets[2],
        "password": secrets[3],
        "Client-Secret": secrets[4],
        "timeout": "5",
    }
    assert service.clients["mk"].get("/me", params=params).status_code == 200
    log = service.root / "service.log"
    line = wait_until(
        lambda: next((line for line in log.read_text().splitlines() if "/me?" in line), None),
        what="the access log's line of the request",
    )
    assert not any(secret in log.read_text() for secret in secrets), line
    assert "token=REDACTED" in line and "access_token=REDACTED" in line, line
    assert "Client-Secret=REDACTED" in line and "timeout=5" in line, line
