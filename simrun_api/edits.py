"""The edit sessions of the service: the meeting point of `simrun edit` and the browser.

A session is `edits/<id>/session.json` of the store (rewritten atomically), so a restarted
service keeps it: the file it edits, its machine, who opened it, what was last read from disk,
the snapshots and trees of its sources. What lives only in memory is what a restart may lose:
the requests of the browser not yet answered (a browser waiting for one gets its connection
dropped and asks again) and when the command last asked (a session loaded from disk is not
connected until its command asks again, which it does within its backoff).

The command long-polls `requests` for the saves and runs of the browser and answers each with
`answer`; `ask` (the browser) queues a request and waits for its answer up to `ASK_WAIT_S`,
failing at once when the command closes the session and once it is no longer connected (it
has not asked within `CONNECTED_S`). Only the identity that opened a session reads or uses it.

Sessions are bounded (`SessionLimits`): a session's record is at most `max_bytes` (a larger
opening or state is refused, the session keeps what it had); an identity has at most
`per_identity` sessions (opening one more removes its oldest one whose command is gone: closed,
or not connected, with no request waiting; refused when all are connected); and a session
closed, or not seen, for `max_age_s` is removed (at the next opening or listing).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import secrets
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path, PurePath

import msgspec

from simrun_core.edits import (
    ASK_WAIT_S,
    CONNECTED_S,
    DiskState,
    EditAsk,
    EditRequest,
    EditResult,
    EditSession,
    EditSessionSummary,
    EditState,
    OpenEdit,
    TreeState,
)
from simrun_core.provenance import SourceProvenance
from simrun_core.store import write_atomic
from simrun_core.wire import Identity

SESSION_ID = re.compile(r"[0-9a-f]{16}")
SEEN_WRITE_S = 60.0
"""How often the time a session was last seen is written to its file at most (it is shown for
sessions not seen for a day), besides every change of what is on disk."""
CHECK_S = 1.0
"""How often a waiting `ask` checks that the command is still there."""


class SessionRecord(msgspec.Struct, kw_only=True):
    """A session as `edits/<id>/session.json` holds it."""

    id: str
    path: str
    machine: str
    opened_by: str
    disk: DiskState
    sources: list[SourceProvenance]
    trees: list[TreeState]
    group: str | None
    created: datetime
    seen: datetime
    closed: datetime | None = None
    opener: Identity | None = None
    """The identity that opened the session; `opened_by` is its name."""

    def opened_by_identity(self) -> Identity:
        """Who opened the session: `opener`, or the person `opened_by` in a session written
        before `opener` was."""
        return self.opener or Identity.person(self.opened_by)


class UnknownSession(LookupError):
    """No session of this id."""


class NotYours(PermissionError):
    """The session was opened by another identity."""


class SessionUnavailable(RuntimeError):
    """A request that the state of the session refuses (closed, not connected, no answer)."""


class SessionTooLarge(ValueError):
    """A session's record would pass `SessionLimits.max_bytes`; the message names the limit."""


class TooManySessions(RuntimeError):
    """An identity has `SessionLimits.per_identity` sessions, all connected."""


@dataclasses.dataclass(frozen=True)
class SessionLimits:
    """The bounds of the edit sessions (the settings `max_edit_session_bytes`,
    `max_edit_sessions_per_identity`, `edit_session_max_age_s`)."""

    max_bytes: int = 1024**2
    per_identity: int = 20
    max_age_s: float = 7 * 24 * 3600.0


@dataclasses.dataclass
class _Pending:
    request: EditRequest
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    result: EditResult | None = None
    failure: str | None = None


@dataclasses.dataclass
class _Live:
    record: SessionRecord
    pending: dict[str, _Pending] = dataclasses.field(default_factory=dict)
    asked: float | None = None
    polls: int = 0
    written_seen: float = 0.0
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


def _now() -> datetime:
    return datetime.now(UTC)


