"""The routes of runs: who calls, validate, estimate, submit, list, read, wait, replay, cancel."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Annotated, Any, Literal

import msgspec
from litestar import MediaType, Request, Response, get, post
from litestar.datastructures import State
from litestar.exceptions import (
    ClientException,
    HTTPException,
    NotFoundException,
    PermissionDeniedException,
    SerializationException,
)
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter
from litestar.status_codes import HTTP_201_CREATED

from simrun_api.actor import RunEnded, StoreUnwritable
from simrun_api.auth import priority_of
from simrun_api.backends.containers import container_engine
from simrun_api.routes.common import (
    CORRUPT_LOG,
    SHOW_500,
    Conflict,
    WorkflowRefused,
    corrupt_log,
    may_act,
    paths_of,
    record_of,
    refusals,
    service_of,
)
from simrun_api.service import Service
from simrun_api.snapshot_types import SnapshotTypes, snapshot_types
from simrun_api.submission import (
    body_problems,
    checked_tasks,
    estimates,
    model_of,
    plan_tasks,
    resolve_all,
    submitted_event,
)
from simrun_api.supervisor import NotWritten
from simrun_api.workers import claims_by_worker
from simrun_core.errors import Problem
from simrun_core.events import KNOWN_TYPES, Event, UnknownEvent
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
from simrun_core.workflow import Priority, Workflow

WAIT_DEFAULT_S = 60.0
WAIT_MAX_S = 300.0
EventType = Literal[tuple(sorted(KNOWN_TYPES))]  # type: ignore[valid-type]
"""The types of the events, as `GET /runs/{run}/history?type=` takes them."""


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


class ValidateRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A workflow to check, as decoded from its YAML."""

    workflow: Workflow


async def _body(request: Request[Any, Any, Any]) -> Any:
    """The JSON body of a route of workflows; WorkflowRefused (422) for a body that is not
    JSON or is nested too deeply to decode. A body over the limit stays a 413."""
    try:
        return await request.json()
    except RequestEntityTooLarge:
        raise
    except SerializationException as error:
        raise WorkflowRefused([Problem(f"the body is not JSON: {error}")]) from None
    except ClientException as error:  # BodyRequest: nested too deeply to decode
        raise WorkflowRefused([Problem(str(error.detail))]) from None


async def _check_submission(request: Request[Any, Any, Any]) -> None:
    """Before a submission decodes: WorkflowRefused (422) with every field that is wrong, of
    the body and of each task, rather than the first one (litestar's 400)."""
    types = service_of(request.app.state).types
    body = await _body(request)
    problems = await asyncio.to_thread(body_problems, body, SubmitRequest, types)
    if problems:
        raise WorkflowRefused(problems)


async def _check_validation(request: Request[Any, Any, Any]) -> ValidationResult | None:
    """Before a validation decodes: the answer `ok: false` with every field that is wrong."""
    types = service_of(request.app.state).types
    body = await _body(request)
    problems = await asyncio.to_thread(body_problems, body, ValidateRequest, types)
    if problems:
        return ValidationResult(ok=False, errors=[problem.text() for problem in problems])
    return None


@post(
    "/validate",
    status_code=200,
    summary="Validate a workflow",
    responses=refusals(422),
    before_request=_check_validation,
)
async def validate(
    request: Request[Identity, str, State], data: JSONBody[ValidateRequest]
) -> ValidationResult:
    """Check a workflow as a submission of it would be, without submitting it: `ok` when it
    would be accepted, else every problem in `errors` (`task 'ID': field: what is wrong`), as
    the 422 of `POST /runs` lists them. A body that is not JSON is refused with 422."""
    service = service_of(request.app.state)
    priority = priority_of(request.user, service.settings.owner)
    submission = SubmitRequest(workflow=data.workflow)
    problems = (await _checked(service, submission, priority, new_run_id()))[2]
    return ValidationResult(ok=not problems, errors=[problem.text() for problem in problems])


class InsufficientStorage(HTTPException):
    """The store cannot be written (a full disk, a read-only store): 507."""

    status_code = 507


def what_failed(error: OSError) -> str:
    """What an OSError says failed, without the path it names: a client is told that the disk
    is full, not where the service keeps its files."""
    if error.strerror:
        return error.strerror
    return str(error) if error.filename is None else type(error).__name__


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
    before_request=_check_submission,
)
async def submit(request: Request[Identity, str, State], data: JSONBody[SubmitRequest]) -> RunView:
    """Validate and plan a run, record it and return it in the state `submitting` at once.

    A workflow that cannot run is refused with 422 listing every problem (`errors`).
    While the store cannot be written the submission is refused with 507, naming the error.
    The identity of the token is recorded (`submitted_by`, `owner`, `agent`) and decides the
    priority: `owner` for the owner of the service and their agents, `standard` for other
    people, `agent` for their agents.
    """
    service = service_of(request.app.state)
    identity: Identity = request.user
    priority = priority_of(identity, service.settings.owner)
    run_id = new_run_id()
    learned = await snapshot_types(
        service.backend, service.settings.store, service.types, data, run_id
    )
    try:
        plans, resources = await _plan(service, data, priority, run_id, learned)
        submitted, settings = submitted_event(
            run_id,
            data,
            identity,
            priority,
            plans,
            resources,
            service.backend.name,
            snapshot_types=learned.recorded(),
        )
        try:
            record = await service.supervisor.submit(submitted, settings)
        except StoreUnwritable as error:
            raise InsufficientStorage(
                detail=f"run not submitted: the store cannot be written: {what_failed(error.error)}"
            ) from None
    except BaseException:
        await learned.discard()
        raise
    await learned.keep(service.settings.store, run_id)
    return run_view(record)


