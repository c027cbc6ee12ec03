"""A client that goes away in the middle of a run's event stream leaves no warning behind."""

from __future__ import annotations

import socket
import struct


def reset_in_the_middle(port: int, token: str, run_id: str) -> None:
    """Ask for a run's whole event stream, read its first bytes, then reset the connection
    (SO_LINGER 0) while the service still writes the backlog."""
    with socket.create_connection(("127.0.0.1", port)) as client:
        request = (
            f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\n\r\n"
        )
        client.sendall(request.encode())
        assert client.recv(1000).startswith(b"HTTP/1.1 200")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_a_follower_gone_mid_backlog_leaves_no_socket_warnings(local_service):
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": 3000}}
    run = local_service.submit({"name": "many", "tasks": [task]})
    assert local_service.wait(run["id"], timeout=120)["state"] == "succeeded"
    info = local_service.info
    for _ in range(6):
        reset_in_the_middle(info["port"], info["token"], run["id"])
    assert local_service.client.get("/me").status_code == 200  # the service answers after
    log = (local_service.root / "service-test.log").read_text()
    assert "socket.send() raised exception" not in log