class EditSessions:
    """The edit sessions of a store (see the module)."""

    def __init__(
        self,
        store: Path,
        connected_s: float = CONNECTED_S,
        ask_wait_s: float = ASK_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        limits: SessionLimits = SessionLimits(),
    ) -> None:
        self.root = store / "edits"
        self.limits = limits
        self.connected_s = connected_s
        self.ask_wait_s = ask_wait_s
        self._clock = clock
        self._live: dict[str, _Live] = {}
        self._opening = asyncio.Lock()
        """Held from an opening's count of its identity's sessions until the new one is
        among them, so that openings at once do not pass the limit together."""

    # reading

    def _load(self, session_id: str) -> _Live:
        live = self._live.get(session_id)
        if live is not None:
            return live
        if not SESSION_ID.fullmatch(session_id):
            raise UnknownSession(session_id)
        try:
            data = (self.root / session_id / "session.json").read_bytes()
            record = msgspec.json.decode(data, type=SessionRecord)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            raise UnknownSession(session_id) from None
        live = _Live(record)
        self._live[session_id] = live
        return live

    def _mine(self, session_id: str, identity: Identity) -> _Live:
        live = self._load(session_id)
        if live.record.opened_by_identity() != identity:
            raise NotYours(f"edit session {session_id!r} was opened by {live.record.opened_by}")
        return live

    def connected(self, live: _Live) -> bool:
        """Whether the command of a session is there: it asked within `connected_s` (or a
        long poll of it is open), and it did not close the session."""
        if live.record.closed is not None:
            return False
        if live.polls:
            return True
        return live.asked is not None and self._clock() - live.asked < self.connected_s

    def view(self, live: _Live) -> EditSession:
        record = live.record
        path = PurePath(record.path)
        return EditSession(
            id=record.id,
            path=record.path,
            file=path.name,
            directory=str(path.parent),
            machine=record.machine,
            opened_by=record.opened_by,
            disk=record.disk,
            sources=record.sources,
            trees=record.trees,
            group=record.group,
            created=record.created,
            seen=record.seen,
            closed=record.closed,
            connected=self.connected(live),
        )

    def get(self, session_id: str, identity: Identity) -> EditSession:
        """A session of `identity`; UnknownSession, NotYours."""
        return self.view(self._mine(session_id, identity))

    def _load_all(self) -> None:
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if entry.name not in self._live and SESSION_ID.fullmatch(entry.name):
                    with contextlib.suppress(UnknownSession):
                        self._load(entry.name)

    def _of(self, identity: Identity) -> list[_Live]:
        """The sessions `identity` opened (loaded from the store too), the last seen first."""
        self._load_all()
        mine = [
            live for live in self._live.values() if live.record.opened_by_identity() == identity
        ]
        mine.sort(key=lambda live: live.record.seen, reverse=True)
        return mine

    def sessions(self, identity: Identity) -> list[EditSession]:
        """The sessions `identity` opened, the last seen first."""
        return [self.view(live) for live in self._of(identity)]

    async def summaries(self, identity: Identity) -> list[EditSessionSummary]:
        """The sessions `identity` opened, the last seen first, without what they hold (the
        list of `GET /edits`); the sessions past their age are removed first."""
        await self.remove_old()
        return [self.summary(live) for live in await asyncio.to_thread(self._of, identity)]

    def summary(self, live: _Live) -> EditSessionSummary:
        view = self.view(live)
        workflow = view.disk.workflow
        return EditSessionSummary(
            id=view.id,
            path=view.path,
            file=view.file,
            directory=view.directory,
            machine=view.machine,
            opened_by=view.opened_by,
            workflow=workflow.name if workflow is not None else None,
            created=view.created,
            seen=view.seen,
            closed=view.closed,
            connected=view.connected,
        )

    # the bounds

    def _gone(self, live: _Live) -> bool:
        """Whether a session's command is gone (closed, or not connected) and no request of
        the browser waits for it: it may be removed."""
        return not self.connected(live) and not live.pending

    def _last(self, live: _Live) -> datetime:
        return live.record.closed or live.record.seen

    async def _remove(self, live: _Live) -> None:
        self._live.pop(live.record.id, None)
        await asyncio.to_thread(shutil.rmtree, self.root / live.record.id, True)

    async def remove_old(self) -> int:
        """Remove the sessions whose command is gone and that were closed, or last seen, more
        than `max_age_s` ago; how many."""
        await asyncio.to_thread(self._load_all)
        oldest = _now().timestamp() - self.limits.max_age_s
        old = [
            live
            for live in list(self._live.values())
            if self._gone(live) and self._last(live).timestamp() < oldest
        ]
        for live in old:
            await self._remove(live)
        return len(old)

    async def _make_room(self, identity: Identity) -> None:
        """Remove the oldest sessions of `identity` whose command is gone until it may open
        one more; TooManySessions when all of them are connected."""
        await self.remove_old()
        mine = await asyncio.to_thread(self._of, identity)
        gone = sorted((live for live in mine if self._gone(live)), key=self._last)
        excess = len(mine) - self.limits.per_identity + 1
        if excess > len(gone):
            raise TooManySessions(
                f"{identity.name} has {len(mine)} edit sessions connected, the most an identity "
                f"may have (max_edit_sessions_per_identity: {self.limits.per_identity}): stop "
                "a simrun edit of them first"
            )
        for live in gone[: max(0, excess)]:
            await self._remove(live)

    def _encoded(self, record: SessionRecord) -> bytes:
        """The record as its file holds it; SessionTooLarge past `max_bytes`."""
        data = msgspec.json.encode(record)
        if len(data) > self.limits.max_bytes:
            raise SessionTooLarge(
                f"the edit session would hold {len(data)} bytes (the workflow, the trees and "
                f"the snapshots of its sources): at most {self.limits.max_bytes} "
                "(max_edit_session_bytes)"
            )
        return data

    # the command

    async def _write(self, live: _Live) -> None:
        live.written_seen = self._clock()
        data = self._encoded(live.record)
        path = self.root / live.record.id / "session.json"
        await asyncio.to_thread(_write_record, path, data)

    def _touch(self, live: _Live) -> bool:
        """The command asked now; whether the time it was seen is due to be written."""
        live.asked = self._clock()
        live.record.seen = _now()
        return self._clock() - live.written_seen >= SEEN_WRITE_S

    async def open(self, identity: Identity, body: OpenEdit) -> EditSession:
        """Open a session for the command of `identity`; SessionTooLarge for one whose record
        passes `max_bytes`, TooManySessions (see `_make_room`)."""
        session_id = secrets.token_hex(8)
        now = _now()
        record = SessionRecord(
            id=session_id,
            path=body.path,
            machine=body.machine,
            opened_by=identity.name,
            opener=identity,
            disk=body.disk,
            sources=body.sources,
            trees=body.trees,
            group=body.group,
            created=now,
            seen=now,
        )
        self._encoded(record)
        live = _Live(record)
        async with self._opening:
            await self._make_room(identity)
            live.asked = self._clock()
            await self._write(live)
            self._live[session_id] = live
        return self.view(live)

    def _open_one(self, session_id: str, identity: Identity) -> _Live:
        live = self._mine(session_id, identity)
        if live.record.closed is not None:
            raise SessionUnavailable(
                f"edit session {session_id!r} is closed: its simrun edit stopped"
            )
        return live

    async def state(self, session_id: str, identity: Identity, body: EditState) -> EditSession:
        """What the command read from disk; a sign of life as well."""
        live = self._open_one(session_id, identity)
        sources = live.record.sources if body.sources is None else body.sources
        self._encoded(
            msgspec.structs.replace(live.record, disk=body.disk, trees=body.trees, sources=sources)
        )
        due = self._touch(live)
        record = live.record
        changed = body.disk != record.disk or body.trees != record.trees
        if body.sources is not None and body.sources != record.sources:
            record.sources = body.sources
            changed = True
        record.disk = body.disk
        record.trees = body.trees
        if changed or due:
            await self._write(live)
        return self.view(live)

    async def requests(
        self, session_id: str, identity: Identity, timeout: float
    ) -> list[EditRequest]:
        """The requests of the browser not yet answered, once there is one or after `timeout`
        seconds (a long poll of the command)."""
        live = self._open_one(session_id, identity)
        live.polls += 1
        due = self._touch(live)
        try:
            deadline = self._clock() + timeout
            while not self._unanswered(live) and live.record.closed is None:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    break
                live.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(live.wake.wait(), remaining)
            return self._unanswered(live)
        finally:
            # Not a sign of life: the command may have gone while it waited (the service does
            # not learn of a dropped connection), so it counts from the start of the poll.
            live.polls -= 1
            if due:
                with contextlib.suppress(OSError):
                    await self._write(live)

    @staticmethod
    def _unanswered(live: _Live) -> list[EditRequest]:
        return [
            pending.request
            for pending in live.pending.values()
            if pending.result is None and pending.failure is None
        ]

    async def answer(
        self, session_id: str, identity: Identity, request_id: str, result: EditResult
    ) -> EditSession:
        """The command's answer to a request; an answer sent again, or to a request the browser
        gave up on, changes nothing."""
        live = self._mine(session_id, identity)
        self._touch(live)
        pending = live.pending.get(request_id)
        if pending is not None and pending.result is None and pending.failure is None:
            pending.result = result
            pending.done.set()
        if result.disk is not None and result.outcome == "saved" and live.record.closed is None:
            saved = msgspec.structs.replace(live.record, disk=result.disk)
            with contextlib.suppress(SessionTooLarge):  # the file was saved; the session keeps
                self._encoded(saved)  # what it had (its next state is refused as well)
                live.record.disk = result.disk
                await self._write(live)
        return self.view(live)

    async def close(self, session_id: str, identity: Identity) -> EditSession:
        """The command stopped: the session is closed and the requests waiting fail at once."""
        live = self._mine(session_id, identity)
        if live.record.closed is None:
            live.record.closed = _now()
            live.record.seen = live.record.closed
            await self._write(live)
        for pending in live.pending.values():
            if pending.result is None and pending.failure is None:
                pending.failure = "simrun edit stopped before it answered"
                pending.done.set()
        live.wake.set()
        return self.view(live)

    # the browser

    async def ask(self, session_id: str, identity: Identity, body: EditAsk) -> EditResult:
        """Pass a save or a run to the command and wait for its answer, up to `ask_wait_s`.

        SessionUnavailable when the session is closed or not connected, when the command
        stops or goes away meanwhile, or when it does not answer in time.
        """
        live = self._open_one(session_id, identity)
        if not self.connected(live):
            raise SessionUnavailable(self._away(live))
        request = EditRequest(
            id=secrets.token_hex(8),
            kind=body.kind,
            workflow=body.workflow,
            base=body.base,
            force=body.force,
            group=body.group,
            asked_by=identity.name,
            asked=_now(),
        )
        pending = _Pending(request)
        live.pending[request.id] = pending
        live.wake.set()
        deadline = self._clock() + self.ask_wait_s
        try:
            while True:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise SessionUnavailable(
                        f"simrun edit on {live.record.machine} did not answer the {body.kind} "
                        f"within {self.ask_wait_s:g} s"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(pending.done.wait(), min(CHECK_S, remaining))
                if pending.result is not None:
                    return pending.result
                if pending.failure is not None:
                    raise SessionUnavailable(pending.failure)
                if not self.connected(live):
                    raise SessionUnavailable(self._away(live))
        finally:
            live.pending.pop(request.id, None)

    def _away(self, live: _Live) -> str:
        if live.record.closed is not None:
            return "simrun edit stopped: this session is closed"
        return (
            f"the machine of this session ({live.record.machine}) is not connected: simrun edit "
            f"has not asked the service for {self.connected_s:g} s"
        )


def _write_record(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data, mode=0o600)
