"""The clock the writers of logs read: the time they stamp on an event when they append it.

Only the shells read it (the run's actor, the harness's own log, the CLI's export); nothing a
decision is made with imports it, so `decide` is a function of the run's state and one message.
"""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> datetime:
    """The current time in UTC, as events record it."""
    return datetime.now(UTC)
