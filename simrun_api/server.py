"""The HTTP server of the service: uvicorn with limits on what clients may hold.

uvicorn has no deadline on receiving a request: its keep-alive timer is cancelled by the first
byte of the next request and not set again, and a new connection has no timer at all, so
connections that never finish their headers (a "slowloris") stay open for ever and, past the
process' open-file limit, keep every other client out. `LimitedH11Protocol` adds the deadline
to uvicorn's h11 protocol: the headers of a request must arrive whole within
`header_timeout_s` of the connection's start or of the previous response's end; an idle
keep-alive connection closes after `keep_alive_s` (uvicorn's own timer); beyond
`max_connections` a request is answered 503 at once (uvicorn's `limit_concurrency`).

A request's body has no deadline in uvicorn either: a client may send it a byte at a time and
hold its connection and its request's task for ever. The body must keep coming at a minimum
rate: in each `body_timeout_s` that the service waits for it, at least `body_min_rate` bytes a
second of it arrive, else the request is answered 408 and its connection closed. The rate is
checked window by window (no credit from a fast start) and only over time the service is
waiting: while it has paused reading (the app has not taken what came) or the client waits
for a `100 Continue`, the clock of the window stands still. A whole-body deadline would need
the body's size (a chunked body has none) and would refuse a large upload on a slow but steady
link; a rate does neither (the idea of Apache's `RequestReadTimeout body=20,MinRate=500`).

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

import h11
import msgspec
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol

from simrun_api.settings import ServiceSettings

CONNECTION_EXTENSION = "simrun.connection"
"""The key of a request's `ConnectionControl` in `scope["extensions"]`."""
RESERVED_FILES = 256
"""Open files kept for the service's own use (logs, the index, runs) beside its connections."""
LINGER_S = 2.0
"""Seconds a connection answered 408 goes on reading (and dropping) what its client still
sends before it closes: closed at once, a socket with unread bytes is reset, and the reset
may destroy the answer before the client has read it."""

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


class TimedFlowControl(FlowControl):
    """uvicorn's flow control that also counts how long reading was paused (the service, not
    the client, held the body back meanwhile)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(transport)
        self._loop = loop
        self._paused_s = 0.0
        self._paused_at: float | None = None

    def pause_reading(self) -> None:
        if not self.read_paused:
            self._paused_at = self._loop.time()
        super().pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and self._paused_at is not None:
            self._paused_s += self._loop.time() - self._paused_at
            self._paused_at = None
        super().resume_reading()

    def paused_s(self) -> float:
        """Seconds reading has been paused since the connection opened, up to now."""
        ongoing = self._loop.time() - self._paused_at if self._paused_at is not None else 0.0
        return self._paused_s + ongoing


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for a request's headers (`header_timeout_s`):
    a timer starts when the connection opens and when a response ends, is not moved by bytes
    that arrive, stops when a request's headers are complete, and closes the connection when
    it fires. A request's body must then arrive at `body_min_rate` bytes a second, checked
    over each `body_timeout_s` the service waits for it (else 408). Every request's scope gets
    the connection's `ConnectionControl`."""

    header_timeout_s = 10.0
    body_timeout_s = 20.0
    body_min_rate = 500

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the deadline of the first request's headers."""
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_bytes = 0
        self._window = (0.0, 0.0, 0)
        self._lingering = False
        self._control = ConnectionControl(transport, self)
        self._scoped: object = None
        super().connection_made(transport)
        self.flow = TimedFlowControl(transport, self.loop)
        self._follow_request()

    def data_received(self, data: bytes) -> None:
        """Take the bytes (counting those of a body awaited); stop the deadline when they
        completed a request's headers. A connection answered 408 drops them."""
        if self._lingering:
            return
        if self._body_timer is not None:
            self._body_bytes += len(data)
        super().data_received(data)
        self._follow_request()

    def on_response_complete(self) -> None:
        """Start the deadline of the next request's headers (unless it came already)."""
        super().on_response_complete()
        self._follow_request()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the deadlines."""
        self._stop_timer()
        self._stop_body_timer()
        super().connection_lost(exc)

    def _follow_request(self) -> None:
        if self.transport.is_closing():
            self._stop_timer()
            self._stop_body_timer()
            return
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting:
            self._stop_body_timer()
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)
            return
        self._stop_timer()
        if self.scope is not self._scoped:  # a new request: its task has not started yet
            self._scoped = self.scope
            scope: dict[str, Any] = self.scope  # type: ignore[assignment]
            scope.setdefault("extensions", {})[CONNECTION_EXTENSION] = self._control
            self._stop_body_timer()
            if self._awaiting_body():
                self._body_bytes = 0
                self._start_body_window()

    def _stop_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _awaiting_body(self) -> bool:
        """Whether the service waits for the rest of the current request's body."""
        cycle = self.cycle
        return (
            cycle is not None
            and cycle.more_body
            and not cycle.response_complete
            and not cycle.disconnected
            and not self.transport.is_closing()
        )

    def _start_body_window(self) -> None:
        self._window = (self.loop.time(), self._timed_flow().paused_s(), self._body_bytes)
        self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_window_end)

    def _timed_flow(self) -> TimedFlowControl:
        assert isinstance(self.flow, TimedFlowControl)
        return self.flow

    def _body_window_end(self) -> None:
        """At the end of a window: the body came at the rate (a next window), or the window
        had pauses not of the client (it goes on for their length), or the body is late."""
        self._body_timer = None
        if not self._awaiting_body():
            return
        started, paused_before, bytes_before = self._window
        waited = self.loop.time() - started - (self._timed_flow().paused_s() - paused_before)
        if self.cycle.waiting_for_100_continue:
            self._start_body_window()  # the client waits for the app's first read
        elif waited < self.body_timeout_s:
            self._body_timer = self.loop.call_later(
                self.body_timeout_s - waited, self._body_window_end
            )
        elif self._body_bytes - bytes_before >= self.body_min_rate * self.body_timeout_s:
            self._start_body_window()
        else:
            self._body_late()

    def _body_late(self) -> None:
        """Answer 408 (unless the app answered already), end the request for the app, and
        close the connection after a short linger."""
        cycle = self.cycle
        detail = (
            f"the request's body came too slowly: less than {self.body_min_rate} bytes a "
            f"second over {self.body_timeout_s:g} s (the settings body_min_rate and "
            "body_timeout_s)"
        )
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        logger.warning("%s: %s; answered 408 and closed", client, detail)
        if not cycle.response_started:
            cycle.response_started = True
            body = msgspec.json.encode({"status_code": 408, "detail": detail})
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                (b"x-content-type-options", b"nosniff"),
            ]
            response = h11.Response(status_code=408, headers=headers, reason=b"Request Timeout")
            with contextlib.suppress(h11.LocalProtocolError):
                for event in (response, h11.Data(data=body), h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event) or b"")
        cycle.disconnected = True
        cycle.message_event.set()
        if self.transport.can_write_eof():
            self._lingering = True
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not (self.cycle is None or self.cycle.response_complete):
            return
        if self.transport.get_write_buffer_size():
            self.transport.abort()  # it has not even taken the previous response
        else:
            self.transport.close()


def protocol_class(settings: ServiceSettings) -> type[LimitedH11Protocol]:
    """The protocol of the service's connections with the settings' deadlines."""
    limits = {
        "header_timeout_s": settings.header_timeout_s,
        "body_timeout_s": settings.body_timeout_s,
        "body_min_rate": settings.body_min_rate,
    }
    return type("ServiceH11Protocol", (LimitedH11Protocol,), limits)


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
