"""The routes of the Editor: the catalogue of task types, the YAML of a workflow, and the edit
sessions through which the browser and `simrun edit` meet (`simrun_api.edits`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import msgspec
from litestar import Request, get, post
from litestar.datastructures import State
from litestar.exceptions import (
    NotFoundException,
    PermissionDeniedException,
    TooManyRequestsException,
)
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, JSONBody, QueryParameter
from litestar.status_codes import HTTP_201_CREATED

from simrun_api.edits import (
    EditSessions,
    NotYours,
    SessionTooLarge,
    SessionUnavailable,
    TooManySessions,
    UnknownSession,
)
from simrun_api.routes.common import Conflict, WorkflowRefused, service_of
from simrun_core.edits import (
    EditAsk,
    EditRequest,
    EditResult,
    EditSession,
    EditSessionSummary,
    EditState,
    OpenEdit,
    TaskTypeView,
    WorkflowText,
    catalogue,
)
from simrun_core.errors import WorkflowError
from simrun_core.wire import ErrorDetail, Identity
from simrun_core.workflow import Workflow, workflow_yaml

POLL_DEFAULT_S = 20.0
POLL_MAX_S = 60.0

_REFUSALS = {
    401: "No bearer token, or one the service does not know",
    403: "The session was opened by another identity: only it reads and uses the session",
    404: "No such edit session",
    409: "The session is closed, its command is not connected, or the command did not answer "
    "in time (or stopped before it answered): the detail says which",
    413: "The session would hold more than `max_edit_session_bytes` (its workflow, trees and "
    "snapshots): the detail names the limit; the session keeps what it had",
    422: "The workflow is larger than a workflow file may be (nesting, values): the detail "
    "names the limit",
    429: "The identity has `max_edit_sessions_per_identity` sessions, all connected: stop a "
    "simrun edit of them first",
}


def _refusals(*codes: int) -> dict[int, ResponseSpec]:
    return {
        code: ResponseSpec(ErrorDetail, description=_REFUSALS[code], generate_examples=False)
        for code in (401, *codes)
    }


def edits_of(state: State) -> EditSessions:
    return state.edits


def _yaml_of(workflow: Workflow) -> str:
    """The YAML of a workflow; 422 naming the limit it passes when no workflow file could
    hold it (a file simrun itself would refuse). Seconds for thousands of tasks: the routes
    call it in a thread."""
    try:
        return workflow_yaml(workflow)
    except WorkflowError as error:
        raise WorkflowRefused(error.problems) from None


@contextmanager
def _refused(session: str) -> Iterator[None]:
    """The errors of the sessions as the refusals of the routes."""
    try:
        yield
    except UnknownSession:
        raise NotFoundException(f"edit session {session!r} does not exist") from None
    except NotYours as error:
        raise PermissionDeniedException(str(error)) from None
    except SessionUnavailable as error:
        raise Conflict(str(error)) from None
    except SessionTooLarge as error:
        raise RequestEntityTooLarge(detail=str(error)) from None
    except TooManySessions as error:
        raise TooManyRequestsException(detail=str(error)) from None


@get("/task-types", summary="The catalogue of task types", responses=_refusals())
async def task_types(state: State) -> list[TaskTypeView]:
    """The task types of the service, by name: their description, ports, whether they split,
    their default resources and the JSON Schema of their settings (a field the type's plan
    sets is `readOnly`), the palette and the settings forms of the Editor."""
    return catalogue(service_of(state).types)


class WorkflowBody(msgspec.Struct, forbid_unknown_fields=True):
    """A workflow, as decoded from its YAML."""

    workflow: Workflow


@post("/workflow-yaml", status_code=200, summary="The YAML of a workflow", responses=_refusals(422))
async def workflow_text(data: JSONBody[WorkflowBody]) -> WorkflowText:
    """The YAML text `simrun` writes for a workflow (a save of the Editor, its Download YAML):
    the fields that differ from the defaults, a list indented below its key. 422 for a
    workflow no workflow file may hold (nested deeper, more values than a file may have)."""
    return WorkflowText(text=await asyncio.to_thread(_yaml_of, data.workflow))


@post(
    "/edits",
    status_code=HTTP_201_CREATED,
    summary="Open an edit session (simrun edit)",
    responses=_refusals(413, 429),
)
async def open_edit(
    request: Request[Identity, str, State], data: JSONBody[OpenEdit]
) -> EditSession:
    """Open an edit session for a workflow file of the machine of `simrun edit`, which then
    long-polls the requests of the browser; the session is the identity's of the token.

    An identity has at most `max_edit_sessions_per_identity` sessions: opening one more
    removes its oldest whose command is gone (closed or no longer connected), 429 when all are
    connected; 413 for a session larger than `max_edit_session_bytes`."""
    with _refused("new"):
        return await edits_of(request.app.state).open(request.user, data)


@get("/edits", summary="The edit sessions of the token", responses=_refusals())
async def list_edits(request: Request[Identity, str, State]) -> list[EditSessionSummary]:
    """The edit sessions the identity of the token opened, the last seen first: their file,
    machine, the name of the workflow on disk and whether each is connected (its command
    asked within 30 s and did not close it); `GET /edits/{session}` has what one holds.
    Sessions closed, or not seen, for `edit_session_max_age_s` are removed."""
    return await edits_of(request.app.state).summaries(request.user)


@get("/edits/{session:str}", summary="An edit session", responses=_refusals(403, 404))
async def get_edit(request: Request[Identity, str, State], session: FromPath[str]) -> EditSession:
    """An edit session: its file and machine, what is on disk (version, workflow, problems), the
    snapshots and trees of its sources, and whether its command is connected."""
    with _refused(session):
        return edits_of(request.app.state).get(session, request.user)


@post(
    "/edits/{session:str}/state",
    status_code=200,
    summary="Send what simrun edit read from disk",
    responses=_refusals(403, 404, 409, 413),
)
async def edit_state(
    request: Request[Identity, str, State], session: FromPath[str], data: JSONBody[EditState]
) -> EditSession:
    """The file and the trees as the command read them (and new snapshots after a run); the
    command sends it when it changed, and as a sign of life while it carries out a request.
    413 when the session would pass `max_edit_session_bytes` (it keeps what it had)."""
    with _refused(session):
        return await edits_of(request.app.state).state(session, request.user, data)


@get(
    "/edits/{session:str}/requests",
    summary="Wait for the requests of the browser (simrun edit)",
    responses=_refusals(403, 404, 409),
)
async def edit_requests(
    request: Request[Identity, str, State],
    session: FromPath[str],
    timeout: Annotated[float, QueryParameter(ge=0, le=POLL_MAX_S)] = POLL_DEFAULT_S,
) -> list[EditRequest]:
    """A long poll of the command: the saves and runs of the browser not yet answered, once
    there is one or after `timeout` seconds (then none). A request comes again until it is
    answered; the command carries each out once."""
    with _refused(session):
        return await edits_of(request.app.state).requests(session, request.user, timeout)


@post(
    "/edits/{session:str}/requests",
    status_code=200,
    summary="Save or run the draft through simrun edit",
    responses=_refusals(403, 404, 409, 422),
)
async def ask_edit(
    request: Request[Identity, str, State], session: FromPath[str], data: JSONBody[EditAsk]
) -> EditResult:
    """Pass a save or a run of the draft to the command of the session and answer its result:
    `saved`, `conflict` (the file changed on disk since `base`; nothing written), `submitted`
    (the run), `refused` or `failed`. Waits up to 60 s for the command: 409 at once when the
    session is not connected or closed, as soon as the command stops or goes away meanwhile,
    and after the 60 s. 422 for a draft no workflow file may hold, before the command sees it."""
    await asyncio.to_thread(_yaml_of, data.workflow)
    with _refused(session):
        return await edits_of(request.app.state).ask(session, request.user, data)


@post(
    "/edits/{session:str}/requests/{request_id:str}/result",
    status_code=200,
    summary="Answer a request of the browser (simrun edit)",
    responses=_refusals(403, 404),
)
async def edit_result(
    request: Request[Identity, str, State],
    session: FromPath[str],
    request_id: FromPath[str],
    data: JSONBody[EditResult],
) -> EditSession:
    """The command's result of a request; sent again (its first answer was lost), or for a
    request the browser no longer waits for, it changes nothing."""
    with _refused(session):
        return await edits_of(request.app.state).answer(session, request.user, request_id, data)


@post(
    "/edits/{session:str}/close",
    status_code=200,
    summary="Close an edit session (simrun edit stopped)",
    responses=_refusals(403, 404),
)
async def close_edit(request: Request[Identity, str, State], session: FromPath[str]) -> EditSession:
    """The command stopped: the session is closed (listed under Closed) and the requests that
    wait for it fail at once."""
    with _refused(session):
        return await edits_of(request.app.state).close(session, request.user)
