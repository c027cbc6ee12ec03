"""A page of another site cannot reach the service: a foreign `Host` (what a DNS-rebinding page
sends) is refused on every route, and no answer may be framed."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from live_service import LocalService, start_service, stop_service
from service_helpers import start_configured_service, stop_configured_service

from simrun_api.browsers import API_POLICY, WEB_APP_POLICY, host_name, normal_hosts

FOREIGN = ["evil.example", "127.0.0.1.evil.example", "localhost.", "[::2]"]
ROUTES = ["/local/instance", "/ui/", "/me", "/runs", "/nowhere"]


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
    started = start_service(tmp_path_factory.mktemp("browsers"))
    try:
        yield started
    finally:
        stop_service(started)


@pytest.mark.parametrize("name", FOREIGN)
@pytest.mark.parametrize("route", ROUTES)
def test_a_foreign_host_is_refused_on_every_route(local, route, name):
    port = local.info["url"].rsplit(":", 1)[1]
    answer = local.client.get(route, headers={"Host": f"{name}:{port}"})
    assert answer.status_code == 421, (route, answer.status_code, answer.text)
    assert "host" in answer.json()["detail"]
    assert answer.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]"])
def test_the_loopback_names_are_served(local, name):
    port = local.info["url"].rsplit(":", 1)[1]
    for host in (name, f"{name}:{port}"):
        assert local.client.get("/me", headers={"Host": host}).status_code == 200
        assert local.client.get("/local/instance", headers={"Host": host}).status_code == 200


def test_no_answer_may_be_framed(local):
    for route in ("/ui/", "/me", "/local/instance"):
        answer = local.client.get(route)
        assert answer.status_code == 200, route
        assert answer.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]


def test_every_answer_says_nosniff_and_the_web_app_has_its_content_policy(local):
    page = local.client.get("/ui/")
    assert page.status_code == 200
    script = re.search(r'src="\./(assets/[^"]+\.js)"', page.text)
    assert script, page.text
    web_app = {"/ui/": "text/html", f"/ui/{script[1]}": "text/javascript"}
    for route, media in web_app.items():
        answer = local.client.get(route)
        assert answer.status_code == 200, route
        assert answer.headers["content-type"].startswith(media), (route, answer.headers)
        assert answer.headers["x-content-type-options"] == "nosniff", route
        assert answer.headers["content-security-policy"] == WEB_APP_POLICY, route
    for route, status in {"/me": 200, "/runs": 200, "/nowhere": 404, "/ui/nothing.js": 404}.items():
        answer = local.client.get(route)
        assert answer.status_code == status, route
        assert answer.headers["x-content-type-options"] == "nosniff", route
        policy = answer.headers["content-security-policy"]
        expected = WEB_APP_POLICY if route.startswith("/ui/") else API_POLICY
        assert policy == expected, route
    refused = local.client.get("/me", headers={"Host": "evil.example"})
    assert refused.status_code == 421
    assert refused.headers["x-content-type-options"] == "nosniff"
    assert "default-src 'none'" in WEB_APP_POLICY and "script-src 'self'" in WEB_APP_POLICY


def test_a_configured_service_serves_the_names_of_its_setting(tmp_path):
    service = start_configured_service(tmp_path, hosts=["127.0.0.1", "simrun.lab.example"])
    try:
        client = service.clients["mk"]
        assert client.get("/me", headers={"Host": "simrun.lab.example"}).status_code == 200
        assert client.get("/me", headers={"Host": "localhost"}).status_code == 421
        assert client.get("/me").status_code == 200
    finally:
        stop_configured_service(service)


def test_host_names_lose_their_port_and_keep_the_brackets_of_ipv6():
    assert host_name("LocalHost:8000") == "localhost"
    assert host_name("[::1]:8000") == "[::1]"
    assert host_name("[::1]") == "[::1]"
    assert host_name("example.org") == "example.org"
    assert normal_hosts(["::1", "Example.ORG"]) == {"[::1]", "example.org"}
    assert normal_hosts(["[0:0:0:0:0:0:0:1]"]) == {"[::1]"}


@pytest.mark.parametrize("header", ["[::1]evil.example", "localhost:evil", "localhost:", "[::1]:x"])
def test_a_host_header_of_another_shape_matches_no_name(header):
    assert host_name(header) not in normal_hosts(["127.0.0.1", "localhost", "::1"])


def test_an_open_host_setting_takes_any_name(tmp_path):
    service = start_configured_service(tmp_path, hosts=["*"])
    try:
        answer = service.clients["mk"].get("/me", headers={"Host": "anything.example"})
        assert answer.status_code == 200
    finally:
        stop_configured_service(service)


def test_a_raw_request_without_a_known_host_gets_no_data(local):
    port = int(local.info["url"].rsplit(":", 1)[1])
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        answer = client.get("/local/instance", headers={"Host": "rebound.example"})
    assert answer.status_code == 421
    assert "token" not in answer.text and "pid" not in answer.text


@pytest.mark.parametrize("path", ["/ui/%00", "/ui/a%00b", "/ui/%00/x", "/runs/x%00/events"])
def test_a_path_with_a_nul_byte_is_a_bad_request_not_a_crash(local, path):
    answer = local.client.get(path)
    assert answer.status_code == 400, answer.text
    assert "NUL" in answer.json()["detail"]
