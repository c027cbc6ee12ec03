"""The Editor's routes: the catalogue of task types, the YAML of a workflow, and the edit
sessions between `simrun edit` (here: HTTP calls as it makes them) and the browser, against a
real service of several identities; and the sessions' clock (connected for 30 s) without one."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
import pytest
from live_service import wait_until
from service_helpers import ConfiguredService, start_configured_service, stop_configured_service

from simrun_api.edits import EditSessions, SessionUnavailable
from simrun_core.edits import (
    DiskState,
    EditAsk,
    EditResult,
    EditState,
    OpenEdit,
    file_version,
    task_type_view,
)
from simrun_core.plugins import TaskType
from simrun_core.wire import Identity
from simrun_core.workflow import Workflow, parse_workflow, workflow_yaml

TEXT = "name: fit\ntasks:\n  - id: squares\n    type: demo.squares\n    settings:\n      n: 3\n"
MK = Identity("mk", "person", "mk")


def opening(text: str | None = TEXT, path: str = "/home/mk/study/fit.yaml") -> dict[str, Any]:
    workflow = msgspec.to_builtins(parse_workflow(text)) if text else {"name": "fit", "tasks": []}
    disk = {"version": file_version(text), "workflow": workflow, "problems": []}
    return {
        "path": path,
        "machine": "laptop",
        "disk": disk,
        "sources": [{"name": "model", "branch": "main", "commit": "c0ffee"}],
        "trees": [{"name": "model", "path": "/home/mk/model", "branch": "main", "changed": []}],
        "group": "study",
    }


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfiguredService]:
    started = start_configured_service(tmp_path_factory.mktemp("edits"))
    try:
        yield started
    finally:
        assert stop_configured_service(started) == 0


def open_session(service: ConfiguredService, who: str = "mk", **kwargs: Any) -> dict[str, Any]:
    response = service.clients[who].post("/edits", json=opening(**kwargs))
    assert response.status_code == 201, response.text
    return response.json()


class Command:
    """What `simrun edit` does over HTTP: a thread long-polls the requests of a session and
    answers each with `answer(request)`; every request seen is kept in `seen`, and `polls`
    counts the polls it completed."""

    def __init__(self, service: ConfiguredService, session: str, answer: Any) -> None:
        self.client = service.clients["mk"]
        self.session = session
        self.answer = answer
        self.seen: list[dict[str, Any]] = []
        self.polls = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            response = self.client.get(
                f"/edits/{self.session}/requests", params={"timeout": 1}, timeout=30
            )
            if response.status_code != 200:
                return
            for request in response.json():
                self.seen.append(request)
                result = self.answer(request)
                url = f"/edits/{self.session}/requests/{request['id']}/result"
                assert self.client.post(url, json=result).status_code == 200
            self.polls += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def test_the_catalogue_has_every_type_with_the_schema_of_its_settings(service):
    response = service.clients["ann"].get("/task-types")
    assert response.status_code == 200
    types = {entry["name"]: entry for entry in response.json()}
    assert {"command", "demo.squares"} <= set(types)
    squares = types["demo.squares"]
    assert squares["description"] == "Sums of squares, one unit per number"
    assert squares["inputs"] == ["after"] and squares["outputs"] == ["squares"]
    assert squares["splittable"] is True and squares["has_plan"] is False
    assert squares["hint"] == {
        "memory_base_gb": 0.125,
        "memory_per_worker_gb": 0.25,
        "scratch_gb": 0.0,
        "gpus": 0,
    }
    schema = squares["settings_schema"]
    assert schema["type"] == "object" and schema["required"] == ["n"]
    assert schema["properties"]["n"]["type"] == "integer"
    assert schema["properties"]["sleep_s"]["type"] == "number"
    assert schema["properties"]["sleep_s"]["default"] == 0.0
    for name, field in schema["properties"].items():
        assert len(field["description"]) > 20, f"setting {name} is described for an agent"
    command = types["command"]
    assert command["splittable"] is False and command["outputs"] == ["out"]
    assert command["settings_schema"]["properties"]["args"]["items"] == {"type": "string"}


class Planned(msgspec.Struct, forbid_unknown_fields=True):
    """Settings of a type whose plan sets `rows`; `mode` a choice, `nested` a struct."""

    data: str
    rows: Annotated[int, msgspec.Meta(extra_json_schema={"readOnly": True})] = 0
    mode: Annotated[str, msgspec.Meta(extra_json_schema={"enum": ["fast", "exact"]})] = "fast"
    nested: Workflow | None = None


def test_a_field_the_plan_sets_is_read_only_and_referred_structs_are_in_defs():
    view = task_type_view(
        TaskType(name="study.fit", settings=Planned, plan="x:y", cost_setting="data")
    )
    schema = view.settings_schema
    assert schema["properties"]["rows"]["readOnly"] is True
    assert "readOnly" not in schema["properties"]["data"]
    assert schema["properties"]["mode"]["enum"] == ["fast", "exact"]
    assert schema["properties"]["nested"]["anyOf"][0] == {"$ref": "#/$defs/Workflow"}
    assert {"Workflow", "TaskSpec"} <= set(schema["$defs"])
    assert view.has_plan is True and view.cost_setting == "data"
    assert view.description == "" and view.splittable is False


def test_the_yaml_of_a_workflow_is_the_one_simrun_writes(service):
    workflow = msgspec.to_builtins(parse_workflow(TEXT))
    answer = service.clients["ann"].post("/workflow-yaml", json={"workflow": workflow})
    assert answer.status_code == 200
    assert answer.json()["text"] == workflow_yaml(parse_workflow(TEXT)) == TEXT
    bad = service.clients["ann"].post("/workflow-yaml", json={"workflow": {"name": 1}})
    assert bad.status_code == 400


def test_a_session_is_listed_for_its_identity_only(service):
    session = open_session(service)
    assert session["file"] == "fit.yaml" and session["directory"] == "/home/mk/study"
    assert session["opened_by"] == "mk" and session["machine"] == "laptop"
    assert session["connected"] is True and session["closed"] is None
    assert session["disk"]["workflow"]["name"] == "fit" and session["group"] == "study"
    listed = service.clients["mk"].get("/edits").json()
    assert session["id"] in [each["id"] for each in listed]
    assert session["id"] not in [each["id"] for each in service.clients["ann"].get("/edits").json()]
    # Another person, even the agent of the person, may not read or use it.
    for who in ("ann", "mk-bot"):
        client = service.clients[who]
        assert client.get(f"/edits/{session['id']}").status_code == 403
        ask = {"kind": "save", "workflow": session["disk"]["workflow"]}
        refused = client.post(f"/edits/{session['id']}/requests", json=ask)
        assert refused.status_code == 403
        assert "opened by mk" in refused.json()["detail"]
    assert service.clients["mk"].get("/edits/0123456789abcdef").status_code == 404


def test_a_save_of_the_browser_reaches_the_command_and_comes_back(service):
    session = open_session(service)
    saved = parse_workflow(TEXT.replace("n: 3", "n: 4"))
    disk = {"version": file_version(workflow_yaml(saved)), "workflow": msgspec.to_builtins(saved)}

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        return {"outcome": "saved", "message": "saved fit.yaml", "disk": disk}

    command = Command(service, session["id"], answer)
    try:
        started = time.monotonic()
        ask = {
            "kind": "save",
            "workflow": msgspec.to_builtins(saved),
            "base": session["disk"]["version"],
        }
        result = service.clients["mk"].post(f"/edits/{session['id']}/requests", json=ask)
        assert result.status_code == 200, result.text
        assert time.monotonic() - started < 5
        assert result.json()["outcome"] == "saved"
        request = command.seen[0]
        assert request["kind"] == "save" and request["base"] == session["disk"]["version"]
        assert request["workflow"]["tasks"][0]["settings"] == {"n": 4}
        assert request["asked_by"] == "mk" and request["force"] is False
        # The session has what was saved, and the request is not asked again.
        after = service.clients["mk"].get(f"/edits/{session['id']}").json()
        assert after["disk"]["version"] == disk["version"]
        # Two more polls: the later one began after the answer, and would have had it again.
        polled = command.polls
        wait_until(lambda: command.polls >= polled + 2, what="two more polls of the command")
        assert len(command.seen) == 1
    finally:
        command.close()


def test_an_answer_sent_twice_counts_once_and_a_request_comes_again_until_answered(service):
    session = open_session(service)
    client = service.clients["mk"]
    asked: dict[str, Any] = {}

    def browser() -> None:
        ask = {"kind": "run", "workflow": session["disk"]["workflow"]}
        asked["answer"] = client.post(f"/edits/{session['id']}/requests", json=ask)

    thread = threading.Thread(target=browser)
    thread.start()
    polled = f"/edits/{session['id']}/requests"
    first = wait_until(lambda: client.get(polled, params={"timeout": 1}).json(), what="a request")
    again = client.get(polled, params={"timeout": 0}).json()
    assert [request["id"] for request in again] == [first[0]["id"]]  # not answered yet
    result = {"outcome": "submitted", "run": "20260101-000000-abcdef", "message": "run"}
    url = f"{polled}/{first[0]['id']}/result"
    assert client.post(url, json=result).status_code == 200
    assert client.post(url, json={"outcome": "failed", "message": "late"}).status_code == 200
    thread.join(10)
    assert asked["answer"].status_code == 200
    assert asked["answer"].json()["outcome"] == "submitted"
    assert client.get(polled, params={"timeout": 0}).json() == []


def test_a_closed_session_fails_what_waits_for_it_at_once_and_takes_no_more(service):
    session = open_session(service)
    client = service.clients["mk"]
    asked: dict[str, Any] = {}

    def browser() -> None:
        started = time.monotonic()
        ask = {"kind": "save", "workflow": session["disk"]["workflow"]}
        asked["answer"] = client.post(f"/edits/{session['id']}/requests", json=ask)
        asked["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=browser)
    thread.start()
    polled = f"/edits/{session['id']}/requests"
    wait_until(lambda: client.get(polled, params={"timeout": 1}).json(), what="the request")
    closed = client.post(f"/edits/{session['id']}/close")
    assert closed.status_code == 200
    assert closed.json()["connected"] is False and closed.json()["closed"] is not None
    thread.join(10)
    assert asked["answer"].status_code == 409
    assert "stopped before it answered" in asked["answer"].json()["detail"]
    assert asked["seconds"] < 5
    again = client.post(
        f"/edits/{session['id']}/requests",
        json={"kind": "save", "workflow": {"name": "x", "tasks": []}},
    )
    assert again.status_code == 409 and "is closed" in again.json()["detail"]
    assert client.get(polled).status_code == 409
    state = {"disk": {"version": None, "workflow": None}}
    assert client.post(f"/edits/{session['id']}/state", json=state).status_code == 409


def test_the_command_sends_what_changed_on_disk(service):
    session = open_session(service)
    client = service.clients["mk"]
    changed = TEXT.replace("fit", "fit-2", 1)
    state = {
        "disk": {
            "version": file_version(changed),
            "workflow": msgspec.to_builtins(parse_workflow(changed)),
        },
        "trees": [{"name": "model", "path": "/m", "branch": "dev", "changed": ["M model.py"]}],
    }
    answer = client.post(f"/edits/{session['id']}/state", json=state)
    assert answer.status_code == 200
    seen = client.get(f"/edits/{session['id']}").json()
    assert seen["disk"]["workflow"]["name"] == "fit-2"
    assert seen["trees"][0]["changed"] == ["M model.py"]
    assert seen["sources"] == session["sources"]  # no new snapshots sent: as before


def test_a_session_survives_a_restart_of_the_service_not_connected_until_asked(tmp_path):
    first = start_configured_service(tmp_path)
    try:
        session = open_session(first)
    finally:
        assert stop_configured_service(first) == 0
    second = start_configured_service(tmp_path)
    try:
        client = second.clients["mk"]
        kept = client.get(f"/edits/{session['id']}").json()
        assert kept["disk"] == session["disk"] and kept["connected"] is False
        ask = {"kind": "save", "workflow": session["disk"]["workflow"]}
        refused = client.post(f"/edits/{session['id']}/requests", json=ask)
        assert refused.status_code == 409 and "not connected" in refused.json()["detail"]
        assert client.get(f"/edits/{session['id']}/requests", params={"timeout": 0}).json() == []
        assert client.get(f"/edits/{session['id']}").json()["connected"] is True
    finally:
        assert stop_configured_service(second) == 0


def run_in_a_loop_of_its_own(coroutine: Any) -> None:
    """Run a coroutine in a thread of its own (the browser tests leave a loop in this one)."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(coroutine)
        except BaseException as error:  # handed to the test's thread
            failed.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    if failed:
        raise failed[0]


