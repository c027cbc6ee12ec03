"""A service of `serve_from_config` with people and agents: who is recorded with which priority,
the lists by owner and agent, and who may cancel, remove and clean up which runs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from live_service import command, python, run_processes, wait_until
from service_helpers import (
    ConfiguredService,
    sse,
    start_configured_service,
    stop_configured_service,
)

EVENTS_MAX_S = 2.0
SLEEP = python("import time; time.sleep(600)")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfiguredService]:
    root = tmp_path_factory.mktemp("configured")
    (root / "web").mkdir()
    (root / "web" / "index.html").write_text("<html>simrun</html>")
    started = start_configured_service(root, events_max_s=EVENTS_MAX_S, web="web")
    try:
        yield started
    finally:
        assert stop_configured_service(started) == 0


def quick(name: str) -> dict:
    return {"name": name, "tasks": [command("one", ["true"])]}


def sleeper(name: str) -> dict:
    return {"name": name, "tasks": [command("sleep", SLEEP)]}


def ids(response: httpx.Response) -> set[str]:
    assert response.status_code == 200, response.text
    return {item["id"] for item in response.json()}


def test_the_identity_of_the_token_is_recorded_and_decides_the_priority(service):
    expected = {
        "mk": ("mk", None, "owner"),
        "mk-bot": ("mk", "mk-bot", "owner"),
        "ann": ("ann", None, "standard"),
        "ann-bot": ("ann", "ann-bot", "agent"),
    }
    for who, (owner, agent, priority) in expected.items():
        run = service.submit(who, quick(f"by-{who}"), group="priorities")
        submitted = service.clients["mk"].get(f"/runs/{run['id']}", params={"at": 1}).json()
        recorded = (
            submitted["submitted_by"],
            submitted["owner"],
            submitted["agent"],
            submitted["priority"],
        )
        assert recorded == (who, owner, agent, priority), who
        assert service.events(run["id"])[0]["type"] == "submitted"
        assert service.wait(run["id"])["priority"] == priority


def test_runs_are_listed_by_group_owner_agent_and_state(service):
    runs = {
        who: service.submit(who, quick(f"list-{who}"), group="lists")["id"]
        for who in ("mk", "ann", "ann-bot")
    }
    failing = service.submit(
        "ann", {"name": "f", "tasks": [command("boom", ["false"])]}, group="lists"
    )["id"]
    elsewhere = service.submit("ann", quick("elsewhere"), group="other")["id"]
    for run_id in [*runs.values(), failing, elsewhere]:
        service.wait(run_id)
    client = service.clients["mk-bot"]
    assert ids(client.get("/runs", params={"group": "lists"})) == {*runs.values(), failing}
    assert ids(client.get("/runs", params={"group": "lists", "owner": "ann"})) == {
        runs["ann"],
        runs["ann-bot"],
        failing,
    }
    assert ids(client.get("/runs", params={"agent": "ann-bot"})) >= {runs["ann-bot"]}
    assert runs["ann"] not in ids(client.get("/runs", params={"agent": "ann-bot"}))
    assert ids(client.get("/runs", params={"group": "lists", "state": "failed"})) == {failing}
    assert ids(client.get("/runs", params={"group": "lists", "state": "running"})) == set()
    refused = client.get("/runs", params={"state": "finished"})
    assert refused.status_code == 400
    assert "state" in refused.json()["detail"]


def test_who_may_cancel_and_remove_a_run(service):
    ann = service.submit("ann", sleeper("ann-sleeps"))["id"]
    bot = service.submit("ann-bot", sleeper("bot-sleeps"))["id"]
    wait_until(lambda: run_processes(ann) and run_processes(bot), what="both sleepers")
    clients = service.clients

    refused = clients["ann-bot"].post(f"/runs/{ann}/cancel")
    assert refused.status_code == 403, refused.text
    assert "ann-bot may not cancel" in refused.json()["detail"]
    assert not any(e["type"] == "cancel-requested" for e in service.events(ann))
    live = clients["ann"].delete(f"/runs/{ann}")
    assert live.status_code == 409 and "cancel it first" in live.json()["detail"]
    assert service.run_dir(ann).is_dir()

    assert clients["ann"].post(f"/runs/{bot}/cancel").status_code == 200
    assert clients["mk"].post(f"/runs/{ann}/cancel").status_code == 200
    assert service.wait(ann)["state"] == service.wait(bot)["state"] == "cancelled"

    mine = service.submit("mk", quick("mk-runs"))["id"]
    service.wait(mine)
    for who, run_id in (("ann", mine), ("ann-bot", ann), ("mk-bot", ann)):
        response = clients[who].delete(f"/runs/{run_id}")
        assert response.status_code == 403, (who, response.text)
        assert f"{who} may not remove run" in response.json()["detail"]
        assert service.run_dir(run_id).is_dir()

    removed = clients["ann"].delete(f"/runs/{bot}")
    assert removed.status_code == 200, removed.text
    assert removed.json()["runs"] == [f"runs/{bot}"]
    assert clients["mk"].delete(f"/runs/{ann}").status_code == 200
    assert clients["mk-bot"].delete(f"/runs/{mine}").status_code == 403
    for run_id in (ann, bot):
        assert not service.run_dir(run_id).exists()
        assert clients["mk"].get(f"/runs/{run_id}").status_code == 404
    assert clients["mk"].get(f"/runs/{mine}").status_code == 200


def test_a_cleanup_touches_only_the_runs_the_identity_may_remove(service):
    runs = {
        who: service.submit(who, quick(f"clean-{who}"), group="cleanup")["id"]
        for who in ("mk", "ann", "ann-bot")
    }
    for run_id in runs.values():
        service.wait(run_id)
    ann = service.clients["ann"]
    body = {"older_than_days": 0, "group": "cleanup"}
    listed = ann.post("/cleanup", json={**body, "dry_run": True}).json()
    assert listed["dry_run"] is True
    assert sorted(listed["runs"]) == sorted(f"runs/{runs[who]}" for who in ("ann", "ann-bot"))
    assert all(service.run_dir(run_id).is_dir() for run_id in runs.values())

    removed = ann.post("/cleanup", json=body).json()
    assert removed["runs"] == listed["runs"] and removed["dry_run"] is False
    assert removed["bytes_freed"] == listed["bytes_freed"] > 0
    assert ids(ann.get("/runs", params={"group": "cleanup"})) == {runs["mk"]}
    assert ann.post("/cleanup", json=body).json()["runs"] == []

    owner = service.clients["mk"]
    assert owner.post("/cleanup", json={**body, "older_than_days": 1}).json()["runs"] == []
    assert owner.post("/cleanup", json=body).json()["runs"] == [f"runs/{runs['mk']}"]
    assert not service.run_dir(runs["mk"]).exists()


def test_the_event_stream_is_filtered_as_the_list_and_ends_after_events_max_s(service):
    ann = service.submit("ann", quick("streamed"), group="streamed")["id"]
    mine = service.submit("mk", quick("streamed"), group="streamed")["id"]
    service.wait(ann)
    service.wait(mine)
    params = {"group": "streamed", "owner": "ann", "state": "succeeded"}
    started = time.monotonic()
    with service.clients["mk"].stream("GET", "/events", params=params) as stream:
        messages = list(sse(stream.iter_lines()))
    elapsed = time.monotonic() - started
    assert EVENTS_MAX_S <= elapsed < EVENTS_MAX_S + 5
    assert [name for name, _ in messages] == ["runs", "servers"]
    runs = messages[0][1]
    assert [item["id"] for item in runs] == [ann]
    assert runs[0]["workflow"] == "streamed" and runs[0]["progress"] is None


def test_the_web_app_is_served_without_a_token(service):
    page = httpx.get(service.url + "/ui/")
    assert page.status_code == 200
    assert "simrun" in page.text
    assert httpx.get(service.url + "/runs").status_code == 401


def test_malformed_bodies_are_refused_naming_the_field(service):
    client = service.clients["mk"]
    cases = [
        ("/cleanup", {"older_than_days": -1}, "older_than_days"),
        ("/cleanup", {"older_than_days": 1, "groups": "x"}, "groups"),
        ("/compare", {"runs": "20260101-000000-abcdef"}, "runs"),
    ]
    for path, body, field in cases:
        response = client.post(path, json=body)
        assert response.status_code == 400, (path, body)
        assert field in response.json()["detail"], response.json()


def test_the_scratch_is_beside_the_database_by_default(service):
    run = service.submit("mk", quick("scratch"))["id"]
    assert service.wait(run)["state"] == "succeeded"
    assert (service.root / "db" / "scratch" / run / "one").is_dir()
