"""Every route needs a known bearer token, but the instance check of a local service."""

from __future__ import annotations

import httpx
from litestar.routes import HTTPRoute

from simrun_api.app import ROUTES, create_app
from simrun_api.auth import TokensError, load_tokens, write_tokens
from simrun_api.backends.local import LocalBackend
from simrun_api.local import local_settings
from simrun_core.wire import Identity

OPEN = {"/local/instance", "/ui", "/ui/{file_path:path}"}
"""What needs no token: the instance check of a local service and the files of the web app."""


def _paths(tmp_path) -> list[tuple[str, str]]:
    settings = local_settings(tmp_path)
    app = create_app(settings, LocalBackend(settings.store, tmp_path / "scratch"))
    routes = []
    for route in app.routes:
        if isinstance(route, HTTPRoute):
            for method in route.methods - {"OPTIONS", "HEAD"}:
                path = (
                    route.path.replace("{run:str}", "20260101-000000-abcdef")
                    .replace("{task:str}", "squares")
                    .replace("{path:path}", "summary.json")
                    .replace("{name:str}", "model")
                    .replace("{session:str}", EDIT)
                    .replace("{request_id:str}", "0123456789abcdef")
                )
                routes.append((method, path))
    return routes


RUN = "/runs/20260101-000000-abcdef"
EDIT = "0123456789abcdef"
SESSION = f"/edits/{EDIT}"
DOCUMENTED = {
    ("GET", "/me"),
    ("GET", "/local/instance"),
    ("POST", "/validate"),
    ("POST", "/estimate"),
    ("POST", "/runs"),
    ("GET", "/runs"),
    ("GET", RUN),
    ("DELETE", RUN),
    ("GET", "/servers"),
    ("GET", "/events"),
    ("GET", RUN + "/events"),
    ("GET", RUN + "/history"),
    ("GET", RUN + "/tasks/squares/workers"),
    ("GET", RUN + "/wait"),
    ("GET", RUN + "/progress"),
    ("GET", RUN + "/logs/squares"),
    ("GET", RUN + "/outputs/squares"),
    ("GET", RUN + "/outputs/squares/summary.json"),
    ("GET", RUN + "/tasks/squares/outputs.tar"),
    ("POST", RUN + "/cancel"),
    ("POST", "/cleanup"),
    ("GET", "/usage"),
    ("POST", "/compare"),
    ("POST", "/snapshots/model/missing"),
    ("POST", "/snapshots/model"),
    ("GET", "/task-types"),
    ("POST", "/workflow-yaml"),
    ("POST", "/edits"),
    ("GET", "/edits"),
    ("GET", SESSION),
    ("POST", SESSION + "/state"),
    ("GET", SESSION + "/requests"),
    ("POST", SESSION + "/requests"),
    ("POST", SESSION + "/requests/0123456789abcdef/result"),
    ("POST", SESSION + "/close"),
    ("GET", "/ui"),
    ("GET", "/ui/{file_path:path}"),
}


def test_the_route_table_is_the_documented_one(tmp_path):
    """Spec 10's routes, history and replay, the local instance, the Editor's catalogue and
    edit sessions, and the web app; no documentation routes."""
    routes = _paths(tmp_path)
    assert len(ROUTES) == 35
    assert len(routes) == len(DOCUMENTED)
    assert set(routes) == DOCUMENTED


def test_every_route_refuses_a_request_without_a_token(local_service, tmp_path):
    url = local_service.info["url"]
    for method, path in _paths(tmp_path):
        if path in OPEN:
            continue
        for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic x"}):
            response = httpx.request(method, url + path, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.text)
            assert "token" in response.json()["detail"]


def test_the_instance_answers_without_a_token(local_service):
    response = httpx.get(local_service.info["url"] + "/local/instance")
    assert response.status_code == 200
    assert response.json() == {"instance": local_service.info["instance"]}


def test_me_names_the_person_who_owns_the_local_service(local_service):
    me = local_service.client.get("/me").json()
    assert me["kind"] == "person"
    assert me["owner"] == me["name"]


def test_the_local_files_with_secrets_are_private(local_service):
    simrun = local_service.root / ".simrun"
    assert (simrun / "service.json").stat().st_mode & 0o777 == 0o600
    assert (simrun / "tokens.yaml").stat().st_mode & 0o777 == 0o600
    assert (simrun / ".gitignore").read_text() == "*\n"


def test_a_tokens_file_others_can_read_is_refused(tmp_path):
    path = tmp_path / "tokens.yaml"
    write_tokens(path, {"secret": Identity("mk", "person", "mk")})
    assert load_tokens(path)["secret"].name == "mk"
    path.chmod(0o644)
    try:
        load_tokens(path)
    except TokensError as error:
        assert "chmod 600" in str(error)
    else:
        raise AssertionError("a readable tokens file was accepted")


def test_an_agent_is_owned_by_its_person(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text("t1: {name: mk, kind: person}\nt2: {name: bot, kind: agent, owner: mk}\n")
    path.chmod(0o600)
    tokens = load_tokens(path)
    assert tokens["t2"] == Identity("bot", "agent", "mk")
    path.write_text("t2: {name: bot, kind: agent}\n")
    try:
        load_tokens(path)
    except TokensError as error:
        assert "line 1: an agent needs an owner" in str(error)
    else:
        raise AssertionError("an agent without owner was accepted")
