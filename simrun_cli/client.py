"""The HTTP client of the service: one method per route, answers decoded into simrun_core structs.

A refusal of the service (status >= 400) raises `ServiceError` with its detail; a service that
cannot be reached raises `ServiceUnreachable` naming the URL. `follow` reads the events of a run
from its SSE stream and resumes a dropped stream after the last seq it saw (`Last-Event-ID`);
`wait` and `follow` ride out a dropped connection or a restarting service with a backoff, and a
client given `relocate` asks it where the service is before it tries again (the local service
comes back on another port).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote, urlsplit

import httpx
import msgspec
from httpx_sse import ServerSentEvent, SSEError, connect_sse

from simrun_cli.errors import check_id
from simrun_core.edits import TaskTypeView
from simrun_core.events import TERMINAL_EVENTS, Event, EventDecodeError, decode_event
from simrun_core.outputs import OUTPUTS_LIMIT
from simrun_core.provenance import SourceProvenance
from simrun_core.snapshot import FileEntry, MissingAsked, MissingFound, Scan
from simrun_core.states import RunState
from simrun_core.wire import (
    CleanupRequest,
    CleanupResult,
    CompareRequest,
    CompareTable,
    ErrorDetail,
    Identity,
    OutputListing,
    ProgressView,
    RunItem,
    RunView,
    ServerUsage,
    SubmitRequest,
    TaskEstimate,
    Usage,
    ValidationResult,
    WorkerView,
)
from simrun_core.workflow import Workflow

DEFAULT_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0
WAIT_POLL_MAX_S = 60.0
STREAM_READ_S = 60.0
UPLOAD_READ_S = 600.0
"""How long an upload of a snapshot waits for its answer once sent: the service checks and
writes every file of it first."""
SNAPSHOTS_READ_S = 600.0
"""How long a submission or an estimate with snapshots waits for its answer: a local service
makes the venv of the run first when a task has a type only the snapshots have."""
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 10.0
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# A proxy in front of the service or a service that is starting or stopping answers these; they
# pass like a dropped connection.
TRANSIENT_STATUSES = frozenset({502, 503, 504})

Relocate = Callable[[], tuple[str, str]]


class ServiceError(Exception):
    """The service refused a request: its HTTP status and the detail it gave."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{detail} (HTTP {status})")
        self.status = status
        self.detail = detail


