"""The feed of a live run (`RunFeed`): what its readers get of its actor's appends, and the one
way the routes reach a live run (`Supervisor.feed`), never its actor."""

from __future__ import annotations

import ast
from pathlib import Path

import anyio

from simrun_api.run_feed import RunFeed
from simrun_core import events as ev
from simrun_core.states import TaskState

SIMRUN_API = Path(__file__).parents[2] / "simrun_api"
ROUTE_SIDE = [
    *sorted((SIMRUN_API / "routes").glob("*.py")),
    SIMRUN_API / "streams.py",
    SIMRUN_API / "service.py",
]
"""The modules of the routes and of what they call to serve a request."""
WHAT_ROUTES_ASK = {
    "cancel", "changed", "detach", "feed", "live_item", "live_runs", "load", "paths", "purge",
    "snapshots", "submit", "summary", "writable",
}  # fmt: skip
"""The supervisor's operations for the routes: none hands out an actor or a part of one."""


def lines_of(*events: ev.Event) -> list[bytes]:
    return [ev.encode_event(event) + b"\n" for event in events]


def test_a_reader_waits_for_an_append_and_takes_its_lines() -> None:
    async def main() -> None:
        feed = RunFeed()
        version = feed.version
        assert not await feed.wait(0.01, since=version), "nothing was published"
        assert feed.since(0) is None, "nothing kept: the reader reads the log"
        started = ev.TaskStateChanged(seq=1, task="t", state=TaskState.RUNNING)
        lines = lines_of(started)
        feed.published(0, lines, [started])
        assert await feed.wait(0, since=version), "an append after the version read"
        [piece] = feed.since(0) or []
        assert piece.lines == lines and piece.seqs == [1]
        assert feed.since(len(lines[0])) == [], "at the end of what was published"
        version = feed.version
        feed.reread()
        assert await feed.wait(0, since=version)
        assert feed.since(0) is None, "the log has lines the actor did not write: read it"

    anyio.run(main)


def supervisor_operations(path: Path) -> set[str]:
    """The attributes a module takes of anything named `supervisor`."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name == "supervisor":
                used.add(node.attr)
    return used


def test_the_routes_reach_a_live_run_through_its_feed_never_its_actor() -> None:
    for path in ROUTE_SIDE:
        assert supervisor_operations(path) <= WHAT_ROUTES_ASK, path
        text = path.read_text()
        assert "RunActor" not in text and ".actors" not in text, path
    used = set().union(*map(supervisor_operations, ROUTE_SIDE))
    assert {"feed", "cancel", "submit"} <= used, "the scan sees the routes' calls"
