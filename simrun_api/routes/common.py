"""What the routes share: their refusals, and the lookups of the service, a run and a task."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.datastructures import State
from litestar.exceptions import ClientException, HTTPException, NotFoundException
from litestar.openapi import ResponseSpec
from litestar.status_codes import HTTP_409_CONFLICT

from simrun_api.auth import may_act_on
from simrun_api.service import Service
from simrun_api.supervisor import UnknownRun
from simrun_core.errors import Problem
from simrun_core.fold import FoldError, RunRecord
from simrun_core.store import LogCorrupt, RunPaths
from simrun_core.wire import ErrorDetail, Identity, RunItem, WorkflowRefusal, submitter


class Unprocessable(ClientException):
    """A request that is well formed but cannot be carried out: 422."""

    status_code = 422


class WorkflowRefused(Unprocessable):
    """A workflow (a submission) that cannot run: 422 with every problem, one per line of the
    detail and each in `errors`, written as `simrun_core.errors.Problem.text` gives them."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__(detail="\n".join(problem.text() for problem in problems))


def workflow_refusal(request: Request, error: WorkflowRefused) -> Response[dict[str, Any]]:
    """The answer of a refused workflow: `{status_code: 422, detail, errors}`."""
    errors = [problem.text() for problem in error.problems]
    content = {"status_code": 422, "detail": "\n".join(errors), "errors": errors}
    return Response(content, status_code=422)


class Conflict(ClientException):
    """A request that conflicts with the state of the run: 409."""

    status_code = HTTP_409_CONFLICT


REFUSALS = {
    401: "No bearer token, or one the service does not know",
    403: "The identity of the token may not do this",
    404: "No such run (or task of it)",
    409: "The run is in a state that does not allow this",
    429: "The identity has as many event streams open as the service allows "
    "(`max_streams_per_identity`): close one first",
    422: "The workflow cannot run, or the body is no submission of one: every problem in "
    "`errors` (`task 'ID': field: what is wrong`), one per line in `detail`",
}


def refusals(*codes: int) -> dict[int, ResponseSpec]:
    """The documented refusals of a route: 401 always, and `codes` (422 with its `errors`)."""
    return {
        code: ResponseSpec(
            WorkflowRefusal if code == 422 else ErrorDetail,
            description=REFUSALS[code],
            generate_examples=False,
        )
        for code in (401, *codes)
    }


CORRUPT_LOG = {
    500: ResponseSpec(
        ErrorDetail,
        description="The run's log cannot be read (a corrupt line, a gap): the detail names the "
        "file and the line; the other runs are served as before",
        generate_examples=False,
    )
}


def _server_error(request: Request, error: Exception) -> Response[dict[str, Any]]:
    """A 500 that keeps the detail of an HTTPException (a corrupt log names its file and line);
    any other error stays `Internal Server Error`."""
    detail = error.detail if isinstance(error, HTTPException) else "Internal Server Error"
    return Response({"status_code": 500, "detail": detail}, status_code=500)


SHOW_500 = {500: _server_error}


def corrupt_log(run: str, error: LogCorrupt) -> HTTPException:
    """The 500 of a run whose log cannot be read, naming the file and the line."""
    return HTTPException(status_code=500, detail=f"run {run!r}: corrupt log: {error}")


def service_of(state: State) -> Service:
    return state.service


def record_of(service: Service, run: str, at: int | None = None) -> RunRecord:
    try:
        return service.supervisor.load(run, at)
    except (UnknownRun, FileNotFoundError):
        raise NotFoundException(f"run {run!r} does not exist") from None
    except LogCorrupt as error:
        raise corrupt_log(run, error) from None
    except FoldError as error:
        raise HTTPException(status_code=500, detail=f"run {run!r}: {error}") from None


def item_of(service: Service, run: str) -> RunItem:
    """The summary of a run, also of one whose log does not fold (see `Supervisor.summary`)."""
    try:
        return service.supervisor.summary(run)
    except (UnknownRun, FileNotFoundError):
        raise NotFoundException(f"run {run!r} does not exist") from None


def task_of(service: Service, run: str, task: str) -> tuple[RunRecord, RunPaths]:
    record = record_of(service, run)
    if task not in record.tasks:
        raise NotFoundException(f"run {run!r} has no task {task!r}")
    return record, RunPaths(service.settings.store, run)


def paths_of(service: Service, run: str) -> RunPaths:
    try:
        return service.supervisor.paths(run)
    except UnknownRun:
        raise NotFoundException(f"run {run!r} does not exist") from None


def may_act(service: Service, identity: Identity, record: RunRecord | RunItem) -> bool:
    """Whether `identity` may cancel or remove the run (`may_act_on` its submitter)."""
    who = submitter(record.submitted_by, record.owner, record.agent)
    return may_act_on(identity, who, service.settings.owner)
