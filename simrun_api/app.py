"""The API of the service: people and agents submit, follow, inspect and replay runs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import msgspec
from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.datastructures import State
from litestar.exceptions import (
    ClientException,
    HTTPException,
    NotFoundException,
    PermissionDeniedException,
)
from litestar.middleware import DefineMiddleware
from litestar.params import FromPath, FromQuery, HeaderParameter, JSONBody, QueryParameter
from litestar.response import File, ServerSentEvent, ServerSentEventMessage
from litestar.status_codes import HTTP_201_CREATED, HTTP_409_CONFLICT

from simrun_api.actor import RunEnded
from simrun_api.auth import load_tokens, priority_of
from simrun_api.backends.base import Backend
from simrun_api.index import RunIndex
from simrun_api.middleware import OPEN_PATHS, ActivityMiddleware, TokenAuthentication
from simrun_api.resources import ResourceStore
from simrun_api.service import Service
from simrun_api.settings import ServiceSettings
from simrun_api.submission import (
    SubmissionRefused,
    checked_tasks,
    estimates,
    model_of,
    plan_tasks,
    resolve_all,
    submitted_event,
    workflow_errors,
)
from simrun_api.supervisor import Supervisor, UnknownRun
from simrun_core.errors import WorkflowError
from simrun_core.events import TERMINAL_EVENTS, UnknownEvent
from simrun_core.fold import FoldError, RunRecord
from simrun_core.planner import TaskPlan
from simrun_core.plugins import TaskType, load_task_types
from simrun_core.resources import ResolvedResources
from simrun_core.store import LogCorrupt, RunPaths, iter_lines, new_run_id
from simrun_core.views import progress_view, run_item
from simrun_core.wire import (
    Identity,
    InstanceAnswer,
    OutputFile,
    ProgressView,
    RunItem,
    SubmitRequest,
    TaskEstimate,
    ValidationResult,
)
from simrun_core.workflow import Priority, workflow_from_data

WAIT_DEFAULT_S = 60.0
WAIT_MAX_S = 300.0


class Unprocessable(ClientException):
    """A request that is well formed but cannot be carried out: 422."""

    status_code = 422


class Conflict(ClientException):
    """A request that conflicts with the state of the run: 409."""

    status_code = HTTP_409_CONFLICT


def _service(state: State) -> Service:
    return state.service


def _record(service: Service, run: str, at: int | None = None) -> RunRecord:
    try:
        return service.supervisor.load(run, at)
    except UnknownRun:
        raise NotFoundException(f"run {run!r} does not exist") from None
    except LogCorrupt as error:
        raise HTTPException(status_code=500, detail=f"run {run!r}: corrupt log: {error}") from None
    except FoldError as error:
        raise HTTPException(status_code=500, detail=f"run {run!r}: {error}") from None


def _task_dir(service: Service, run: str, task: str) -> tuple[RunRecord, RunPaths]:
    record = _record(service, run)
    if task not in record.tasks:
        raise NotFoundException(f"run {run!r} has no task {task!r}")
    return record, RunPaths(service.settings.store, run)


@get("/me", summary="The identity of the token")
async def me(request: Request[Identity, str, State]) -> Identity:
    """Who the token names: a person, or an agent with its owner."""
    return request.user


@get("/local/instance", summary="The instance of a local service", include_in_schema=True)
async def local_instance(state: State) -> InstanceAnswer:
    """The random instance of this start of a local service, answered without a token."""
    service = _service(state)
    if service.instance is None:
        raise NotFoundException("this service is not a local service")
    return InstanceAnswer(instance=service.instance)


class ValidateRequest(msgspec.Struct):
    """A workflow to check, as decoded from its YAML."""

    workflow: dict[str, Any]


@post("/validate", status_code=200, summary="Validate a workflow")
async def validate(state: State, data: JSONBody[ValidateRequest]) -> ValidationResult:
    """Check a workflow against the known task types without submitting it."""
    service = _service(state)
    try:
        workflow = workflow_from_data(data.workflow)
    except WorkflowError as error:
        return ValidationResult(ok=False, errors=[str(error)])
    errors = workflow_errors(workflow, service.types)
    return ValidationResult(ok=not errors, errors=errors)


@post("/runs", status_code=HTTP_201_CREATED, summary="Submit a workflow")
async def submit(
    request: Request[Identity, str, State], data: JSONBody[SubmitRequest]
) -> RunRecord:
    """Validate and plan a run, record it and return it in the state `submitting` at once."""
    service = _service(request.app.state)
    identity: Identity = request.user
    priority = priority_of(identity, service.settings.owner)
    run_id = new_run_id()
    plans, resources = await _plan(service, data, priority, run_id)
    submitted, settings = submitted_event(
        run_id, data, identity, priority, plans, resources, service.backend.name
    )
    return await service.supervisor.submit(submitted, settings)


async def _plan(
    service: Service, data: SubmitRequest, priority: Priority, run_id: str
) -> tuple[dict[str, TaskPlan], dict[str, ResolvedResources]]:
    backend = service.backend
    try:
        tasks = checked_tasks(data, service.types, backend.name, backend.name != "local")
        resources = await resolve_all(tasks, service.resources, model_of(data))
        plans = plan_tasks(
            run_id, data, tasks, resources, priority, backend.nodes(), backend.max_pods
        )
    except SubmissionRefused as error:
        raise Unprocessable(str(error)) from None
    return plans, resources


@post("/estimate", status_code=200, summary="Estimate the tasks of a submission")
async def estimate(
    request: Request[Identity, str, State], data: JSONBody[SubmitRequest]
) -> dict[str, TaskEstimate]:
    """The resources (with their source), the plan and the expected seconds of every task."""
    service = _service(request.app.state)
    priority = priority_of(request.user, service.settings.owner)
    plans, resources = await _plan(service, data, priority, new_run_id())
    return estimates(plans, resources)


@get("/runs", summary="List runs")
async def list_runs(
    state: State,
    group: FromQuery[str | None] = None,
    owner: FromQuery[str | None] = None,
    agent: FromQuery[str | None] = None,
    run_state: Annotated[str | None, QueryParameter(name="state")] = None,
) -> list[RunItem]:
    """The runs, newest first, filtered by group, owner (with their agents), agent and state."""
    service = _service(state)
    items = await service.index.list(group, owner, agent, run_state)
    actors = service.supervisor.actors
    return [run_item(actors[item.id].record) if item.id in actors else item for item in items]


@get("/runs/{run:str}", summary="The record of a run")
async def get_run(
    state: State, run: FromPath[str], at: Annotated[int | None, QueryParameter(ge=1)] = None
) -> RunRecord:
    """The record of a run, folded from its events; with `at`, as it was at that event."""
    return _record(_service(state), run, at)


@get("/runs/{run:str}/wait", summary="Wait for the end of a run")
async def wait_run(
    state: State,
    run: FromPath[str],
    timeout: Annotated[float, QueryParameter(ge=0, le=WAIT_MAX_S)] = WAIT_DEFAULT_S,
) -> RunItem:
    """A long poll: the summary once the run ended, or after `timeout` seconds."""
    service = _service(state)
    deadline = time.monotonic() + timeout
    record = _record(service, run)
    while not record.ended:
        actor = service.supervisor.actors.get(run)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if actor is None:
            await asyncio.sleep(min(remaining, service.settings.events_poll_s))
        else:
            await actor.changed.wait(remaining)
        record = _record(service, run)
    return run_item(record)


@get("/runs/{run:str}/progress", summary="The progress of the tasks of a run")
async def run_progress(state: State, run: FromPath[str]) -> ProgressView:
    """The state and the units done of every task."""
    return progress_view(_record(_service(state), run))


@get("/runs/{run:str}/history", summary="The event log of a run", media_type=MediaType.JSON)
async def history(
    state: State,
    run: FromPath[str],
    after: Annotated[int, QueryParameter(ge=0)] = 0,
    limit: Annotated[int | None, QueryParameter(ge=1)] = None,
) -> Response[bytes]:
    """The events of a run after `after`, oldest first, as the log holds them."""
    service = _service(state)
    paths = _paths(service, run)
    lines = []
    try:
        for _, line, event in iter_lines(paths.events):
            if event.seq <= after:
                continue
            lines.append(line.rstrip(b"\n"))
            if limit is not None and len(lines) >= limit:
                break
    except LogCorrupt as error:
        raise HTTPException(status_code=500, detail=f"run {run!r}: corrupt log: {error}") from None
    return Response(b"[" + b",".join(lines) + b"]", media_type=MediaType.JSON)


def _paths(service: Service, run: str) -> RunPaths:
    try:
        return service.supervisor.paths(run)
    except UnknownRun:
        raise NotFoundException(f"run {run!r} does not exist") from None


@get("/runs/{run:str}/events", summary="Follow the events of a run (SSE)")
async def run_events(
    request: Request[Identity, str, State],
    run: FromPath[str],
    last_event_id: Annotated[int | None, HeaderParameter(name="Last-Event-ID", ge=0)] = None,
) -> ServerSentEvent:
    """Server-sent events: every event of the run, `id` its `seq`, from after `Last-Event-ID`.

    The stream ends after the run's last event, or after `events_max_s` (reconnect then).
    """
    service = _service(request.app.state)
    paths = _paths(service, run)
    return ServerSentEvent(_follow(service, paths, last_event_id or 0))


async def _follow(
    service: Service, paths: RunPaths, after: int
) -> AsyncIterator[ServerSentEventMessage]:
    offset = 0
    deadline = time.monotonic() + service.settings.events_max_s
    while True:
        actor = service.supervisor.actors.get(paths.run_id)
        ended = False
        for end, line, event in iter_lines(paths.events, offset):
            offset = end
            ended = isinstance(event, TERMINAL_EVENTS)
            if event.seq <= after:
                continue
            after = event.seq
            kind = event.kind if isinstance(event, UnknownEvent) else event.__struct_config__.tag
            yield ServerSentEventMessage(
                data=line.rstrip(b"\n").decode(), event=str(kind), id=event.seq
            )
        if ended or time.monotonic() > deadline:
            return
        if actor is not None:
            await actor.changed.wait(service.settings.events_poll_s)
        else:
            await asyncio.sleep(service.settings.events_poll_s)


@get("/runs/{run:str}/logs/{task:str}", summary="The logs of a task", media_type=MediaType.TEXT)
async def task_logs(
    state: State,
    run: FromPath[str],
    task: FromPath[str],
    tail_lines: Annotated[int, QueryParameter(ge=0)] = 300,
) -> str:
    """The logs of the processes of a task, oldest first, the last `tail_lines` (0 all) of each."""
    service = _service(state)
    _, paths = _task_dir(service, run, task)
    parts = []
    for path in sorted(paths.logs(task).glob("*.log"), key=_log_order):
        lines = path.read_text(errors="replace").splitlines()
        if tail_lines:
            lines = lines[-tail_lines:]
        parts.append(f"==> {path.name} <==\n" + "".join(line + "\n" for line in lines))
    return "".join(parts)


def _log_order(path: Path) -> tuple[str, int]:
    worker, _, attempt = path.stem.rpartition("-")
    return (worker, int(attempt) if attempt.isdigit() else 0)


@get("/runs/{run:str}/outputs/{task:str}", summary="The output files of a task")
async def task_outputs(state: State, run: FromPath[str], task: FromPath[str]) -> list[OutputFile]:
    """The files below the task's `out/`, paths relative to it."""
    service = _service(state)
    _, paths = _task_dir(service, run, task)
    out = paths.out(task)
    files = []
    for root, _, names in os.walk(out):
        for name in names:
            path = Path(root) / name
            if name.startswith(".") or path.is_symlink():
                continue
            files.append(OutputFile(path=str(path.relative_to(out)), bytes=path.stat().st_size))
    return sorted(files, key=lambda file: file.path)


