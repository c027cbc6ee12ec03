"""One watch of the Workflows of every run: the list-then-watch loop of an informer, in one task.

The loop lists the Workflows labelled `simrun/run` (and hands the whole list over, so the
backend can diff every run it knows), then watches from the list's resourceVersion with
bookmarks allowed. A watch that ends (the server's timeout, a clean cut) or drops (an abrupt
cut: aiohttp raises mid-body) is resumed from the last resourceVersion seen, an event's or a
bookmark's, so nothing written meanwhile is lost or delivered twice. A 410 Gone (the version
was compacted away) lists again. Only when watches fail repeatedly does the loop fall back to a
list every `poll_s` until a watch works again.

kubernetes-asyncio's `Watch` is used with `timeout_seconds` set, so it neither reconnects nor
retries a 410 by itself: the loop owns the resourceVersion and every reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S: Final = 300
"""The server ends a watch after this long; it is resumed at once."""
READ_MARGIN_S: Final = 60
"""A watch that sent nothing (not even a bookmark) this long after its timeout is dead."""
FAILURES_BEFORE_POLL: Final = 3
"""Consecutive failed watches after which every retry is preceded by a list (the poll)."""
BACKOFF_S: Final = 0.1
"""The first wait after a failed watch; doubled per failure up to `poll_s`."""
GONE: Final = 410

ListCall = Callable[..., Awaitable[Any]]
EventHandler = Callable[[str, dict[str, Any]], Awaitable[None]]
ListHandler = Callable[[list[dict[str, Any]]], Awaitable[None]]


class WorkflowWatch:
    """Follows the objects `list_call` lists (one kind, one selector) in one asyncio task.

    `on_event(type, object)` gets every ADDED, MODIFIED and DELETED in order; `on_list(items)`
    every full list (the first, after a 410, and each poll). Counters (`lists`, `watches`,
    `gone`, `failures`) are for tests and logs.
    """

    def __init__(
        self,
        list_call: ListCall,
        on_event: EventHandler,
        on_list: ListHandler,
        *,
        poll_s: float = 5.0,
        timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        self.list_call = list_call
        self.on_event = on_event
        self.on_list = on_list
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.resource_version: str | None = None
        self.synced = asyncio.Event()
        """Set once the first list was handed over."""
        self.lists = 0
        self.watches = 0
        self.gone = 0
        self.failures = 0
        """Consecutive watches that failed."""
        self._task: asyncio.Task[None] | None = None
        self._fresh = False
        """Whether nothing arrived since the last list."""

    @property
    def running(self) -> bool:
        """Whether the task follows the objects."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the task (once; again after it stopped)."""
        if not self.running:
            self._task = asyncio.get_running_loop().create_task(
                self._follow(), name="simrun argo watch"
            )

    async def stop(self) -> None:
        """Stop the task and wait for its end."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def relist(self) -> None:
        """List every object, hand the list over, and watch from its resourceVersion."""
        listing = await self.list_call(_request_timeout=self.timeout_s)
        items = list(listing.get("items") or [])
        await self.on_list(items)
        self.lists += 1
        self._fresh = True
        self.resource_version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
        self.resource_version = self.resource_version or None
        self.synced.set()

    async def _follow(self) -> None:
        while True:
            try:
                if self.resource_version is None:
                    await self.relist()
                await self._watch_once()
                self.failures = 0  # the server ended it: resume at once
                continue
            except asyncio.CancelledError:
                raise
            except ApiException as error:
                if error.status == GONE:
                    log.info("the watch of the workflows is too old (410): listing again")
                    self.gone += 1
                    self.resource_version = None
                    if not self._fresh:
                        continue
                    # too old right after a list: no reason to list again at once
                log.warning("the watch of the workflows failed: %s %s", error.status, error.reason)
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                log.info("the watch of the workflows was cut: %r", error)
            except Exception:
                log.exception("the watch of the workflows failed")
            self.failures += 1
            await self._pause()

    async def _pause(self) -> None:
        """Wait after a failed watch; past `FAILURES_BEFORE_POLL` failures, poll (list)."""
        if self.failures < FAILURES_BEFORE_POLL:
            await asyncio.sleep(min(BACKOFF_S * 2 ** (self.failures - 1), self.poll_s))
            return
        await asyncio.sleep(self.poll_s)
        try:
            await self.relist()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("the poll of the workflows failed: %r", error)

    async def _watch_once(self) -> bool:
        """One watch from `resource_version` until the server ends it; whether it delivered
        anything. A failure keeps the last resourceVersion seen (so a resume loses nothing)."""
        stream = watch.Watch()
        self.watches += 1
        delivered = False
        timeout = aiohttp.ClientTimeout(sock_connect=30, sock_read=self.timeout_s + READ_MARGIN_S)
        try:
            async for event in stream.stream(
                self.list_call,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.timeout_s,
                _request_timeout=timeout,
            ):
                delivered = True
                self._fresh = False
                if self.failures:
                    self.failures = 0
                kind = str(event.get("type") or "")
                obj = event.get("raw_object")
                if not isinstance(obj, dict):
                    continue
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if kind != "BOOKMARK":
                    await self._hand_over(kind, obj)
                if version:
                    self.resource_version = str(version)
        finally:
            await stream.close()
        return delivered

    async def _hand_over(self, kind: str, obj: dict[str, Any]) -> None:
        """Give an event to `on_event`; an error of the handler is logged, not retried (a
        resume would deliver the same event again and fail again)."""
        try:
            await self.on_event(kind, obj)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("a %s event of the workflows was not handled", kind)
