"""What keeps a page of another site away from the service.

A page in the user's browser can send requests to the local service (DNS rebinding makes its
own host name resolve to 127.0.0.1, so the browser lets it read the answers) and can frame the
web app. The service answers only requests whose `Host` is a name it is served under (the
setting `hosts`; the loopback names by default), refuses others with 421, and forbids framing on
every answer (`X-Frame-Options: DENY`, a Content-Security-Policy of `frame-ancestors 'none'`).
A path holding a NUL byte names no file nor run: it is refused (400) before any route sees it.

The web app keeps the token in the page's local storage, so a script injected into it would
hold the token: its answers (`/ui/...`) carry `WEB_APP_POLICY`, under which the page runs only
the app's own script and style sheet (no inline script, no `eval`, no other origin) and talks
only to its own origin. Every other answer carries `API_POLICY` (it loads nothing), and every
answer `X-Content-Type-Options: nosniff`, so that no answer is taken for a type it does not
declare (a JSON or log text read as HTML or as a script).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

import msgspec
from litestar.enums import ScopeType
from litestar.types import ASGIApp, HTTPResponseStartEvent, Message, Receive, Scope, Send

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
"""The names a service on this machine is reached by, and the default of the setting `hosts`."""
ANY_HOST = "*"
"""An entry of `hosts` that takes every name (behind a proxy that checks them itself)."""

WEB_APP = "/ui"
"""The path of the web app's files (`simrun_api.app`)."""
WEB_APP_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",  # the built app: one module script, no inline one
        "style-src 'self'",  # one style sheet; the app's :style bindings are CSSOM, allowed
        "img-src 'self' data:",  # the icon of index.html is a data: URL
        "font-src 'self'",
        "connect-src 'self'",  # fetch of the API and of its event streams, same origin
        "manifest-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",  # the login form is handled by the app, never submitted
        "frame-ancestors 'none'",
    ]
)
"""The Content-Security-Policy of the web app's pages: only what the built app (simrun_api/ui,
built from web/ by vite) loads, from the origin it is served by."""
API_POLICY = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
"""The Content-Security-Policy of every other answer: a page of it loads nothing."""
NO_FRAMING = [
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", API_POLICY.encode()),
]
"""The headers of every answer but the web app's: no framing, no sniffing, nothing loaded."""
WEB_APP_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", WEB_APP_POLICY.encode()),
]
"""The headers of the web app's answers."""


def is_web_app(scope: Scope) -> bool:
    """Whether a request asks for the web app (`/ui`, `/ui/...`, below the root path)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path == WEB_APP or path.startswith(WEB_APP + "/")


def host_name(header: str) -> str:
    """The name of a `Host` header without its port, lower case; an IPv6 address keeps its
    brackets (`[::1]:8000` -> `[::1]`). A header of another shape (a port that is no number,
    something after the brackets) is answered whole, so it matches no name served."""
    header = header.strip().lower()
    if header.startswith("["):
        end = header.find("]")
        name, rest = (header[: end + 1], header[end + 1 :]) if end != -1 else (header, "")
    elif header.count(":") == 1:
        name, colon, port = header.partition(":")
        rest = colon + port
    else:
        name, rest = header, ""
    if rest and not (rest.startswith(":") and rest[1:].isascii() and rest[1:].isdigit()):
        return header
    return name


def host_problems(hosts: Iterable[str]) -> list[str]:
    """What is wrong with the entries of the setting `hosts`, each named by its index: a name
    is a host name or an IP address alone (the port is not checked), or `*`. An entry with a
    port or a scheme would match no request, and no entry at all refuses every request."""
    listed = list(hosts)
    if not listed:
        return [
            "hosts: no name, so every request would be refused (the loopback names "
            f"{', '.join(LOOPBACK_HOSTS)} by default, {ANY_HOST} for any)"
        ]
    problems = []
    for index, host in enumerate(listed):
        name = host.strip()
        bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
        if name == ANY_HOST or _is_ipv6(bare):
            continue
        if not name:
            problems.append(f"hosts[{index}]: an empty name")
        elif not _HOST_NAME.fullmatch(name):
            problems.append(
                f"hosts[{index}]: {name[:200]!r} is no host name: write the name alone, "
                "without a scheme, port or path (simrun.lab.example, 10.0.0.5, ::1)"
            )
    return problems


_HOST_NAME = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?")
"""A DNS name or an IPv4 address (a trailing dot allowed, as a Host header may have it)."""


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def normal_hosts(hosts: Iterable[str]) -> frozenset[str]:
    """The names of the setting `hosts` as `host_name` gives them (an IPv6 address in
    brackets and compressed as a browser sends it, with or without them in the setting)."""
    names = set()
    for host in hosts:
        host = host.strip().lower()
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if _is_ipv6(bare):
            host = f"[{ipaddress.IPv6Address(bare).compressed}]"
        names.add(host)
    return frozenset(names)


class BrowserDefence:
    """Refuses a request of a foreign `Host` with 421 and one whose path holds a NUL with 400,
    and adds the headers that keep a page of another site out (`NO_FRAMING`, the web app's
    `WEB_APP_HEADERS`) to every answer."""

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

        headers = WEB_APP_HEADERS if is_web_app(scope) else NO_FRAMING

        async def framed(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *headers]
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