def test_a_session_not_asked_for_30_seconds_is_not_connected(tmp_path):
    """The clock of the sessions without a service: connected while the command asked within
    `connected_s`; a request waiting for it fails once the command is away that long."""
    now = [1000.0]
    sessions = EditSessions(tmp_path, clock=lambda: now[0])
    body = OpenEdit(
        path="/w/fit.yaml",
        machine="laptop",
        disk=DiskState(version=None, workflow=Workflow(name="fit", tasks=[])),
    )

    async def scenario() -> None:
        opened = await sessions.open(MK, body)
        assert opened.connected is True
        now[0] += 29.0
        assert sessions.get(opened.id, MK).connected is True
        now[0] += 2.0
        assert sessions.get(opened.id, MK).connected is False
        with pytest.raises(SessionUnavailable, match="not connected"):
            await sessions.ask(opened.id, MK, EditAsk(kind="save", workflow=body.disk.workflow))
        state = EditState(disk=body.disk)
        assert (await sessions.state(opened.id, MK, state)).connected is True
        waiting = asyncio.create_task(
            sessions.ask(opened.id, MK, EditAsk(kind="run", workflow=body.disk.workflow))
        )
        await asyncio.sleep(0.05)
        now[0] += 31.0  # the command went away (asleep, off the network) without a close
        with pytest.raises(SessionUnavailable, match="not connected"):
            await asyncio.wait_for(waiting, 5)
        # A late answer to a request nobody waits for changes nothing, but is a sign of life.
        result = EditResult(outcome="saved")
        assert (await sessions.answer(opened.id, MK, "gone", result)).connected is True

    run_in_a_loop_of_its_own(scenario())
    record = msgspec.json.decode(
        (tmp_path / "edits").glob("*/session.json").__next__().read_bytes()
    )
    assert record["opened_by"] == "mk" and record["closed"] is None
    assert datetime.fromisoformat(record["created"]) <= datetime.now(UTC)


def nested_settings(depth: int) -> dict[str, Any]:
    """A workflow whose one task's settings nest `depth` levels deep."""
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    task = {"id": "squares", "type": "demo.squares", "settings": {"deep": value}}
    return {"name": "deep", "tasks": [task]}


@pytest.mark.parametrize("depth", [100, 500])
def test_the_yaml_of_a_workflow_deeper_than_a_file_may_be_is_refused_naming_the_limit(
    service, depth
):
    answer = service.clients["ann"].post(
        "/workflow-yaml", json={"workflow": nested_settings(depth)}
    )
    assert answer.status_code == 422, answer.text
    assert "nested deeper than 64 levels" in answer.json()["detail"]


def test_a_draft_deeper_than_a_file_may_be_never_reaches_the_command(service):
    session = open_session(service)
    ask = {"kind": "save", "workflow": nested_settings(500)}
    answer = service.clients["mk"].post(f"/edits/{session['id']}/requests", json=ask)
    assert answer.status_code == 422, answer.text
    assert "nested deeper than 64 levels" in answer.json()["detail"]