async def _checked(
    service: Service,
    data: SubmitRequest,
    priority: Priority,
    run_id: str,
    learned: SnapshotTypes | None = None,
) -> tuple[dict[str, TaskPlan], dict[str, ResolvedResources], list[Problem]]:
    """The plans and resources of a submission, and every problem of it, planning included;
    with the types its snapshots taught (`learned`, a local submission with snapshots)."""
    backend = service.backend
    reservations = backend.capabilities.reservations
    learned = learned or SnapshotTypes()
    types = learned.types(service.types)
    commands = backend.capabilities.local_commands
    engine = container_engine() if commands and data.local_commands == "docker" else None
    # The checks and the planning are pure but take seconds for tens of thousands of tasks:
    # in threads, so that no other request waits on them.
    tasks, problems = await asyncio.to_thread(
        checked_tasks, data, types, backend.name, reservations, commands, engine
    )
    problems = learned.without_duplicates(problems)
    resources = await resolve_all(tasks, service.resources, model_of(data))
    nodes = await backend.nodes()
    plans, unplanned = await asyncio.to_thread(
        plan_tasks,
        run_id,
        data,
        tasks,
        resources,
        priority,
        nodes,
        backend.max_pods,
        backend.capabilities.pod_start_s,
    )
    return plans, resources, problems + unplanned


async def _plan(
    service: Service,
    data: SubmitRequest,
    priority: Priority,
    run_id: str,
    learned: SnapshotTypes | None = None,
) -> tuple[dict[str, TaskPlan], dict[str, ResolvedResources]]:
    """The plans and resources of a submission; WorkflowRefused (422) with every problem."""
    plans, resources, problems = await _checked(service, data, priority, run_id, learned)
    if problems:
        raise WorkflowRefused(problems)
    return plans, resources


@post(
    "/estimate",
    status_code=200,
    summary="Estimate the tasks of a submission",
    responses=refusals(422),
    before_request=_check_submission,
)
async def estimate(
    request: Request[Identity, str, State], data: JSONBody[SubmitRequest]
) -> dict[str, TaskEstimate]:
    """The resources (with their source), the plan and the expected seconds of every task."""
    service = service_of(request.app.state)
    priority = priority_of(request.user, service.settings.owner)
    run_id = new_run_id()
    learned = await snapshot_types(
        service.backend, service.settings.store, service.types, data, run_id
    )
    try:
        plans, resources = await _plan(service, data, priority, run_id, learned)
    finally:
        await learned.discard()
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
    timeout: Annotated[
        float,
        QueryParameter(
            ge=0,
            description=f"Seconds to wait at most ({WAIT_DEFAULT_S:g} by default); a longer "
            f"wait is capped at {WAIT_MAX_S:g}, so ask again for a longer one.",
        ),
    ] = WAIT_DEFAULT_S,
) -> RunItem:
    """A long poll: the summary once the run ended, or after `timeout` seconds (at most
    300: a longer timeout is capped, not refused)."""
    service = service_of(state)
    deadline = time.monotonic() + min(timeout, WAIT_MAX_S)
    record = record_of(service, run)
    while not record.ended:
        feed = service.supervisor.feed(run)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        if feed is None:
            await asyncio.sleep(min(remaining, service.settings.events_poll_s))
        else:
            await feed.wait(remaining)
        record = record_of(service, run)
    return run_item(record)


@get(
    "/runs/{run:str}/progress",
    summary="The progress of the tasks of a run",
    responses={**refusals(404), **CORRUPT_LOG},
    exception_handlers=SHOW_500,
)
async def run_progress(state: State, run: FromPath[str]) -> ProgressView:
    """The state and the units done of every task; of a split task also the counts of its
    ledger (`pending`, `claimed`, `done`, `total`: the units claimed by its live workers read
    from its ledger, the units done from the run's log) and its first and last progress lines
    (the first and the last unit done: index, worker, seconds, time)."""
    service = service_of(state)
    record = record_of(service, run)
    paths = paths_of(service, run)
    live = [
        task
        for task, progress in record.progress.items()
        if progress.units is not None
        and not record.ended
        and task in record.tasks
        and not record.tasks[task].final
    ]

    def claimed() -> dict[str, int]:
        return {task: sum(claims_by_worker(paths.ledger(task)).values()) for task in live}

    return progress_view(record, await asyncio.to_thread(claimed) if live else None)


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
    event_type: Annotated[list[EventType] | None, QueryParameter(name="type")] = None,
    task: FromQuery[str | None] = None,
    tail: Annotated[int | None, QueryParameter(ge=1)] = None,
) -> Response[bytes]:
    """The events of a run after `after`, oldest first, as the log holds them: only those of
    a `type` (repeated: of any of them) and of `task` when given, the first `limit` of them,
    and of those the last `tail`."""
    service = service_of(state)
    paths = paths_of(service, run)
    types = frozenset(event_type or ())

    def chosen(event: Event) -> bool:
        kind = event.kind if isinstance(event, UnknownEvent) else event.__struct_config__.tag
        return (
            event.seq > after
            and (not types or kind in types)
            and (task is None or getattr(event, "task", None) == task)
        )

    def read() -> list[bytes]:
        lines: collections.deque[bytes] = collections.deque(maxlen=tail)
        taken = 0
        for _, line, event in iter_lines(paths.events):
            if not chosen(event):
                continue
            lines.append(line.rstrip(b"\n"))
            taken += 1
            if limit is not None and taken >= limit:
                break
        return list(lines)

    try:
        lines = await asyncio.to_thread(read)
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
    except NotWritten as error:
        raise Conflict(str(error)) from None
    except StoreUnwritable as error:
        raise InsufficientStorage(
            detail=f"run {run!r} not cancelled: the store cannot be written: "
            f"{what_failed(error.error)}"
        ) from None