class ServiceUnreachable(Exception):
    """The service at `url` could not be reached; `reason` says what the connection did."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the service at {url}: {reason}")
        self.url = url
        self.reason = reason


def transient(error: Exception) -> bool:
    """Whether an error of a request may pass: no answer, or a service that is (re)starting."""
    if isinstance(error, ServiceUnreachable):
        return True
    return isinstance(error, ServiceError) and error.status in TRANSIENT_STATUSES


def backoff_delays(first: float = BACKOFF_FIRST_S, most: float = BACKOFF_MAX_S) -> Iterator[float]:
    """The pauses before reconnecting: `first` seconds, doubling up to `most`, then `most`."""
    delay = first
    while True:
        yield delay
        delay = min(delay * 2, most)


def segment(value: str) -> str:
    """A value quoted as one segment of a URL path."""
    return quote(value, safe="")


def run_path(run_id: str, rest: str = "") -> str:
    """The path of a route of a run, `/runs/{run}` and `rest`, its id checked and quoted."""
    return f"/runs/{segment(check_id(run_id))}{rest}"


def task_segment(task_id: str) -> str:
    """A task id checked (see `check_id`) and quoted as one segment of a URL path."""
    return segment(check_id(task_id, "task"))


class Client:
    """A client of the service for one token (sync httpx; close it, or use it in `with`)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        relocate: Relocate | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        """`relocate`, if given, answers the URL and token of the service anew; `wait` and
        `follow` call it before they retry a lost service, e.g. a local service that was
        started again on another port. `http`, if given, is an open httpx client this one
        takes over (and closes), e.g. the one that probed the local service, with its
        connection: its base URL, headers and timeout are set here, `transport` is not used."""
        self.timeout = timeout
        self._sleep = sleep
        self._transport = transport
        self._relocate = relocate
        self._connect(base_url, token, http)

    def _connect(self, base_url: str, token: str, http: httpx.Client | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        timeout = httpx.Timeout(self.timeout, connect=CONNECT_TIMEOUT_S)
        if http is not None:
            http.base_url = httpx.URL(self.base_url)
            http.headers = headers
            http.timeout = timeout
            self._http = http
            return
        url = urlsplit(self.base_url)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            transport=self._transport,
            trust_env=url.hostname not in LOOPBACK_HOSTS,
            # Plain http needs no SSL context; building one that verifies loads certifi's CA
            # bundle (~30 ms). https verifies as always.
            verify=url.scheme != "http",
        )

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def relocated(self) -> bool:
        """Ask `relocate` where the service is now and use that; whether it moved.

        A `relocate` that fails (it raises) leaves the client as it is.
        """
        if self._relocate is None:
            return False
        try:
            url, token = self._relocate()
        except Exception:
            return False
        if (url.rstrip("/"), token) == (self.base_url, self._token):
            return False
        self._http.close()
        self._connect(url, token)
        return True

    def _pause(self, delays: Iterator[float], deadline: float | None) -> bool:
        """Sleep the next backoff, then relocate; False (at once) when it would pass `deadline`."""
        pause = next(delays)
        if deadline is not None and time.monotonic() + pause >= deadline:
            return False
        self._sleep(pause)
        self.relocated()
        return True

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # the routes

    def me(self) -> Identity:
        """`GET /me`: the identity of the token."""
        return _decode(self.request("GET", "/me"), Identity)

    def submit(self, request: SubmitRequest) -> RunView:
        """`POST /runs`: submit a workflow; the run in the state `submitting`."""
        timeout = self._submission_timeout(request)
        return _decode(self._post_json("/runs", request, timeout=timeout), RunView)

    def estimate(self, request: SubmitRequest) -> dict[str, TaskEstimate]:
        """`POST /estimate`: the resources, plan and expected seconds of every task."""
        timeout = self._submission_timeout(request)
        response = self._post_json("/estimate", request, timeout=timeout)
        return _decode(response, dict[str, TaskEstimate])

    def validate(self, workflow: Workflow) -> ValidationResult:
        """`POST /validate`: whether a workflow would be accepted, else its problems (a
        workflow planned as `submit` submits it: `simrun_cli.request.plan_tasks`)."""
        body = {"workflow": msgspec.to_builtins(workflow)}
        return _decode(self._post_json("/validate", body), ValidationResult)

    def task_types(self) -> list[TaskTypeView]:
        """`GET /task-types`: the task types of the service with the JSON Schema of their
        settings, their ports and their default resources, by name."""
        return _decode(self.request("GET", "/task-types"), list[TaskTypeView])

    def _submission_timeout(self, request: SubmitRequest) -> httpx.Timeout:
        """The timeout of a submission: longer with snapshots (`SNAPSHOTS_READ_S`)."""
        read = self.timeout
        if any(source.snapshot for source in request.sources):
            read = max(read, SNAPSHOTS_READ_S)
        return httpx.Timeout(read, connect=CONNECT_TIMEOUT_S)

    def run_json(self, run_id: str, at: int | None = None) -> bytes:
        """`GET /runs/{run}`: the view of a run as the service encoded it, at seq `at`."""
        params = {"at": at} if at is not None else None
        return self.request("GET", run_path(run_id), params=params).content

    def run(self, run_id: str, at: int | None = None) -> RunView:
        """`GET /runs/{run}`: the view of a run, folded up to seq `at` (None: the latest)."""
        return _decode_body(self.run_json(run_id, at), RunView, f"/runs/{run_id}")

    def runs(
        self,
        group: str | None = None,
        owner: str | None = None,
        agent: str | None = None,
        state: RunState | None = None,
    ) -> list[RunItem]:
        """`GET /runs`: the runs, filtered by group, owner, agent and state."""
        filters = {"group": group, "owner": owner, "agent": agent, "state": state}
        params = {key: str(value) for key, value in filters.items() if value is not None}
        return _decode(self.request("GET", "/runs", params=params), list[RunItem])

    def wait_once(self, run_id: str, timeout_s: float) -> RunItem:
        """`GET /runs/{run}/wait`: the summary once the run ended or after `timeout_s` seconds."""
        response = self.request(
            "GET",
            run_path(run_id, "/wait"),
            params={"timeout": _seconds(timeout_s)},
            timeout=httpx.Timeout(timeout_s + self.timeout, connect=CONNECT_TIMEOUT_S),
        )
        return _decode(response, RunItem)

    def wait(self, run_id: str, timeout_s: float | None = None) -> RunItem:
        """Repeat the long poll until the run ended or `timeout_s` passed (None: no limit).

        Once the service answered, a lost connection or a service that answers 502, 503 or 504
        (it restarts) is retried with a backoff of 1 s doubling to 10 s (relocating first, see
        `relocated`) until the timeout, which then returns the last summary. A service that never
        answered raises at once unless `relocate` finds it elsewhere: a wrong URL is said at
        once rather than after the timeout. The summary returned is not ended when the timeout
        passed.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delays = backoff_delays()
        last: RunItem | None = None
        while True:
            remaining = WAIT_POLL_MAX_S if deadline is None else deadline - time.monotonic()
            try:
                last = self.wait_once(run_id, max(0.0, min(WAIT_POLL_MAX_S, remaining)))
                delays = backoff_delays()
            except (ServiceUnreachable, ServiceError) as error:
                if not transient(error):
                    raise
                if last is None and not self.relocated():
                    raise
                if last is None:
                    continue
                if not self._pause(delays, deadline):
                    return last
                continue
            if last.state.ended or (deadline is not None and time.monotonic() >= deadline):
                return last

    def cancel(self, run_id: str) -> RunView:
        """`POST /runs/{run}/cancel`: cancel a run; its view once the cancel is recorded."""
        return _decode(self.request("POST", run_path(run_id, "/cancel")), RunView)

    def progress(self, run_id: str) -> ProgressView:
        """`GET /runs/{run}/progress`: the state, units and first and last unit of every task."""
        return _decode(self.request("GET", run_path(run_id, "/progress")), ProgressView)

    def compare(self, run_ids: list[str]) -> CompareTable:
        """`POST /compare`: the provenance and the task summaries of runs, a row each."""
        request = CompareRequest(runs=[check_id(run_id) for run_id in run_ids])
        return _decode(self._post_json("/compare", request), CompareTable)

    def cleanup(self, request: CleanupRequest) -> CleanupResult:
        """`POST /cleanup`: remove ended runs and the snapshots nothing refers to (or list them)."""
        return _decode(self._post_json("/cleanup", request), CleanupResult)

    def delete(self, run_id: str) -> CleanupResult:
        """`DELETE /runs/{run}`: remove an ended run and the snapshots only it referred to."""
        return _decode(self.request("DELETE", run_path(run_id)), CleanupResult)

    def snapshot_missing(self, name: str, files: list[FileEntry]) -> list[str]:
        """`POST /snapshots/{name}/missing`: the paths of the regular files of a scan whose
        content the latest snapshot of the source lacks, the files `upload_snapshot` sends.
        ServiceError 422 for a name or a file list the service refuses (the path named)."""
        path = f"/snapshots/{segment(name)}/missing"
        return _decode(self._post_json(path, MissingAsked(files=files)), MissingFound).missing

    def upload_snapshot(
        self, name: str, scan: Scan, tar: bytes | IO[bytes] | Path
    ) -> SourceProvenance:
        """`POST /snapshots/{name}`: write a snapshot from a scan and a tar of the files
        `snapshot_missing` named (bytes, an open binary file read from its start, or the path
        of one), sent as multipart/form-data and streamed from the file; the provenance of the
        snapshot, its paths relative to the store.

        ServiceError 409 when the latest snapshot lost a content since `snapshot_missing` was
        asked (ask it again and send what it names), 422 naming every refused path or member,
        413 above the service's `max_upload_bytes`.
        """
        with contextlib.ExitStack() as stack:
            content: bytes | IO[bytes] = (
                stack.enter_context(tar.open("rb")) if isinstance(tar, Path) else tar
            )
            files = {
                "scan": (None, msgspec.json.encode(scan), "application/json"),
                "files": ("files.tar", content, "application/x-tar"),
            }
            response = self.request(
                "POST",
                f"/snapshots/{segment(name)}",
                files=files,
                timeout=httpx.Timeout(self.timeout, connect=CONNECT_TIMEOUT_S, read=UPLOAD_READ_S),
            )
        return _decode(response, SourceProvenance)

    def usage(self) -> Usage:
        """`GET /usage`: the bytes of the store per run and per group."""
        return _decode(self.request("GET", "/usage"), Usage)

    def servers(self) -> list[ServerUsage]:
        """`GET /servers`: the servers with their cores, memory and the pods of runs on them."""
        return _decode(self.request("GET", "/servers"), list[ServerUsage])

    def workers(self, run_id: str, task_id: str) -> list[WorkerView]:
        """`GET /runs/{run}/tasks/{task}/workers`: the workers of a task and what they did."""
        path = run_path(run_id, f"/tasks/{task_segment(task_id)}/workers")
        return _decode(self.request("GET", path), list[WorkerView])

    def updates(self, timeout_s: float | None = None) -> Iterator[Update]:
        """The runs and the servers as `GET /events` sends them, until `timeout_s` (None: ever).

        The stream sends `runs` (a list of RunItem) and `servers` (a list of ServerUsage)
        whenever one changed; each comes as `RunsUpdate` or `ServersUpdate`, messages of other
        names are skipped. A dropped stream is opened again after a backoff of 1 s doubling to
        10 s while nothing arrives.
        """
        for message in self._messages("/events", timeout_s, dict):
            update = _update_of(message.event, message.data)
            if update is not None:
                yield update

    def history(
        self,
        run_id: str,
        types: Sequence[str] = (),
        task: str | None = None,
        tail: int | None = None,
    ) -> list[dict[str, Any]]:
        """`GET /runs/{run}/history`: the events of a run as JSON objects, in seq order; only
        those of `types` (none: all) and of `task`, the last `tail` of them (None: all)."""
        params: dict[str, Any] = {}
        if types:
            params["type"] = list(types)
        if task is not None:
            params["task"] = task
        if tail is not None:
            params["tail"] = tail
        response = self.request("GET", run_path(run_id, "/history"), params=params)
        return _decode(response, list[dict[str, Any]])

    def logs(self, run_id: str, task_id: str, tail_lines: int = 300) -> str:
        """`GET /runs/{run}/logs/{task}`: the last `tail_lines` lines of each pod (0: all)."""
        path = run_path(run_id, f"/logs/{task_segment(task_id)}")
        return self.request("GET", path, params={"tail_lines": tail_lines}).text

    def outputs(
        self, run_id: str, task_id: str, glob: str | None = None, limit: int = OUTPUTS_LIMIT
    ) -> OutputListing:
        """`GET /runs/{run}/outputs/{task}`: the output files, the results first, paths relative
        to the store; those matching `glob`, at most `limit` (0 for all) and how many more."""
        path = run_path(run_id, f"/outputs/{task_segment(task_id)}")
        params: dict[str, str | int] = {"limit": limit}
        if glob is not None:
            params["glob"] = glob
        return _decode(self.request("GET", path, params=params), OutputListing)

    def download(self, run_id: str, task_id: str, path: str, write: Callable[[bytes], Any]) -> int:
        """`GET /runs/{run}/outputs/{task}/{path}`: stream a file into `write`; its bytes."""
        url = run_path(run_id, f"/outputs/{task_segment(task_id)}/{quote(path, safe='/')}")
        written = 0
        try:
            with self._http.stream("GET", url) as response:
                _raise_for_refusal(response)
                for chunk in response.iter_bytes():
                    write(chunk)
                    written += len(chunk)
        except httpx.TransportError as error:
            raise ServiceUnreachable(self.base_url, _reason(error)) from None
        return written

    @contextlib.contextmanager
    def output_archive(
        self, run_id: str, task_id: str, glob: str | None = None
    ) -> Iterator[Iterator[bytes]]:
        """`GET /runs/{run}/tasks/{task}/outputs.tar`: the chunks of the tar of the output files
        of a task (those matching `glob`), as they arrive, while the context is open. A
        connection lost meanwhile raises ServiceUnreachable, also while the chunks are read."""
        path = run_path(run_id, f"/tasks/{task_segment(task_id)}/outputs.tar")
        params = {} if glob is None else {"glob": glob}
        try:
            with self._http.stream("GET", path, params=params) as response:
                _raise_for_refusal(response)
                yield self._chunks(response)
        except httpx.TransportError as error:
            raise ServiceUnreachable(self.base_url, _reason(error)) from None

    def _chunks(self, response: httpx.Response) -> Iterator[bytes]:
        """The chunks of the body of a response; ServiceUnreachable for a lost connection."""
        try:
            yield from response.iter_bytes()
        except httpx.TransportError as error:
            raise ServiceUnreachable(self.base_url, _reason(error)) from None

    def follow(
        self, run_id: str, after: int = 0, timeout_s: float | None = None
    ) -> Iterator[Event]:
        """The events of a run after seq `after`, from `GET /runs/{run}/events`, until its end.

        Each SSE message carries an event: `event:` its type, `id:` its seq, `data:` its JSON.
        The stream ends after the terminal event (`succeeded`, `failed`, `cancelled`). A dropped
        or ended stream is opened again with `Last-Event-ID` of the last seq seen, after a
        backoff of 1 s doubling to 10 s while no event arrives. An event of a type this version
        does not know comes as `simrun_core.events.UnknownEvent`, so a fold sees no gap. The
        iteration stops without the terminal event once `timeout_s` passed. A log the service
        cannot read (a message `error`, or a 500) raises ServiceError with its detail.
        """
        path = run_path(run_id, "/events")
        last = [after]  # the seq of the last event, read again when the stream is reopened
        for message in self._messages(path, timeout_s, lambda: {"Last-Event-ID": str(last[0])}):
            if message.event == "error":
                raise ServiceError(500, _detail(message.data))
            event = _event_of(message.data, message.id)
            if event is None or event.seq <= last[0]:
                continue
            last[0] = event.seq
            yield event
            if isinstance(event, TERMINAL_EVENTS):
                return

    def _messages(
        self, path: str, timeout_s: float | None, headers: Callable[[], dict[str, str]]
    ) -> Iterator[ServerSentEvent]:
        """The messages of an SSE route until `timeout_s` (None: ever), across reconnects.

        A dropped or ended stream, or a restarting service, is opened again (with the headers
        of that moment) after a backoff of 1 s doubling to 10 s while no message arrives.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delays = backoff_delays()
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            read_s = STREAM_READ_S if remaining is None else min(STREAM_READ_S, remaining)
            progressed = False
            try:
                with connect_sse(
                    self._http,
                    "GET",
                    path,
                    headers=headers(),
                    timeout=httpx.Timeout(self.timeout, connect=CONNECT_TIMEOUT_S, read=read_s),
                ) as source:
                    if source.response.status_code in TRANSIENT_STATUSES:
                        raise _Restarting
                    _raise_for_refusal(source.response)
                    for message in source.iter_sse():
                        progressed = True
                        delays = backoff_delays()
                        yield message
                        if deadline is not None and time.monotonic() >= deadline:
                            return
            except httpx.ReadTimeout:
                continue
            except (httpx.TransportError, _Restarting):
                pass
            except SSEError as error:
                raise ServiceError(200, f"{path} is no event stream: {error}") from None
            if not progressed and not self._pause(delays, deadline):
                return

    # the transport

    def _post_json(self, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        """POST `body` as JSON (`kwargs` as of `request`, e.g. a timeout)."""
        content = msgspec.json.encode(body)
        return self.request(
            "POST", path, content=content, headers={"Content-Type": "application/json"}, **kwargs
        )

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Send a request; ServiceError for a refusal, ServiceUnreachable without an answer."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise ServiceUnreachable(self.base_url, _reason(error)) from None
        _raise_for_refusal(response)
        return response


class RunsUpdate(msgspec.Struct, frozen=True):
    """A message `runs` of `GET /events`: the runs as the list shows them."""

    runs: list[RunItem]


class ServersUpdate(msgspec.Struct, frozen=True):
    """A message `servers` of `GET /events`: every server and the pods on it."""

    servers: list[ServerUsage]


Update = RunsUpdate | ServersUpdate


def _update_of(name: str, data: str) -> Update | None:
    """The update of a message of `GET /events`; None for another name or a keep-alive."""
    kinds: dict[str, Any] = {"runs": list[RunItem], "servers": list[ServerUsage]}
    if name not in kinds or not data.strip():
        return None
    try:
        value = msgspec.json.decode(data, type=kinds[name])
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        message = f"the message {name!r} of /events is not the expected JSON: {error}"
        raise ServiceError(200, message) from None
    return RunsUpdate(value) if name == "runs" else ServersUpdate(value)


class _Restarting(Exception):
    """A stream answered 502, 503 or 504: opened again like a dropped one."""


def _seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"


def _reason(error: httpx.TransportError) -> str:
    text = str(error) or type(error).__name__
    return f"{type(error).__name__}: {text}" if text != type(error).__name__ else text


def _raise_for_refusal(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    detail = _detail(response.read()) or response.reason_phrase
    raise ServiceError(response.status_code, detail)


def _decode(response: httpx.Response, kind: Any) -> Any:
    return _decode_body(response.content, kind, response.request.url.path)


def _decode_body(body: bytes, kind: Any, where: str) -> Any:
    try:
        return msgspec.json.decode(body, type=kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        message = f"the answer of {where} is not the expected JSON: {error}"
        raise ServiceError(200, message) from None


def _detail(body: bytes | str) -> str:
    """What a refusal says: the `detail` of its ErrorDetail (as a 4xx/5xx answer or a stream's
    message `error` carries it), else its text."""
    try:
        return msgspec.json.decode(body, type=ErrorDetail).detail
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        return text.strip()


def _event_of(data: str, sse_id: str) -> Event | None:
    """The event of an SSE message; None for a message without data, e.g. a keep-alive."""
    if not data.strip():
        return None
    try:
        return decode_event(data)
    except EventDecodeError as error:
        raise ServiceError(200, f"message {sse_id!r} of the stream is no event: {error}") from None
