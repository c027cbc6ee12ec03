"""The routes that follow runs while they run: the event streams, the servers, the workers, the
logs and the outputs of a task."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

from litestar import MediaType, Request, get
from litestar.datastructures import State
from litestar.exceptions import ClientException, NotFoundException
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, FromQuery, HeaderParameter, QueryParameter
from litestar.response import File, ServerSentEvent

from simrun_api import logs, streams
from simrun_api.routes.common import paths_of, refusals, service_of, task_of
from simrun_api.workers import claims_by_worker, worker_views
from simrun_core.states import RunState
from simrun_core.store import iter_log
from simrun_core.wire import Identity, OutputFile, ServerUsage, WorkerView


def _event_stream(description: str) -> ResponseSpec:
    return ResponseSpec(
        str, description=description, media_type="text/event-stream", generate_examples=False
    )


@get(
    "/runs/{run:str}/events",
    summary="Follow the events of a run (SSE)",
    responses={
        200: _event_stream(
            "Server-sent events: per event of the run a message named by its `type`, its data "
            "the event as the log holds it (see `/runs/{run}/history`), its `id` its `seq`"
        ),
        **refusals(404),
    },
)
async def run_events(
    request: Request[Identity, str, State],
    run: FromPath[str],
    last_event_id: Annotated[int | None, HeaderParameter(name="Last-Event-ID", ge=0)] = None,
) -> ServerSentEvent:
    """Server-sent events: every event of the run, `id` its `seq`, from after `Last-Event-ID`.

    The stream ends after the run's last event, or after `events_max_s` (reconnect then).
    """
    service = service_of(request.app.state)
    paths = paths_of(service, run)
    return ServerSentEvent(streams.run_events(service, paths, last_event_id or 0))


@get(
    "/events",
    summary="Follow the runs and the servers (SSE)",
    responses={
        200: _event_stream(
            "Server-sent events: `runs`, the list of `RunItem` (as `GET /runs` with the same "
            "filters), and `servers`, the list of `ServerUsage` (as `GET /servers`); each on "
            "connect and whenever it changed"
        ),
        **refusals(),
    },
)
async def service_events(
    state: State,
    group: FromQuery[str | None] = None,
    owner: FromQuery[str | None] = None,
    agent: FromQuery[str | None] = None,
    run_state: Annotated[RunState | None, QueryParameter(name="state")] = None,
) -> ServerSentEvent:
    """Server-sent events `runs` and `servers`, each when it changed; filtered as `GET /runs`.

    The stream ends after `events_max_s` (reconnect then).
    """
    service = service_of(state)
    return ServerSentEvent(streams.service_events(service, group, owner, agent, run_state))


@get("/servers", summary="The servers and the pods of runs on them", responses=refusals())
async def servers(state: State) -> list[ServerUsage]:
    """The servers with the cores and memory the pods of runs may have, their reservation and
    the pods of runs on them with their requests; locally this machine and its processes."""
    return service_of(state).backend.servers()


@get(
    "/runs/{run:str}/tasks/{task:str}/workers",
    summary="The workers of a task",
    responses=refusals(404),
)
async def task_workers(state: State, run: FromPath[str], task: FromPath[str]) -> list[WorkerView]:
    """The workers of a task: server, state, attempts, processes, memory and units; the units
    claimed of the live workers from the ledger of the task."""
    service = service_of(state)
    record, paths = task_of(service, run, task)

    def read() -> list[WorkerView]:
        claims = {} if record.ended else claims_by_worker(paths.ledger(task))
        return worker_views((event for _, event in iter_log(paths.events)), task, claims)

    try:
        return await asyncio.to_thread(read)
    except FileNotFoundError:
        raise NotFoundException(f"run {run!r} does not exist") from None


@get(
    "/runs/{run:str}/logs/{task:str}",
    summary="The logs of a task",
    media_type=MediaType.TEXT,
    responses=refusals(404),
)
async def task_logs(
    state: State,
    run: FromPath[str],
    task: FromPath[str],
    tail_lines: Annotated[int, QueryParameter(ge=0)] = 300,
) -> str:
    """The logs of the processes of a task, oldest first, the last `tail_lines` (0 all) of each:
    the kept logs once the task is final (`logs-kept`), else those of its live processes."""
    service = service_of(state)
    record, paths = task_of(service, run, task)
    directory = paths.logs(task)
    pods = logs.kept_pods(directory) if task in record.logs_kept else None
    if pods is None:
        pods = logs.live_pods(directory)
    return await asyncio.to_thread(logs.render, directory, pods, tail_lines)


@get(
    "/runs/{run:str}/outputs/{task:str}",
    summary="The output files of a task",
    responses=refusals(404),
)
async def task_outputs(state: State, run: FromPath[str], task: FromPath[str]) -> list[OutputFile]:
    """The files below the task's `out/`, paths relative to it."""
    service = service_of(state)
    _, paths = task_of(service, run, task)
    out = paths.out(task)
    files = []
    for root, _, names in os.walk(out):
        for name in names:
            path = Path(root) / name
            if name.startswith(".") or path.is_symlink():
                continue
            files.append(OutputFile(path=str(path.relative_to(out)), bytes=path.stat().st_size))
    return sorted(files, key=lambda file: file.path)


@get(
    "/runs/{run:str}/outputs/{task:str}/{path:path}",
    summary="One output file of a task",
    responses={
        200: ResponseSpec(
            bytes,
            description="The content of the file",
            media_type="application/octet-stream",
            generate_examples=False,
        ),
        **refusals(404),
    },
)
async def task_output_file(
    state: State, run: FromPath[str], task: FromPath[str], path: FromPath[str]
) -> File:
    """The content of one output file; paths out of the task's `out/` are refused."""
    service = service_of(state)
    _, paths = task_of(service, run, task)
    out = paths.out(task).resolve()
    relative = path.lstrip("/")
    if "\0" in relative or ".." in Path(relative).parts:
        raise ClientException(f"output path {path!r} is not inside the outputs of {task!r}")
    target = (out / relative).resolve()
    if not target.is_relative_to(out) or not target.is_file():
        raise NotFoundException(f"task {task!r} of run {run!r} has no output {relative!r}")
    return File(target, filename=target.name)
