"""The response of a run's event stream on the service's own server: its messages sent as they
come, without a second task per stream waiting for the client to go away.

litestar's `ServerSentEvent` sends a stream from a task group of two tasks, one of them waiting
for the client's disconnect, and its message iterator holds an exception with the frames of
its traceback for as long as the stream lasts: with 2,000 subscribers those were a third of
what they held. On the service's server (`simrun_api.server`) a stream learns that its client
went away from its connection (`ConnectionControl.closing`) after every wait (at most
`events_poll_s`) and every write, and a stream in its run's broadcast from the broadcast, so
no task needs to wait for it. Elsewhere (another ASGI server) the route answers litestar's
`ServerSentEvent`. The headers are those of `ServerSentEvent`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar.response import ServerSentEventMessage, Stream
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Scope, Send


class EventStream(Stream):
    """Server-sent events from an iterator of messages, sent by the request's own task."""

    def __init__(self, messages: AsyncIterator[ServerSentEventMessage]) -> None:
        super().__init__((), media_type="text/event-stream")  # the body is `messages`
        self.headers.setdefault("Cache-Control", "no-cache")
        self.headers["Connection"] = "keep-alive"
        self.headers["X-Accel-Buffering"] = "no"
        self.messages = messages

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> ASGIResponse:
        """The response as litestar makes a stream's (its status and headers), its body sent
        by `_Sending`."""
        return _Sending(super().to_asgi_response(*args, **kwargs), self.messages)


class _Sending(ASGIResponse):
    """Starts the response as `response` does, then sends each message as it comes."""

    def __init__(
        self, response: ASGIResponse, messages: AsyncIterator[ServerSentEventMessage]
    ) -> None:
        self.response = response
        self.messages = messages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.response.start_response(send=send)
        try:
            async for message in self.messages:
                body = message.encode()
                del message  # neither is held while the next message is awaited (a follower
                await send({"type": "http.response.body", "body": body, "more_body": True})
                del body  # waits there for as long as the run goes on, with its last write)
        finally:
            aclose = getattr(self.messages, "aclose", None)
            if aclose is not None:
                await aclose()  # at once, also when cancelled
        await send({"type": "http.response.body", "body": b"", "more_body": False})
