"""The ASGI middlewares of the service: bearer tokens, the count of open requests, and the end
of a connection whose request body was refused unread; the request class that refuses a JSON
body nested too deeply to decode."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.exceptions import ClientException, NotAuthorizedException
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from simrun_api.auth import authenticate

if TYPE_CHECKING:
    from simrun_api.service import Service

OPEN_PATHS = ["^/local/instance$", "^/ui(/|$)"]


class TokenAuthentication(AbstractAuthenticationMiddleware):
    """Every route but the web app's files and `/local/instance` needs a known bearer token."""

    async def authenticate_request(self, connection: ASGIConnection) -> AuthenticationResult:
        header = connection.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise NotAuthorizedException("a bearer token is required (Authorization: Bearer ...)")
        service: Service = connection.app.state.service
        identity = authenticate(service.tokens.current(), token.strip())
        if identity is None:
            raise NotAuthorizedException("the token is not known to this service")
        return AuthenticationResult(user=identity, auth=token)


class ActivityMiddleware:
    """Counts the open requests and the time of the last one, for the idle exit."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        service: Service = scope["app"].state.service
        service.open_requests += 1
        try:
            await self.app(scope, receive, send)
        finally:
            service.open_requests -= 1
            service.last_request = time.monotonic()


CLOSE = (b"connection", b"close")
BODY_READ = "simrun_body_read"


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


class BodyReadMiddleware:
    """Marks the scope once the request body is read to its end (see `close_unread_body`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return

        async def receiving() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                scope[BODY_READ] = True  # type: ignore[literal-required]
            return message

        await self.app(scope, receiving, send)  # type: ignore[arg-type]


async def close_unread_body(message: Message, scope: Scope) -> None:
    """A `before_send` hook: a response that starts before the request body was read to its
    end (a 401, a 413, a 404 of a body nobody reads) ends the connection. Otherwise the server
    would go on receiving and discarding the rest of the body, however long, to keep it open.

    A hook of the app, not a middleware: the refusals of the middlewares (the 401) are sent by
    the app's outermost exception handler, past every middleware's `send`.
    """
    if message["type"] != "http.response.start" or scope.get(BODY_READ):
        return
    if scope["type"] == "http" and _has_body(scope):
        headers = list(message.get("headers", []))
        if CLOSE not in headers:
            message["headers"] = [*headers, CLOSE]  # type: ignore[typeddict-unknown-key]


class BodyRequest(Request):
    """A request whose JSON body, nested deeper than the decoder recurses, is refused with a
    400 (msgspec raises RecursionError, which litestar would answer with a 500)."""

    async def json(self) -> Any:
        try:
            return await super().json()
        except RecursionError:
            raise ClientException("the JSON body is nested too deeply") from None
