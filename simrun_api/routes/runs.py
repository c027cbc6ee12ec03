"""The routes of runs: who calls, validate, estimate, submit, list, read, wait, replay, cancel."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Any

import msgspec
from litestar import MediaType, Request, Response, get, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException, NotFoundException, PermissionDeniedException
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter
from litestar.status_codes import HTTP_201_CREATED

from simrun_api.actor import RunEnded, StoreUnwritable
from simrun_api.auth import priority_of
from simrun_api.routes.common import (
    CORRUPT_LOG,
    SHOW_500,
    Conflict,
    Unprocessable,
    corrupt_log,
    may_act,
    paths_of,
    record_of,
    refusals,
    service_of,
)
from simrun_api.service import Service
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
from simrun_core.errors import WorkflowError
from simrun_core.planner import TaskPlan
from simrun_core.resources import ResolvedResources
from simrun_core.states import RunState
from simrun_core.store import LogCorrupt, iter_lines, new_run_id
from simrun_core.views import progress_view, run_item, run_view
from simrun_core.wire import (
    ErrorDetail,
    Identity,
    InstanceAnswer,
    ProgressView,
    RunItem,
    RunView,
    SubmitRequest,
    TaskEstimate,
    ValidationResult,
)
from simrun_core.workflow import Priority, workflow_from_data

WAIT_DEFAULT_S = 60.0
WAIT_MAX_S = 300.0


@get("/me", summary="The identity of the token", responses=refusals())
async def me(request: Request[Identity, str, State]) -> Identity:
    """Who the token names: a person, or an agent with its owner."""
    return request.user


@get("/local/instance", summary="The instance of a local service")
async def local_instance(state: State) -> InstanceAnswer:
    """The random instance of this start of a local service, answered without a token."""
    service = service_of(state)
    if service.instance is None:
        raise NotFoundException("this service is not a local service")
    return InstanceAnswer(instance=service.instance)


class ValidateRequest(msgspec.Struct):
    """A workflow to check, as decoded from its YAML."""

    workflow: dict[str, Any]


@post("/validate", status_code=200, summary="Validate a workflow", responses=refusals())
async def validate(state: State, data: JSONBody[ValidateRequest]) -> ValidationResult:
    """Check a workflow against the known task types without submitting it."""
    service = service_of(state)
    try:
        workflow = workflow_from_data(data.workflow)
    except WorkflowError as error:
        return ValidationResult(ok=False, errors=[str(error)])
    errors = workflow_errors(workflow, service.types)
    return ValidationResult(ok=not errors, errors=errors)


class InsufficientStorage(HTTPException):
    """The store cannot be written (a full disk, a read-only store): 507."""

    status_code = 507


STORE_REFUSAL = {
    507: ResponseSpec(
        ErrorDetail,
        description="The store cannot be written (a full disk, a read-only store): the detail "
        "names the error; nothing was recorded",
        generate_examples=False,
    )
}


@post(
    "/runs",
    status_code=HTTP_201_CREATED,
    summary="Submit a workflow",
    responses={**refusals(422), **STORE_REFUSAL},
)
async def submit(request: Request[Identity, str, State], data: JSONBody[SubmitRequest]) -> RunView:
    """Validate and plan a run, record it and return it in the state `submitting` at once.

    While the store cannot be written the submission is refused with 507, naming the error.
    The identity of the token is recorded (`submitted_by`, `owner`, `agent`) and decides the
    priority: `owner` for the owner of the service and their agents, `standard` for other
    people, `agent` for their agents.
    """
    service = service_of(request.app.state)
    identity: Identity = request.user
    priority = priority_of(identity, service.settings.owner)
    run_id = new_run_id()
    plans, resources = await _plan(service, data, priority, run_id)
    submitted, settings = submitted_event(
        run_id, data, identity, priority, plans, resources, service.backend.name
    )
    try:
        return run_view(await service.supervisor.submit(submitted, settings))
    except StoreUnwritable as error:
        raise InsufficientStorage(detail=f"run not submitted: {error}") from None


async def _plan(
    service: Service, data: SubmitRequest, priority: Priority, run_id: str
) -> tuple[dict[str, TaskPlan], dict[str, ResolvedResources]]:
    backend = service.backend
    try:
        reservations = backend.capabilities.reservations
        tasks = checked_tasks(data, service.types, backend.name, reservations)
        resources = await resolve_all(tasks, service.resources, model_of(data))
        plans = plan_tasks(
            run_id, data, tasks, resources, priority, await backend.nodes(), backend.max_pods
        )
    except SubmissionRefused as error:
        raise Unprocessable(str(error)) from None
    return plans, resources


@post(
    "/estimate",
    status_code=200,
    summary="Estimate the tasks of a submission",
    responses=refusals(422),
)
async def estimate(
    request: Request[Identity, str, State], data: JSONBody[SubmitRequest]
) -> dict[str, TaskEstimate]:
    """The resources (with their source), the plan and the expected seconds of every task."""
    service = service_of(request.app.state)
    priority = priority_of(request.user, service.settings.owner)
    plans, resources = await _plan(service, data, priority, new_run_id())
    return estimates(plans, resources)


@get("/runs", summary="List runs", responses=refusals())
async def list_runs(
    state: State,
    group: FromQuery[str | None] = None,
    owner: FromQuery[str | None] = None,
    agent: FromQuery[str | None] = None,
    run_state: Annotated[RunState | None, QueryParameter(name="state")] = None,
) -> list[RunItem]:
    """The runs, newest first, filtered by group, owner (with their agents), agent and state."""
    return await service_of(state).runs(group, owner, agent, run_state)


@get(
    "/runs/{run:str}",
    summary="A run and its tasks",
    responses={**refusals(404), **CORRUPT_LOG},
    exception_handlers=SHOW_500,
)
async def get_run(
    state: State, run: FromPath[str], at: Annotated[int | None, QueryParameter(ge=1)] = None
) -> RunView:
    """A run with every task (state, units, plan, workers), folded from its events; with
    `at`, as it was at that event."""
    return run_view(record_of(service_of(state), run, at))


@get(
    "/runs/{run:str}/wait",
    summary="Wait for the end of a run",
    responses={**refusals(404), **CORRUPT_LOG},
    exception_handlers=SHOW_500,
)
async def wait_run(
    state: State,
    run: FromPath[str],
    timeout: Annotated[float, QueryParameter(ge=0, le=WAIT_MAX_S)] = WAIT_DEFAULT_S,
) -> RunItem:
    """A long poll: the summary once the run ended, or after `timeout` seconds."""
    service = service_of(state)
    deadline = time.monotonic() + timeout
    record = record_of(service, run)
    while not record.ended:
        signal = service.supervisor.signal(run)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if signal is None:
            await asyncio.sleep(min(remaining, service.settings.events_poll_s))
        else:
            await signal.wait(remaining)
        record = record_of(service, run)
    return run_item(record)


@get(
    "/runs/{run:str}/progress",
    summary="The progress of the tasks of a run",
    responses={**refusals(404), **CORRUPT_LOG},
    exception_handlers=SHOW_500,
)
async def run_progress(state: State, run: FromPath[str]) -> ProgressView:
    """The state and the units done of every task."""
    return progress_view(record_of(service_of(state), run))


@get(
    "/runs/{run:str}/history",
    summary="The event log of a run",
    media_type=MediaType.JSON,
    responses={
        200: ResponseSpec(
            list[dict[str, Any]],
            description="The events, each `{seq, time, type, ...}` as the log holds it",
            generate_examples=False,
        ),
        **refusals(404),
        **CORRUPT_LOG,
    },
    exception_handlers=SHOW_500,
)
async def history(
    state: State,
    run: FromPath[str],
    after: Annotated[int, QueryParameter(ge=0)] = 0,
    limit: Annotated[int | None, QueryParameter(ge=1)] = None,
) -> Response[bytes]:
    """The events of a run after `after`, oldest first, as the log holds them."""
    service = service_of(state)
    paths = paths_of(service, run)
    lines = []
    try:
        for _, line, event in iter_lines(paths.events):
            if event.seq <= after:
                continue
            lines.append(line.rstrip(b"\n"))
            if limit is not None and len(lines) >= limit:
                break
    except FileNotFoundError:
        raise NotFoundException(f"run {run!r} does not exist") from None
    except LogCorrupt as error:
        raise corrupt_log(run, error) from None
    return Response(b"[" + b",".join(lines) + b"]", media_type=MediaType.JSON)


@post(
    "/runs/{run:str}/cancel",
    status_code=200,
    summary="Cancel a run",
    responses={**refusals(403, 404, 409), **STORE_REFUSAL},
)
async def cancel_run(request: Request[Identity, str, State], run: FromPath[str]) -> RunView:
    """Cancel a run: answered once the request is recorded; its processes end right after.

    A person may cancel their runs and their agents' runs, an agent its own, the owner of the
    service every run. 507 when the cancel cannot be recorded (the store cannot be written;
    the run is then stopped and ends `failed`).
    """
    service = service_of(request.app.state)
    record = record_of(service, run)
    identity: Identity = request.user
    if not may_act(service, identity, record):
        raise PermissionDeniedException(f"{identity.name} may not cancel run {run!r}")
    if record.ended:
        raise Conflict(f"run {run!r} has ended ({record.state})")
    try:
        return run_view(await service.supervisor.cancel(run, identity.name))
    except RunEnded:
        raise Conflict(f"run {run!r} has ended ({record_of(service, run).state})") from None
    except StoreUnwritable as error:
        raise InsufficientStorage(detail=f"run {run!r} not cancelled: {error}") from None
