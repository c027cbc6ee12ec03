"""The bounds of the edit sessions against a real service over HTTP: a session larger than
`max_edit_session_bytes` is refused (413, nothing kept), an identity has at most
`max_edit_sessions_per_identity` (its oldest closed one goes, 429 when all are connected), a
session closed or not seen for `edit_session_max_age_s` is removed, and `GET /edits` lists
summaries, not what the sessions hold (an agent stored 300 MiB that `GET /edits` answered)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_service import wait_until
from service_helpers import ConfiguredService, start_configured_service, stop_configured_service

MAX_BYTES = 16 * 1024
PER_IDENTITY = 3


def opening(name: str = "fit", padding: str = "", path: str = "/home/mk/fit.yaml") -> dict:
    """The opening of a session by `simrun edit`; `padding` a problem of its file, to make it
    as large as a test needs."""
    workflow = {
        "name": name,
        "tasks": [{"id": "squares", "type": "demo.squares", "settings": {"n": 3}}],
    }
    return {
        "path": path,
        "machine": "laptop",
        "disk": {
            "version": "0" * 64,
            "workflow": workflow,
            "problems": [padding] if padding else [],
        },
        "sources": [],
        "trees": [],
        "group": None,
    }


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfiguredService]:
    started = start_configured_service(
        tmp_path_factory.mktemp("edit-limits"),
        max_edit_session_bytes=MAX_BYTES,
        max_edit_sessions_per_identity=PER_IDENTITY,
    )
    try:
        yield started
    finally:
        assert stop_configured_service(started) == 0


def sessions_on_disk(service: ConfiguredService) -> set[str]:
    edits = service.store / "edits"
    return {entry.name for entry in edits.iterdir()} if edits.is_dir() else set()


def open_session(service: ConfiguredService, who: str, **kwargs: Any) -> str:
    response = service.clients[who].post("/edits", json=opening(**kwargs))
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_a_session_larger_than_the_limit_is_refused_and_keeps_what_it_had(service):
    before = sessions_on_disk(service)
    refused = service.clients["ann"].post("/edits", json=opening(padding="x" * MAX_BYTES))
    assert refused.status_code == 413, refused.text
    assert str(MAX_BYTES) in refused.json()["detail"]
    assert "max_edit_session_bytes" in refused.json()["detail"]
    assert sessions_on_disk(service) == before

    session = open_session(service, "ann", name="small")
    big = opening(name="big", padding="y" * MAX_BYTES)
    state = {"disk": big["disk"], "trees": []}
    grown = service.clients["ann"].post(f"/edits/{session}/state", json=state)
    assert grown.status_code == 413, grown.text
    assert "max_edit_session_bytes" in grown.json()["detail"]
    kept = service.clients["ann"].get(f"/edits/{session}").json()
    assert kept["disk"]["workflow"]["name"] == "small"
    on_disk = (service.store / "edits" / session / "session.json").read_bytes()
    assert len(on_disk) < MAX_BYTES and b'"small"' in on_disk
    service.clients["ann"].post(f"/edits/{session}/close")


def test_an_identity_has_at_most_its_sessions_the_oldest_closed_one_goes_first(service):
    who = "mk-bot"
    first, second, third = (open_session(service, who, name=f"s{n}") for n in range(3))
    # The first two stop (closed); the third's command is still there.
    for session in (first, second):
        assert service.clients[who].post(f"/edits/{session}/close").status_code == 200
    fourth = open_session(service, who, name="s3")
    assert service.clients[who].get(f"/edits/{first}").status_code == 404
    assert first not in sessions_on_disk(service)
    assert service.clients[who].get(f"/edits/{second}").status_code == 200
    fifth = open_session(service, who, name="s4")
    assert second not in sessions_on_disk(service)
    # All three are connected now: a sixth is refused, naming the limit, and nothing goes.
    refused = service.clients[who].post("/edits", json=opening(name="s5"))
    assert refused.status_code == 429, refused.text
    detail = refused.json()["detail"]
    assert "max_edit_sessions_per_identity" in detail and str(PER_IDENTITY) in detail, detail
    listed = {each["id"] for each in service.clients[who].get("/edits").json()}
    assert listed == {third, fourth, fifth}
    # Another identity has sessions of its own.
    open_session(service, "mk", name="mine")
    for session in (third, fourth, fifth):
        service.clients[who].post(f"/edits/{session}/close")


def test_the_list_of_sessions_is_summaries_not_what_they_hold(service):
    session = open_session(service, "ann-bot", name="summary", padding="z" * (MAX_BYTES // 2))
    (listed,) = [each for each in service.clients["ann-bot"].get("/edits").json()]
    assert listed["id"] == session and listed["workflow"] == "summary"
    assert listed["file"] == "fit.yaml" and listed["connected"] is True
    assert "disk" not in listed and "trees" not in listed and "sources" not in listed
    assert len(service.clients["ann-bot"].get("/edits").content) < 1024
    # The session itself still holds all of it.
    whole = service.clients["ann-bot"].get(f"/edits/{session}").json()
    assert whole["disk"]["problems"] == ["z" * (MAX_BYTES // 2)]


def test_sessions_closed_or_not_seen_for_their_age_are_removed(tmp_path: Path):
    root = tmp_path / "service"
    root.mkdir()
    first = start_configured_service(root)
    try:
        idle = open_session(first, "mk", name="idle")  # its command is gone with this service
    finally:
        assert stop_configured_service(first) == 0
    service = start_configured_service(root, edit_session_max_age_s=1.0)
    try:
        closed = open_session(service, "mk", name="closed")
        assert service.clients["mk"].post(f"/edits/{closed}/close").status_code == 200
        connected = open_session(service, "mk", name="connected")

        def removed() -> bool:
            listed = {each["id"] for each in service.clients["mk"].get("/edits").json()}
            return idle not in listed and closed not in listed

        wait_until(removed, timeout=30, what="the old sessions to be removed")
        assert sessions_on_disk(service) == {connected}
        assert service.clients["mk"].get(f"/edits/{connected}").status_code == 200
    finally:
        assert stop_configured_service(service) == 0


def test_sessions_opened_at_once_stay_within_the_limit(tmp_path: Path):
    """Openings that arrive together are counted one after the other: each sees the sessions
    the others opened, so no burst passes `max_edit_sessions_per_identity`."""
    service = start_configured_service(tmp_path, max_edit_sessions_per_identity=PER_IDENTITY)
    try:
        burst = 4 * PER_IDENTITY
        ready = threading.Barrier(burst)

        def open_one(number: int) -> int:
            headers = {"Authorization": "Bearer t-mk"}
            with httpx.Client(base_url=service.url, headers=headers, timeout=90) as client:
                ready.wait(timeout=60)
                return client.post("/edits", json=opening(name=f"b{number}")).status_code

        with ThreadPoolExecutor(burst) as pool:
            statuses = list(pool.map(open_one, range(burst)))
        assert sorted(statuses) == [201] * PER_IDENTITY + [429] * (burst - PER_IDENTITY)
        assert len(sessions_on_disk(service)) == PER_IDENTITY
        assert len(service.clients["mk"].get("/edits").json()) == PER_IDENTITY
    finally:
        assert stop_configured_service(service) == 0