@get("/runs/{run:str}/outputs/{task:str}/{path:path}", summary="One output file of a task")
async def task_output_file(
    state: State, run: FromPath[str], task: FromPath[str], path: FromPath[str]
) -> File:
    """The content of one output file; paths out of the task's `out/` are refused."""
    service = _service(state)
    _, paths = _task_dir(service, run, task)
    out = paths.out(task).resolve()
    relative = path.lstrip("/")
    if "\0" in relative or ".." in Path(relative).parts:
        raise ClientException(f"output path {path!r} is not inside the outputs of {task!r}")
    target = (out / relative).resolve()
    if not target.is_relative_to(out) or not target.is_file():
        raise NotFoundException(f"task {task!r} of run {run!r} has no output {relative!r}")
    return File(target, filename=target.name)


@post("/runs/{run:str}/cancel", status_code=200, summary="Cancel a run")
async def cancel_run(request: Request[Identity, str, State], run: FromPath[str]) -> RunRecord:
    """Cancel a run: answered once the request is recorded; its processes end right after."""
    service = _service(request.app.state)
    record = _record(service, run)
    identity: Identity = request.user
    allowed = (
        identity.name == service.settings.owner
        or record.submitted_by == identity.name
        or (identity.kind == "person" and record.owner == identity.name)
    )
    if not allowed:
        raise PermissionDeniedException(f"{identity.name} may not cancel run {run!r}")
    actor = service.supervisor.actors.get(run)
    if actor is None or record.ended:
        raise Conflict(f"run {run!r} has ended ({record.state})")
    try:
        return await actor.cancel(identity.name)
    except RunEnded:
        raise Conflict(f"run {run!r} has ended ({_record(service, run).state})") from None


