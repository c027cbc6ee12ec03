"""What keeps a page of another site away from the service.

A page in the user's browser can send requests to the local service (DNS rebinding makes its
own host name resolve to 127.0.0.1, so the browser lets it read the answers) and can frame the
web app. The service answers only requests whose `Host` is a name it is served under (the
setting `hosts`; the loopback names by default), refuses others with 421, and forbids framing on
every answer (`X-Frame-Options: DENY`, a Content-Security-Policy of `frame-ancestors 'none'`).
A path holding a NUL byte names no file nor run: it is refused (400) before any route sees it.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from litestar.enums import ScopeType
from litestar.types import ASGIApp, HTTPResponseStartEvent, Message, Receive, Scope, Send

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""The names a service on this machine is reached by, and the default of the setting `hosts`."""
ANY_HOST = "*"
"""An entry of `hosts` that takes every name (behind a proxy that checks them itself)."""

NO_FRAMING = [
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
]


def host_name(header: str) -> str:
    """The name of a `Host` header without its port, lower case; an IPv6 address keeps its
    brackets (`[::1]:8000` -> `[::1]`)."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        return header[: end + 1] if end != -1 else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def normal_hosts(hosts: Iterable[str]) -> frozenset[str]:
    """The names of the setting `hosts` as `host_name` gives them (an IPv6 address in
    brackets, with or without them in the setting)."""
    names = set()
    for host in hosts:
        host = host.strip().lower()
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        names.add(host)
    return frozenset(names)


class BrowserDefence:
    """Refuses a request of a foreign `Host` with 421 and one whose path holds a NUL with 400,
    and forbids framing on every answer."""

    def __init__(self, app: ASGIApp, hosts: Iterable[str] = LOOPBACK_HOSTS) -> None:
        self.app = app
        self.hosts = normal_hosts(hosts)

    def admits(self, scope: Scope) -> str | None:
        """None when the request's `Host` is served here, else the name that is not. A request
        without `Host` (HTTP/1.0, no browser sends one) is admitted."""
        if ANY_HOST in self.hosts:
            return None
        for key, value in scope.get("headers", ()):
            if key == b"host":
                name = host_name(value.decode("latin-1"))
                return None if name in self.hosts else name
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        foreign = self.admits(scope)
        if foreign is not None:
            detail = f"this service is not served under the host name {foreign[:200]!r}"
            await _refuse(send, 421, detail + " (the setting hosts)")
            return
        if "\x00" in scope["path"]:
            await _refuse(send, 400, "the path holds a NUL byte")
            return

        async def framed(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *NO_FRAMING]
            await send(message)

        await self.app(scope, receive, framed)


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = msgspec.json.encode({"status_code": status, "detail": detail})
    start: HTTPResponseStartEvent = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            *NO_FRAMING,
        ],
    }
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})
