"""simrun_api.resources: the observations of workers in SQLite, idempotent per report."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from simrun_api.resources import ResourceStore
from simrun_core import events as ev
from simrun_core.resources import (
    GIB,
    WINDOW,
    Observation,
    ResolvedResources,
    ResourceKey,
    observation_from_report,
    resolve,
    resource_key,
)
from simrun_core.task_types.demo import SQUARES, SquaresSettings
from simrun_core.workflow import TaskSpec

T0 = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
KEY = resource_key(SQUARES, {"n": 100}, "model")
OTHER = resource_key(SQUARES, {"n": 100}, "other-model")
TASK = TaskSpec(id="fit", type="demo.squares")


def observation(
    seconds: float,
    per_worker_gb: float = 1.0,
    *,
    key: ResourceKey = KEY,
    run: str | None = None,
    worker: str = "fit-w0",
    attempt: int = 0,
    oom: bool = False,
    succeeded: bool | None = None,
) -> Observation:
    return Observation(
        key=key.text(),
        run=run if run is not None else f"run-{seconds:g}",
        task="fit",
        worker=worker,
        attempt=attempt,
        per_worker_gb=per_worker_gb,
        seconds_per_unit=0.5,
        oom=oom,
        succeeded=(not oom) if succeeded is None else succeeded,
        time=T0 + timedelta(seconds=seconds),
    )


async def recorded(path: Path, *observations: Observation) -> list[bool]:
    async with ResourceStore(path) as store:
        return [await store.record(value) for value in observations]


async def read(path: Path, key: ResourceKey = KEY, limit: int = WINDOW) -> list[Observation]:
    async with ResourceStore(path) as store:
        return await store.observations(key, limit)


def test_observations_come_back_in_time_order(tmp_path: Path) -> None:
    db = tmp_path / "state" / "resources.db"
    values = [observation(3), observation(1, 2.5), observation(2, 0.0)]
    assert asyncio.run(recorded(db, *values)) == [True, True, True]
    assert asyncio.run(read(db)) == [values[1], values[2], values[0]]
    assert asyncio.run(read(db, OTHER)) == []


def test_recording_a_report_again_counts_it_once(tmp_path: Path) -> None:
    db = tmp_path / "resources.db"
    first = observation(1)
    assert asyncio.run(recorded(db, first, first)) == [True, False]
    # after a restart the service records the reports of the logs again
    again = observation(1, 9.0)
    assert asyncio.run(recorded(db, again)) == [False]
    assert asyncio.run(read(db)) == [first]
    other_attempt = observation(2, worker="fit-w0", attempt=1, run="run-1")
    other_worker = observation(2, worker="fit-w1", run="run-1")
    assert asyncio.run(recorded(db, other_attempt, other_worker)) == [True, True]

    async def count() -> int:
        async with ResourceStore(db) as store:
            return await store.count(KEY)

    assert asyncio.run(count()) == 3


def test_the_newest_observations_of_the_window(tmp_path: Path) -> None:
    db = tmp_path / "resources.db"
    values = [observation(i) for i in range(WINDOW + 5)]
    asyncio.run(recorded(db, *reversed(values)))
    assert asyncio.run(read(db)) == values[5:]
    assert asyncio.run(read(db, limit=3)) == values[-3:]


def test_kills_come_back_until_a_success_follows(tmp_path: Path) -> None:
    db = tmp_path / "resources.db"
    old_kill = observation(1, 3.0, oom=True)
    success = observation(2, 1.0)
    kill = observation(3, 4.0, oom=True)
    failure = observation(4, 1.0, succeeded=False)
    asyncio.run(recorded(db, old_kill, success, kill, failure))
    assert asyncio.run(read(db)) == [success, kill, failure]
    later = observation(5, 1.0)
    asyncio.run(recorded(db, later))
    assert asyncio.run(read(db)) == [success, failure, later]
    # a kill at the time of the last success stays, as `resolve` keeps its floor
    at_success = observation(5, 5.0, oom=True, worker="fit-w1")
    asyncio.run(recorded(db, at_success))
    assert asyncio.run(read(db)) == [success, failure, later, at_success]


def test_kills_do_not_push_measurements_out_of_the_window(tmp_path: Path) -> None:
    db = tmp_path / "resources.db"
    measured = [observation(i) for i in range(WINDOW)]
    kills = [observation(100 + i, 2.0, oom=True) for i in range(WINDOW + 3)]
    asyncio.run(recorded(db, *measured, *kills))
    assert asyncio.run(read(db)) == measured + kills[3:]


def test_equal_times_keep_the_recording_order(tmp_path: Path) -> None:
    db = tmp_path / "resources.db"
    values = [observation(1, worker=f"fit-w{i}", run="r") for i in (2, 0, 1)]
    asyncio.run(recorded(db, *values))
    assert asyncio.run(read(db)) == values


def test_the_table_has_an_index_of_keys(tmp_path: Path) -> None:
    db = tmp_path / "resources.db"
    asyncio.run(recorded(db))
    with sqlite3.connect(db) as connection:
        rows = connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'observations'"
        ).fetchall()
    assert ("observations_of_key",) in rows


def test_a_closed_store_refuses(tmp_path: Path) -> None:
    store = ResourceStore(tmp_path / "resources.db")
    with pytest.raises(AssertionError, match="not open"):
        asyncio.run(store.record(observation(1)))


def test_the_store_resolves_from_recorded_reports(tmp_path: Path) -> None:
    db = tmp_path / "resources.db"
    settings = SquaresSettings(n=100)

    def report(worker: str, peak_gib: float) -> ev.WorkerReport:
        return ev.WorkerReport(
            time=T0,
            task="fit",
            worker=worker,
            processes=2,
            units_done=10,
            unit_seconds=30.0,
            peak_memory_bytes=int(peak_gib * GIB),
            per_worker_gb=0.25,
        )

    async def scenario() -> tuple[ResolvedResources, ResolvedResources]:
        async with ResourceStore(db) as store:
            for worker, peak in (("fit-w0", 2.5), ("fit-w1", 4.5)):
                value = observation_from_report(KEY, report(worker, peak), base_gb=0.5, run="r1")
                await store.record(value)
            before = await store.resolve(TASK, SQUARES, settings, "model")
            killed = observation_from_report(
                KEY, report("fit-w2", 1.0), base_gb=0.5, oom=True, run="r2"
            )
            await store.record(killed)
            after = await store.resolve(TASK, SQUARES, settings, "model")
            assert after == resolve(TASK, SQUARES, settings, await store.observations(KEY))
            return before, after

    before, after = asyncio.run(scenario())
    # (4.5 - 0.5) / 2 = 2 GiB a process, times 1.1, and 30 s / 10 units
    assert (before.memory_per_worker_gb, before.seconds_per_unit) == (2.2, 3.0)
    assert (before.samples, before.source) == (2, "learned from 1 run")
    # the kill at 0.25 GiB a process raises no floor above it
    assert after == before
    unknown = asyncio.run(_resolve_other(db, settings))
    assert (unknown.memory_per_worker_gb, unknown.source) == (0.25, "plugin hint")


async def _resolve_other(db: Path, settings: SquaresSettings) -> ResolvedResources:
    async with ResourceStore(db) as store:
        return await store.resolve(TASK, SQUARES, settings, "other-model")