ROUTES = [
    me,
    local_instance,
    validate,
    submit,
    estimate,
    list_runs,
    get_run,
    wait_run,
    run_progress,
    history,
    run_events,
    task_logs,
    task_outputs,
    task_output_file,
    cancel_run,
]


def create_app(
    settings: ServiceSettings,
    backend: Backend,
    types: dict[str, TaskType] | None = None,
    instance: str | None = None,
) -> Litestar:
    """The app of the service on a backend; its lifespan runs the supervisor."""
    types = load_task_types() if types is None else types
    tokens = load_tokens(settings.tokens)
    index = RunIndex(settings.db)
    resources = ResourceStore(settings.db)
    supervisor = Supervisor(settings.store, backend, types, index, resources)
    service = Service(
        settings=settings,
        backend=backend,
        types=types,
        tokens=tokens,
        index=index,
        resources=resources,
        supervisor=supervisor,
        instance=instance,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        settings.store.mkdir(parents=True, exist_ok=True)
        await index.open()
        await resources.open()
        try:
            await supervisor.start()
            yield
        finally:
            await supervisor.close()
            await resources.close()
            await index.close()

    return Litestar(
        route_handlers=ROUTES,
        state=State({"service": service}),
        lifespan=[lifespan],
        middleware=[
            ActivityMiddleware,
            DefineMiddleware(TokenAuthentication, exclude=OPEN_PATHS),
        ],
    )
