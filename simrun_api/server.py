"""The HTTP server of the service: uvicorn with limits on what clients may hold.

uvicorn has no deadline on receiving a request: its keep-alive timer is cancelled by the first
byte of the next request and not set again, and a new connection has no timer at all, so
connections that never finish their headers (a "slowloris") stay open for ever and, past the
process' open-file limit, keep every other client out. `LimitedH11Protocol` adds the deadline
to uvicorn's h11 protocol: the headers of a request must arrive whole within
`header_timeout_s` of the connection's start or of the previous response's end; an idle
keep-alive connection closes after `keep_alive_s` (uvicorn's own timer); beyond
`max_connections` a request is answered 503 at once (uvicorn's `limit_concurrency`).

A request's scope carries the connection's `ConnectionControl` (extension `simrun.connection`):
an event stream bounds the bytes its client has not taken, and cuts a client too far behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from simrun_api.settings import ServiceSettings

CONNECTION_EXTENSION = "simrun.connection"
"""The key of a request's `ConnectionControl` in `scope["extensions"]`."""
RESERVED_FILES = 256
"""Open files kept for the service's own use (logs, the index, runs) beside its connections."""

logger = logging.getLogger("simrun.server")


class ConnectionControl:
    """What a route may do to its request's connection beyond ASGI: bound what its client has
    not taken, write its body past the server (a run's broadcast, `simrun_api.broadcast`), and
    close it."""

    def __init__(self, transport: asyncio.Transport, protocol: H11Protocol) -> None:
        self.transport = transport
        self.protocol = protocol

    def bound_buffers(self, limit: int) -> None:
        """Hold about `limit` bytes the client has not taken, half in the kernel's send
        buffer and half in the transport's (a write waits while it holds more): a stream's
        client that reads nothing costs that much, and one that holds it is behind."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limit // 2)
        self.transport.set_write_buffer_limits(high=limit // 2)

    def unsent(self) -> int:
        """The bytes written that wait in the transport for the client (beyond what the
        kernel's send buffer holds)."""
        return self.transport.get_write_buffer_size()

    def cut(self) -> None:
        """Cut the connection at once: what its client has not taken yet is dropped (what
        reached it is kept: it reads that, then the reset)."""
        self.transport.abort()

    def closing(self) -> bool:
        """Whether the connection is closed or closing (its client went away, or it was cut)."""
        return self.transport.is_closing()

    def chunked(self) -> bool:
        """Whether the body of a response without a length goes out as HTTP/1.1 chunks: h11
        frames it so for a client of HTTP/1.1 (to one of HTTP/1.0 it sends it up to the close)."""
        version = self.protocol.conn.their_http_version
        return version is not None and version >= b"1.1"

    def write(self, data: bytes) -> bool:
        """Write bytes of the response's body as they go on the wire (framed as `chunked` says),
        between the server's own writes of its start and its end; False when the connection
        is closing (nothing written)."""
        if self.transport.is_closing():
            return False
        self.transport.write(data)
        return True


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for a request's headers (`header_timeout_s`):
    a timer starts when the connection opens and when a response ends, is not moved by bytes
    that arrive, stops when a request's headers are complete, and closes the connection when
    it fires. Every request's scope gets the connection's `ConnectionControl`."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the deadline of the first request's headers."""
        self._header_timer: asyncio.TimerHandle | None = None
        self._control = ConnectionControl(transport, self)
        self._scoped: object = None
        super().connection_made(transport)
        self._follow_request()

    def data_received(self, data: bytes) -> None:
        """Take the bytes; stop the deadline when they completed a request's headers."""
        super().data_received(data)
        self._follow_request()

    def on_response_complete(self) -> None:
        """Start the deadline of the next request's headers (unless it came already)."""
        super().on_response_complete()
        self._follow_request()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the deadline."""
        self._stop_timer()
        super().connection_lost(exc)

    def _follow_request(self) -> None:
        if self.transport.is_closing():
            self._stop_timer()
            return
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)
            return
        self._stop_timer()
        if self.scope is not self._scoped:  # a new request: its task has not started yet
            self._scoped = self.scope
            scope: dict[str, Any] = self.scope  # type: ignore[assignment]
            scope.setdefault("extensions", {})[CONNECTION_EXTENSION] = self._control

    def _stop_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not (self.cycle is None or self.cycle.response_complete):
            return
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # it has not even taken the previous response
        else:
            self.transport.close()


def protocol_class(settings: ServiceSettings) -> type[LimitedH11Protocol]:
    """The protocol of the service's connections with the settings' header deadline."""
    return type(
        "ServiceH11Protocol", (LimitedH11Protocol,), {"header_timeout_s": settings.header_timeout_s}
    )


def raise_open_files_limit() -> int:
    """Raise the process' soft limit of open files to its hard limit (each connection is an
    open file); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1024 * 1024)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_limit(settings: ServiceSettings) -> int:
    """`max_connections`, lowered to what the open-file limit allows (after raising it):
    past that limit the process could not accept a connection to answer 503."""
    files = raise_open_files_limit()
    allowed = max(1, files - RESERVED_FILES)
    if settings.max_connections > allowed:
        logger.warning(
            "max_connections %d lowered to %d: the open-file limit of the process is %d",
            settings.max_connections,
            allowed,
            files,
        )
        return allowed
    return settings.max_connections


def server_config(app: Any, settings: ServiceSettings, **options: Any) -> uvicorn.Config:
    """The uvicorn configuration of the service's app with the limits of its settings;
    `options` are uvicorn's others (host, port, logging)."""
    return uvicorn.Config(
        app,
        http=protocol_class(settings),
        limit_concurrency=connection_limit(settings),
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[arg-type]
        timeout_graceful_shutdown=5,
        lifespan="on",
        **options,
    )
