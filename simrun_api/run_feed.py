"""The feed of a live run: what its readers (its event streams, the long poll of its end) get
of it, and all they get.

The run's actor publishes each append of its log to the feed (`published`), or says that the
log has lines it did not write (`reread`). A reader never reaches the actor: it asks the
supervisor for the feed of a run (`Supervisor.feed`, None once no actor follows the run),
waits on it for the next append (`version`, `wait`), takes the lines it kept (`since`) or
follows it where its appends are sent (`broadcast`), and reads the log itself otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simrun_api.appended import AppendedLines, Piece
from simrun_api.changes import ChangeSignal
from simrun_core.events import Event

if TYPE_CHECKING:
    from simrun_api.broadcast import Broadcast


class RunFeed:
    """The appends of a live run's log as its actor publishes them."""

    def __init__(self) -> None:
        self._changed = ChangeSignal()
        self._appended = AppendedLines()

    # -- the actor's side ----------------------------------------------------------------------

    def published(self, start: int, lines: list[bytes], events: list[Event]) -> None:
        """The actor appended `lines` (the events `events`) at byte `start` of the log."""
        self._appended.add(start, lines, events)
        self._changed.notify()

    def reread(self) -> None:
        """The actor appended, and the log has lines it did not write: readers read the log."""
        self._appended.clear()
        self._changed.notify()

    # -- the readers' side ---------------------------------------------------------------------

    @property
    def version(self) -> int:
        """How many appends were published: pass it to `wait` as `since` after an `await`."""
        return self._changed.version

    async def wait(self, timeout: float | None = None, since: int | None = None) -> bool:
        """Wait for the next append (at once if one came after `since`); False when the
        timeout passed first."""
        return await self._changed.wait(timeout, since)

    def since(self, offset: int) -> list[Piece] | None:
        """The lines kept after byte `offset` of the log (`AppendedLines.since`): None when
        they are not all kept (read the log)."""
        return self._appended.since(offset)

    @property
    def broadcast(self) -> Broadcast:
        """Where the run's appends are sent to the streams that follow it."""
        return self._appended.broadcast
