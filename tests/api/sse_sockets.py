"""Clients of the service on raw sockets, for what an HTTP library hides: a client that reads
nothing, half a request, the moment the service closes a connection."""

from __future__ import annotations

import re
import socket
import time

MESSAGE = re.compile(rb"id: (\d+)\r\nevent: ([\w-]+)\r\ndata: [^\r\n]*\r\n\r\n")


def connect(port: int, receive_buffer: int | None = None) -> socket.socket:
    """A connection to the service; with `receive_buffer`, that small a receive buffer (set
    before connecting, so the window the service may fill is that small too)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", port))
    return sock


def request(port: int, path: str, token: str, *extra: str) -> bytes:
    """A GET request of `path` with the token and `extra` header lines."""
    lines = [f"GET {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Authorization: Bearer {token}"]
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode()


def open_stream(
    port: int,
    path: str,
    token: str,
    last_event_id: int | None = None,
    receive_buffer: int | None = None,
) -> socket.socket:
    """A connection that asked for an event stream (and has read nothing of the answer)."""
    sock = connect(port, receive_buffer)
    extra = [f"Last-Event-ID: {last_event_id}"] if last_event_id is not None else []
    sock.sendall(request(port, path, token, "Accept: text/event-stream", *extra))
    return sock


def read_to_end(sock: socket.socket, timeout: float = 60.0) -> tuple[bytes, str]:
    """Everything the service sends until it closes the connection: the bytes and how it
    ended (`eof`, `reset`); fails after `timeout` seconds without the end."""
    sock.settimeout(timeout)
    data = bytearray()
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return bytes(data), "reset"
        except TimeoutError:
            raise AssertionError(
                f"the service did not close the connection within {timeout} s"
            ) from None
        if not chunk:
            return bytes(data), "eof"
        data += chunk


def messages(data: bytes) -> list[tuple[int, str]]:
    """The whole server-sent messages in a response: (id, event)."""
    return [(int(found[1]), found[2].decode()) for found in MESSAGE.finditer(data)]


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the service closed the connection (reading and dropping what it sends),
    None when it is still open after `seconds`."""
    started = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - started
