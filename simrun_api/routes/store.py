"""The routes of the store: remove a run, clean up old runs, measure the store, compare runs.

Removing runs removes the snapshots no remaining run refers to, as `simrun_api.snapshots`
says: of the removed run for `DELETE /runs/{run}`, of the whole store for `POST /cleanup`;
never one written within the last hour (`GRACE_S`), which a client may be about to submit.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

from litestar import Request, delete, get, post
from litestar.datastructures import State
from litestar.exceptions import NotFoundException, PermissionDeniedException
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, JSONBody

from simrun_api.compare import MAX_CELLS, TableTooLarge, compare_runs
from simrun_api.routes.common import (
    Conflict,
    Unprocessable,
    item_of,
    may_act,
    record_of,
    refusals,
    service_of,
)
from simrun_api.service import Service
from simrun_api.supervisor import RunLive, UnknownRun
from simrun_api.usage import freed_bytes, store_usage
from simrun_core.states import RunState
from simrun_core.store import RunPaths
from simrun_core.store_layout import run_path
from simrun_core.wire import (
    CleanupRequest,
    CleanupResult,
    CompareRequest,
    CompareTable,
    ErrorDetail,
    Identity,
    Usage,
)


async def _remove(service: Service, run_ids: list[str]) -> CleanupResult:
    """Remove ended runs, then every snapshot no remaining run refers to; the runs removed
    meanwhile (or live again) are left out."""
    removed: list[str] = []
    directories: list[Path] = []
    for run_id in run_ids:
        try:
            directories.append(await service.supervisor.detach(run_id))
        except (UnknownRun, RunLive):
            continue
        removed.append(run_id)
    freed = await asyncio.to_thread(freed_bytes, directories)
    await service.supervisor.purge(directories)
    snapshots, snapshot_bytes = await service.supervisor.snapshots.remove_unreferred()
    return CleanupResult(
        runs=[f"runs/{run_id}" for run_id in removed],
        snapshots=snapshots,
        bytes_freed=freed + snapshot_bytes,
        dry_run=False,
    )


@delete(
    "/runs/{run:str}",
    status_code=200,
    summary="Remove an ended run",
    responses=refusals(403, 404, 409),
)
async def delete_run(request: Request[Identity, str, State], run: FromPath[str]) -> CleanupResult:
    """Remove an ended run: its directory and its row of the index, and the snapshots it
    referred to that no remaining run refers to (`snapshots`; one written within the last
    hour is kept: a client may be about to submit a run of it). Allowed as a cancel is: a
    person their runs and their agents', an agent its own, the owner of the service all.
    A run whose log cannot be read is judged as the list shows it (failed, unless the part
    that can be read ended), so it can be removed."""
    service = service_of(request.app.state)
    item = item_of(service, run)
    identity: Identity = request.user
    if not may_act(service, identity, item):
        raise PermissionDeniedException(f"{identity.name} may not remove run {run!r}")
    if not item.state.ended:
        raise Conflict(f"run {run!r} is {item.state}: cancel it first, then remove it")
    keeper = service.supervisor.snapshots
    referred = await keeper.of_runs([run])
    try:
        directory = await service.supervisor.detach(run)
    except UnknownRun:
        raise NotFoundException(f"run {run!r} does not exist") from None
    except RunLive:
        raise Conflict(f"run {run!r} has not stopped yet; try again") from None
    freed = await asyncio.to_thread(freed_bytes, [directory])
    await service.supervisor.purge([directory])
    snapshots, snapshot_bytes = await keeper.remove_unreferred(referred) if referred else ([], 0)
    return CleanupResult(
        runs=[f"runs/{run}"],
        snapshots=snapshots,
        bytes_freed=freed + snapshot_bytes,
        dry_run=False,
    )


@post(
    "/cleanup",
    status_code=200,
    summary="Remove old ended runs",
    responses=refusals(),
)
async def cleanup(
    request: Request[Identity, str, State], data: JSONBody[CleanupRequest]
) -> CleanupResult:
    """Remove the runs which ended at least `older_than_days` ago, of `group`, only failed
    ones with `failed_only`, then every snapshot of the store no remaining run refers to
    (but one written within the last hour); `dry_run` lists them and removes nothing. Only
    the runs the identity may remove are touched (see `DELETE /runs/{run}`)."""
    service = service_of(request.app.state)
    identity: Identity = request.user
    try:
        cutoff = datetime.now(UTC) - timedelta(days=data.older_than_days)
    except (OverflowError, ValueError):
        cutoff = None  # before the first date there is: no run ended that long ago
    state = RunState.FAILED.value if data.failed_only else None
    chosen = sorted(
        item.id
        for item in await service.index.list(group=data.group, state=state)
        if item.state.ended
        and item.finished is not None
        and cutoff is not None
        and item.finished <= cutoff
        and may_act(service, identity, item)
    )
    if not data.dry_run:
        return await _remove(service, chosen)
    directories = [RunPaths(service.settings.store, run_id).dir for run_id in chosen]
    freed = await asyncio.to_thread(freed_bytes, directories)
    snapshots, snapshot_bytes = await service.supervisor.snapshots.unreferred(excluding=chosen)
    return CleanupResult(
        runs=[run_path(run_id) for run_id in chosen],
        snapshots=snapshots,
        bytes_freed=freed + snapshot_bytes,
        dry_run=True,
    )


@get("/usage", summary="The bytes of the store per run and group", responses=refusals())
async def usage(state: State) -> Usage:
    """The bytes of every run and of every group (`""` for the runs without one); a hard
    linked file counts once in a run and once in a group."""
    service = service_of(state)
    runs = [
        (item.id, item.group, RunPaths(service.settings.store, item.id).dir)
        for item in await service.index.list()
    ]
    return await asyncio.to_thread(store_usage, runs)


@post(
    "/compare",
    status_code=200,
    summary="Compare runs side by side",
    responses={
        **refusals(404),
        422: ResponseSpec(
            ErrorDetail,
            description=f"The table would have more than {MAX_CELLS} cells (runs times "
            "columns): the detail names both numbers",
            generate_examples=False,
        ),
    },
)
async def compare(state: State, data: JSONBody[CompareRequest]) -> CompareTable:
    """The provenance and the summaries of the tasks of runs side by side, a row per run in
    the order asked: `run`, `group`, `agent`, `state`, per source `<source>.changed_files` (the
    paths of the changed files) and `<source>.diff_sha256`, then every key of the
    `out/summary.json` of every task as `<task>.<key>`; None where a run has no value. A run
    asked again is read once; 422 for a table of more than a million cells."""
    service = service_of(state)

    def rows() -> CompareTable:
        # In a thread, each run read once: a body may name one run a hundred thousand times.
        records = {run: record_of(service, run) for run in dict.fromkeys(data.runs)}
        store = service.settings.store
        return compare_runs([(records[run], RunPaths(store, run)) for run in data.runs])

    try:
        return await asyncio.to_thread(rows)
    except TableTooLarge as error:
        raise Unprocessable(str(error)) from None
