"""Clients that send a request's body too slowly: the body must keep coming at a minimum rate
(`body_min_rate` bytes a second, checked over every `body_timeout_s` the service waits for it),
else the request is answered 408 and its connection closed; an upload that is slow but keeps
that rate is taken."""

from __future__ import annotations

import json
import socket
import time

import pytest
from service_helpers import start_configured_service, stop_configured_service
from sse_sockets import connect

BODY_TIMEOUT_S = 1.0
BODY_MIN_RATE = 200
"""Bytes a second: 200 bytes in each second the service waits for the body."""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("slow-bodies")
    started = start_configured_service(
        root, body_timeout_s=BODY_TIMEOUT_S, body_min_rate=BODY_MIN_RATE
    )
    yield started
    stop_configured_service(started)


def port_of(service) -> int:
    return int(service.url.rsplit(":", 1)[1])


def validation_body() -> bytes:
    """A body of POST /validate of about 4 KiB (a workflow, padded with a long task command)."""
    workflow = {
        "name": "padded",
        "tasks": [{"id": "a", "command": ["echo", "x" * 4000]}],
    }
    return json.dumps({"workflow": workflow}).encode()


def headers_of(port: int, body: bytes) -> bytes:
    return (
        f"POST /validate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer t-mk\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()


def send_paced(sock: socket.socket, body: bytes, chunk: int, every_s: float, limit_s: float):
    """Send `body` `chunk` bytes every `every_s` seconds, reading what the service answers
    meanwhile, until the body is sent and answered, the service closes the connection, or
    `limit_s` passes: (what the service sent, seconds from the first byte, whether it closed)."""
    sock.setblocking(False)
    answer = bytearray()
    started = time.monotonic()
    sent = 0
    closed = False
    while time.monotonic() - started < limit_s:
        if sent < len(body):
            try:
                sent += sock.send(body[sent : sent + chunk])
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        deadline = time.monotonic() + every_s
        while time.monotonic() < deadline:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not data:
                closed = True
                break
            answer += data
        if closed or (sent == len(body) and b"\r\n\r\n" in answer):
            break
    return bytes(answer), time.monotonic() - started, closed


def test_a_body_that_trickles_is_answered_408_and_closed_within_the_bound(service):
    port = port_of(service)
    body = validation_body()
    sock = connect(port)
    try:
        sock.sendall(headers_of(port, body))
        # 5 bytes a second, far below 200: cut after the first second waited.
        answer, took, closed = send_paced(sock, body, chunk=1, every_s=0.2, limit_s=40)
    finally:
        sock.close()
    assert closed, f"a body sent a byte at a time kept its connection {took:.0f} s"
    assert took < BODY_TIMEOUT_S + 10
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    detail = json.loads(answer.split(b"\r\n\r\n", 1)[1])["detail"]
    assert "body_min_rate" in detail and "too slowly" in detail
    assert service.clients["mk"].get("/me").status_code == 200


def test_a_slow_upload_that_keeps_the_rate_and_a_normal_one_are_answered(service):
    port = port_of(service)
    body = validation_body()
    # About 1,000 bytes a second, five times the minimum, over four windows of the bound.
    sock = connect(port)
    try:
        sock.sendall(headers_of(port, body))
        answer, took, _ = send_paced(sock, body, chunk=100, every_s=0.1, limit_s=60)
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert took > 3 * BODY_TIMEOUT_S

    normal = service.clients["mk"].post("/validate", content=body)
    assert normal.status_code == 200, normal.text
