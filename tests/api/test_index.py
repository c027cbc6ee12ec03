"""The index of the runs: newest first by their creation, not by the random part of their ids."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from simrun_api.index import RunIndex
from simrun_core.states import RunState
from simrun_core.wire import RunItem

T0 = datetime(2026, 12, 1, 16, 49, 15, tzinfo=UTC)


def item(run_id: str, created: datetime, group: str | None = None) -> RunItem:
    return RunItem(
        id=run_id,
        state=RunState.SUCCEEDED,
        workflow="squares",
        group=group,
        submitted_by="mk",
        owner="mk",
        agent=None,
        priority="owner",
        tasks={},
        created=created,
        finished=None,
        message=None,
        seq=1,
    )


def listed(path: Path, items: list[RunItem], **filters: str) -> list[str]:
    async def run() -> list[str]:
        index = RunIndex(path)
        await index.open()
        try:
            await index.rebuild(items)
            return [found.id for found in await index.list(**filters)]
        finally:
            await index.close()

    return asyncio.run(run())


def test_runs_of_one_second_are_listed_newest_first_by_their_creation(tmp_path: Path) -> None:
    # Runs created within one second (the second of their ids), their random suffixes in the
    # other order, two of them at the same microsecond; and one of the second before.
    first = item("20261201-164915-ffffff", T0 + timedelta(microseconds=100), group="study")
    second = item("20261201-164915-aaaaaa", T0 + timedelta(microseconds=200))
    third = item("20261201-164915-000000", T0 + timedelta(microseconds=300), group="study")
    earlier = item("20261201-164914-ffffff", T0 - timedelta(seconds=1))
    tie = item("20261201-164915-bbbbbb", T0 + timedelta(microseconds=200))
    order = listed(tmp_path / "index.sqlite", [earlier, first, third, second, tie])
    assert order == [third.id, tie.id, second.id, first.id, earlier.id]
    in_group = listed(tmp_path / "group.sqlite", [first, third, second], group="study")
    assert in_group == [third.id, first.id]


def test_a_list_while_runs_are_put_and_rebuilt_has_each_run_once(tmp_path: Path) -> None:
    """Reads and writes share one connection: a list must not interleave with a write (a
    replaced row seen again by an open scan, a rebuild seen half done)."""
    items = [item(f"20261201-1649{n:02d}-abcdef", T0 + timedelta(seconds=n)) for n in range(60)]
    ids = sorted(found.id for found in items)

    async def run() -> list[list[str]]:
        index = RunIndex(tmp_path / "index.sqlite")
        await index.open()
        stop = asyncio.Event()

        async def write() -> None:
            while not stop.is_set():
                for found in items:
                    await index.put(found)
                await index.rebuild(items)

        try:
            await index.rebuild(items)
            writer = asyncio.create_task(write())
            lists = [[found.id for found in await index.list()] for _ in range(200)]
            stop.set()
            await writer
            return lists
        finally:
            await index.close()

    for found in asyncio.run(run()):
        assert sorted(found) == ids
