"""What the web app needs of the service: its files at `/ui/` without a token (the installed
build by default), and the messages `run`, `progress` and `workers` of a run's event stream, the
public views of the run, resumable by `Last-Event-ID` like its events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from live_service import LocalService, start_service, stop_service

from simrun_api.settings import WEB_APP, installed_web, load_settings

SQUARES = {
    "name": "squares",
    "tasks": [{"id": "squares", "type": "demo.squares", "settings": {"n": 30, "sleep_s": 0.0}}],
}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
    started = start_service(tmp_path_factory.mktemp("web-app"))
    try:
        yield started
    finally:
        stop_service(started)


def messages(response: httpx.Response) -> Iterator[tuple[str, str | None, Any]]:
    """The messages of an SSE response: (event, id, data decoded as JSON)."""
    event, ident, data = "message", None, []
    for line in response.iter_lines():
        if not line:
            if data:
                yield event, ident, json.loads("\n".join(data))
            event, ident, data = "message", None, []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("id:"):
            ident = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def stream(service: LocalService, run_id: str, **headers: str) -> list[tuple[str, str | None, Any]]:
    path = f"/runs/{run_id}/events"
    with service.client.stream("GET", path, params={"views": "true"}, headers=headers) as answer:
        assert answer.status_code == 200, answer.read()
        return list(messages(answer))


def test_the_app_is_served_without_a_token_and_the_api_still_needs_one(service):
    open_client = httpx.Client(base_url=service.info["url"], timeout=30)
    with open_client:
        page = open_client.get("/ui/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.headers["cache-control"] == "no-cache"
        assets = [name for name in page.text.split('"') if name.startswith("./assets/")]
        assert assets and all(
            open_client.get(f"/ui/{name[2:]}").status_code == 200 for name in assets
        )
        # Without the slash the relative names of the assets would miss: a redirect.
        moved = open_client.get("/ui")
        assert moved.status_code in (301, 302, 307, 308) and moved.headers["location"] == "ui/"
        assert open_client.get("/me").status_code == 401
        assert open_client.get("/events").status_code == 401


def test_the_installed_web_app_is_the_default_and_null_serves_none(tmp_path: Path):
    assert installed_web() == WEB_APP and (WEB_APP / "index.html").is_file()
    base = {"store": "store", "db": "db.sqlite", "tokens": "tokens.yaml", "owner": "mk"}
    (tmp_path / "default.yaml").write_text(yaml.safe_dump(base))
    (tmp_path / "none.yaml").write_text(yaml.safe_dump({**base, "web": None}))
    assert load_settings(tmp_path / "default.yaml").web == WEB_APP
    assert load_settings(tmp_path / "none.yaml").web is None


def test_a_run_stream_with_views_sends_the_run_its_progress_and_workers(service):
    run = service.submit(SQUARES)["id"]
    service.wait(run)
    sent = stream(service, run)
    history = service.client.get(f"/runs/{run}/history").json()
    events = [
        (name, ident) for name, ident, _ in sent if name not in ("run", "progress", "workers")
    ]
    assert events == [(event["type"], str(event["seq"])) for event in history]
    views = {
        name: (ident, data) for name, ident, data in sent if name in ("run", "progress", "workers")
    }
    last = str(history[-1]["seq"])
    # Sent after the events they fold, with the seq of the last one as their id.
    assert [name for name, _, _ in sent[-3:]] == ["run", "progress", "workers"]
    assert {ident for ident, _ in views.values()} == {last}
    assert views["run"][1] == service.client.get(f"/runs/{run}").json()
    assert views["progress"][1] == service.client.get(f"/runs/{run}/progress").json()
    workers = service.client.get(f"/runs/{run}/tasks/squares/workers").json()
    assert views["workers"][1] == {"squares": workers}
    # The memory bar of a worker: its peak against the limit of its report, in the public view.
    pod = views["run"][1]["tasks"]["squares"]["pods"][0]
    assert pod["memory_limit_gb"] == workers[0]["memory_limit_gb"] > 0
    assert 0 < pod["peak_memory_gb"] <= pod["memory_limit_gb"]


def test_a_resumed_stream_sends_no_event_twice_and_the_views_again(service):
    run = service.submit(SQUARES)["id"]
    service.wait(run)
    history = service.client.get(f"/runs/{run}/history").json()
    middle = history[len(history) // 2]["seq"]
    resumed = stream(service, run, **{"Last-Event-ID": str(middle)})
    seqs = [int(ident) for name, ident, _ in resumed if name not in ("run", "progress", "workers")]
    assert seqs == [event["seq"] for event in history if event["seq"] > middle]
    assert [name for name, _, _ in resumed[-3:]] == ["run", "progress", "workers"]
    at_end = stream(service, run, **{"Last-Event-ID": str(history[-1]["seq"])})
    assert [name for name, _, _ in at_end] == ["run", "progress", "workers"]


def test_a_stream_without_views_is_the_events_only(service):
    run = service.submit(SQUARES)["id"]
    service.wait(run)
    with service.client.stream("GET", f"/runs/{run}/events") as answer:
        names = [name for name, _, _ in messages(answer)]
    assert not {"run", "progress", "workers"} & set(names)
    assert names[0] == "submitted" and names[-1] == "succeeded"
