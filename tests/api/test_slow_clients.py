"""Clients that hold connections without finishing a request: the headers of a request have a
deadline, an idle connection closes, and beyond the cap of connections a request is answered
503 at once, so the service keeps answering everyone else."""

from __future__ import annotations

import time

import pytest
from live_service import wait_until
from service_helpers import start_configured_service, stop_configured_service
from sse_sockets import closed_within, connect, request

HEADER_TIMEOUT_S = 1.0
KEEP_ALIVE_S = 0.5


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("slow")
    started = start_configured_service(
        root, header_timeout_s=HEADER_TIMEOUT_S, keep_alive_s=KEEP_ALIVE_S, max_connections=6
    )
    yield started
    stop_configured_service(started)


def port_of(service) -> int:
    return int(service.url.rsplit(":", 1)[1])


def test_half_a_request_is_closed_after_the_deadline_while_others_get_answers(service):
    port = port_of(service)
    half = request(port, "/me", "t-mk")[:-10]
    trickling = connect(port)
    trickling.sendall(half[:20])
    opened = time.monotonic()
    sent = 20
    answered = 0
    # Bytes that keep coming do not move the deadline.
    while time.monotonic() - opened < HEADER_TIMEOUT_S * 0.9 and sent < len(half):
        trickling.sendall(half[sent : sent + 1])
        sent += 1
        assert service.clients["ann"].get("/me").status_code == 200
        answered += 1
    assert answered
    waited = closed_within(trickling, 20.0)
    trickling.close()
    assert waited is not None, "a request whose headers never ended kept its connection"
    assert time.monotonic() - opened < HEADER_TIMEOUT_S + 10


def test_a_connection_that_sends_nothing_or_idles_after_an_answer_is_closed(service):
    port = port_of(service)
    silent = connect(port)
    assert closed_within(silent, 20.0) is not None, "a connection that sent nothing stays"
    silent.close()

    idle = connect(port)
    idle.sendall(request(port, "/me", "t-mk"))
    idle.settimeout(20)
    assert idle.recv(65536).startswith(b"HTTP/1.1 200")
    assert closed_within(idle, 20.0) is not None, "an idle keep-alive connection stays"
    idle.close()


def test_beyond_the_cap_of_connections_a_request_is_answered_503_at_once(service):
    port = port_of(service)
    held = [connect(port) for _ in range(6)]
    try:
        for sock in held:
            sock.sendall(b"GET /me HTTP/1.1\r\n")  # headers that never end
        refused = service.clients["mk"].get("/me")
        assert refused.status_code == 503
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: service.clients["mk"].get("/me").status_code == 200, what="GET /me")
