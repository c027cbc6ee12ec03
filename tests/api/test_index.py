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
