"""The ASGI middlewares of the service: bearer tokens, and the count of open requests."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult
from litestar.types import ASGIApp, Receive, Scope, Send

from simrun_api.auth import authenticate

if TYPE_CHECKING:
    from simrun_api.service import Service

OPEN_PATHS = ["^/local/instance$", "^/ui"]


class TokenAuthentication(AbstractAuthenticationMiddleware):
    """Every route but the web app's files and `/local/instance` needs a known bearer token."""

    async def authenticate_request(self, connection: ASGIConnection) -> AuthenticationResult:
        header = connection.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise NotAuthorizedException("a bearer token is required (Authorization: Bearer ...)")
        service: Service = connection.app.state.service
        identity = authenticate(service.tokens, token.strip())
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
