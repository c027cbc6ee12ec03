"""`simrun edit WORKFLOW`: the machine of the working trees behind the Editor of the web app.

The command reads the workflow file (a file that does not exist is a new workflow named by its
stem, without tasks), records its sources as `submit` does (`simrun_cli.snapshots`), opens an
edit session in the service (`simrun_core.edits`) and prints the link of the Editor. Then it
serves the session until Ctrl-C or SIGTERM:

- it long-polls the requests of the browser and carries out each once (a request that comes
  again, because its answer was lost, gets the same answer again): a **save** writes the draft
  into the file atomically, in the form `simrun` writes a workflow, unless the file changed on
  disk since the draft started from it (then the answer is a conflict with what is on disk; a
  save `force`d writes anyway); a **run** records the sources again and submits the draft
  through `simrun_cli.request.Submission`, the code of `simrun submit`; the file is not written;
- a thread reads the file and the git state of the trees every `WATCH_S` seconds and sends
  them when they changed, and at least every `ALIVE_S` seconds as a sign of life (also while a
  run is submitted, which may take long);
- a service that cannot be reached, a proxy answering 502, 503 or 504, and the 500 of a long
  poll a stopping service cut off are retried with a backoff of 1 s doubling to 10 s; a session
  the service no longer knows is opened again.

Ctrl-C closes the session (waiting `CLOSE_S` at most for the service) and ends with 0; a second
Ctrl-C ends at once. The browser never reads or writes this machine: the command does.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import httpx
import msgspec
import yaml

from simrun_cli.client import (
    CONNECT_TIMEOUT_S,
    Client,
    ServiceError,
    ServiceUnreachable,
    backoff_delays,
    segment,
    transient,
)
from simrun_cli.formats import format_count
from simrun_cli.provenance import SourceError, git_state
from simrun_cli.snapshots import SourcePolicy, record_sources
from simrun_core.edits import (
    DiskState,
    EditRequest,
    EditResult,
    EditSession,
    EditState,
    OpenEdit,
    TreeState,
    file_version,
)
from simrun_core.errors import WorkflowError
from simrun_core.provenance import SourceProvenance
from simrun_core.workflow import Workflow, decode_workflow, parse_workflow, workflow_yaml

WATCH_S = 2.0
ALIVE_S = 10.0
POLL_S = 20.0
CLOSE_S = 5.0
KEPT_RESULTS = 200
"""The answers the command remembers, to answer a request that comes again the same."""
NOT_FOUND = 404
INTERNAL_ERROR = 500
CONFLICT = 409
UNPROCESSABLE = 422

T = TypeVar("T")


class EditClient:
    """The routes of an edit session, through a `Client` (its token, retries and relocation)."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def _json(self, method: str, path: str, body: Any = None, read_s: float | None = None) -> bytes:
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["content"] = msgspec.json.encode(body)
            kwargs["headers"] = {"Content-Type": "application/json"}
        if read_s is not None:
            kwargs["timeout"] = httpx.Timeout(read_s, connect=CONNECT_TIMEOUT_S)
        return self.client.request(method, path, **kwargs).content

    def open_edit(self, body: OpenEdit) -> EditSession:
        """`POST /edits`: open a session for the workflow file of this machine."""
        return msgspec.json.decode(self._json("POST", "/edits", body), type=EditSession)

    def edit_state(self, session_id: str, state: EditState) -> EditSession:
        """`POST /edits/{session}/state`: what was read from disk."""
        path = f"/edits/{segment(session_id)}/state"
        return msgspec.json.decode(self._json("POST", path, state), type=EditSession)

    def edit_requests(self, session_id: str, timeout: float) -> list[EditRequest]:
        """`GET /edits/{session}/requests`: a long poll of the requests of the browser."""
        path = f"/edits/{segment(session_id)}/requests?timeout={timeout:g}"
        body = self._json("GET", path, read_s=timeout + self.client.timeout)
        return msgspec.json.decode(body, type=list[EditRequest])

    def edit_result(self, session_id: str, request_id: str, result: EditResult) -> None:
        """`POST /edits/{session}/requests/{request}/result`: answer a request."""
        path = f"/edits/{segment(session_id)}/requests/{segment(request_id)}/result"
        self._json("POST", path, result)

    def close_edit(self, session_id: str, timeout: float = 60.0) -> None:
        """`POST /edits/{session}/close`: the command stopped; waits up to `timeout` s."""
        self._json("POST", f"/edits/{segment(session_id)}/close", read_s=timeout)


def read_disk(path: Path) -> DiskState:
    """The workflow file as it is on disk: its version, the workflow it holds (a missing file is
    a new workflow named by the stem, without tasks) and its problems as a workflow."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return DiskState(version=None, workflow=Workflow(name=path.stem, tasks=[]))
    except OSError as error:
        problem = f"cannot be read: {error.strerror}"
        return DiskState(version=None, workflow=None, problems=[problem])
    version = file_version(data)
    try:
        return DiskState(version=version, workflow=parse_workflow(data))
    except WorkflowError as error:
        problems = [problem.text() for problem in error.problems]
    workflow: Workflow | None = None
    with contextlib.suppress(Exception):  # a workflow with problems still shows in the Editor
        workflow, _ = decode_workflow(yaml.safe_load(data))
    return DiskState(version=version, workflow=workflow, problems=problems)


def tree_states(sources: list[tuple[str, Path]]) -> list[TreeState]:
    """The git state of the working tree of every source, the model first."""
    states: list[TreeState] = []
    for name, path in sources:
        try:
            state = git_state(name, path)
        except SourceError as error:
            states.append(TreeState(name=name, path=str(path), error=str(error)))
            continue
        states.append(
            TreeState(
                name=name,
                path=str(state.path),
                branch=state.branch,
                commit=state.commit,
                changed=state.changed_files,
            )
        )
    return states


def write_file(path: Path, text: str) -> None:
    """Write a file atomically (a temporary file beside it, then a rename), keeping its mode."""
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def passing(error: Exception) -> bool:
    """Whether an error of a call of the session may pass: no answer, a restarting service
    (502, 503, 504), or the 500 of a long poll the stopping service cut off."""
    if transient(error):
        return True
    return isinstance(error, ServiceError) and error.status == INTERNAL_ERROR


class Stopped(Exception):
    """The command was asked to stop while it retried."""


class EditCommand:
    """The session of one `simrun edit` (see the module)."""

    def __init__(
        self,
        path: Path,
        sources: list[tuple[str, Path]],
        policy: SourcePolicy,
        group: str | None,
        connect: Callable[[], Client],
        say: Callable[[str], None],
    ) -> None:
        self.path = path.expanduser().absolute()
        self.sources = sources
        self.policy = policy
        self.group = group
        self._connect = connect
        self.say = say
        self.client = connect()
        self.edits = EditClient(self.client)
        self.session: EditSession | None = None
        self.done: dict[str, EditResult] = {}
        self.stopping = threading.Event()
        self._sources: list[SourceProvenance] = []
        self._sent: tuple[DiskState, list[TreeState]] | None = None
        self._sent_at = 0.0
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    # the session

    def link(self) -> str:
        assert self.session is not None
        return f"{self.client.base_url}/ui/#/edit/{self.session.id}"

    def open(self) -> EditSession:
        """Record the sources, read the file and open the session; prints its link."""
        self._sources = record_sources(self.sources, self.policy, self.client)
        disk = read_disk(self.path)
        trees = tree_states(self.sources)
        body = OpenEdit(
            path=str(self.path),
            machine=socket.gethostname(),
            disk=disk,
            sources=self._sources,
            trees=trees,
            group=self.group,
        )
        if self.session is None:  # a service never reached is said at once
            self.session = self.edits.open_edit(body)
        else:
            self.session = self._retried(lambda: self.edits.open_edit(body))
        with self._lock:
            self._sent = (disk, trees)
            self._sent_at = time.monotonic()
        tasks = format_count(len(self.disk_tasks(disk)), "task")
        what = "a new workflow" if disk.version is None else tasks
        self.say(f"editing {self.path.name} ({what}) in the Editor:\n{self.link()}")
        return self.session

    @staticmethod
    def disk_tasks(disk: DiskState) -> list[Any]:
        return list(disk.workflow.tasks) if disk.workflow is not None else []

    def _retried(self, call: Callable[[], T]) -> T:
        """A call retried while the service cannot be reached or restarts (1 s doubling to
        10 s), relocating a local service first; Stopped when the command is stopping."""
        delays = backoff_delays()
        told = False
        while True:
            try:
                return call()
            except (ServiceUnreachable, ServiceError) as error:
                if not passing(error):
                    raise
                if not told:
                    what = str(error)
                    if isinstance(error, ServiceError) and error.status == INTERNAL_ERROR:
                        what = "the service cut off the wait for requests (it stops?)"
                    self.say(f"{what}: trying again")
                    told = True
            if self.stopping.wait(next(delays)):
                raise Stopped
            if self.client.relocated():
                self.say(f"the service moved, the Editor is now at:\n{self.link()}")

    def serve(self) -> None:
        """Answer the requests of the browser until stopped (KeyboardInterrupt)."""
        self._watcher = threading.Thread(target=self._watch, name="simrun-edit-watch", daemon=True)
        self._watcher.start()
        while not self.stopping.is_set():
            assert self.session is not None
            session_id = self.session.id
            try:
                requests = self._retried(functools.partial(self._poll, session_id))
            except ServiceError as error:
                if error.status not in (NOT_FOUND, CONFLICT):
                    raise
                self.say(f"the service lost the edit session ({error.detail}): opening another")
                self.open()
                continue
            for request in requests:
                result = self.done.get(request.id)
                if result is None:
                    result = self.carry_out(request)
                    self.done[request.id] = result
                    while len(self.done) > KEPT_RESULTS:
                        del self.done[next(iter(self.done))]
                self._answer(session_id, request.id, result)

    def _poll(self, session_id: str) -> list[EditRequest]:
        return self.edits.edit_requests(session_id, POLL_S)

    def _answer(self, session_id: str, request_id: str, result: EditResult) -> None:
        try:
            self._retried(lambda: self.edits.edit_result(session_id, request_id, result))
        except ServiceError as error:  # the session is gone: the browser waits no more
            self.say(f"the answer to a request was not taken: {error.detail}")

    def close(self) -> None:
        """Close the session, waiting `CLOSE_S` at most for the service."""
        self.stopping.set()
        if self.session is None:
            return
        try:
            self.edits.close_edit(self.session.id, timeout=CLOSE_S)
            self.say("closed the edit session")
        except (ServiceError, ServiceUnreachable) as error:
            self.say(f"the edit session was not closed ({error}): it shows not connected soon")

    # the watch of the file and the trees

    def _watch(self) -> None:
        """Send the file and the trees when they changed, and a sign of life every `ALIVE_S`."""
        client = self._connect()
        edits = EditClient(client)
        try:
            while not self.stopping.wait(WATCH_S):
                session = self.session
                if session is None:
                    continue
                disk = read_disk(self.path)
                trees = tree_states(self.sources)
                with self._lock:
                    changed = self._sent != (disk, trees)
                    due = time.monotonic() - self._sent_at >= ALIVE_S
                if not changed and not due:
                    continue
                try:
                    edits.edit_state(session.id, EditState(disk=disk, trees=trees))
                except (ServiceError, ServiceUnreachable) as error:
                    if passing(error):
                        client.relocated()  # a local service started again elsewhere
                    continue  # sent again at the next round
                with self._lock:
                    before, self._sent = self._sent, (disk, trees)
                    self._sent_at = time.monotonic()
                if before is not None and before[0].version != disk.version:
                    self.say(f"{self.path.name} changed on disk")
        finally:
            client.close()

    # the requests

    def carry_out(self, request: EditRequest) -> EditResult:
        """A save or a run, once; never raising for what the browser should be told."""
        try:
            if request.kind == "save":
                return self.save(request)
            return self.run(request)
        except WorkflowError as error:  # a draft no workflow file may hold
            errors = [problem.text() for problem in error.problems]
            self.say(f"refused a {request.kind}: {'; '.join(errors)}")
            return EditResult(
                outcome="refused", message="the workflow cannot be written", errors=errors
            )
        except (ServiceError, ServiceUnreachable, SourceError, OSError) as error:
            detail = error.detail if isinstance(error, ServiceError) else str(error)
            self.say(f"the {request.kind} failed: {detail}")
            return EditResult(outcome="failed", message=detail)

    def save(self, request: EditRequest) -> EditResult:
        """Write the draft into the file, unless it changed since the draft's `base`."""
        on_disk = read_disk(self.path)
        if on_disk.version != request.base and not request.force:
            self.say(f"refused a save: {self.path.name} changed on disk since the draft began")
            message = f"{self.path} changed on disk since the draft started from it"
            return EditResult(outcome="conflict", message=message, disk=on_disk)
        write_file(self.path, workflow_yaml(request.workflow))
        disk = read_disk(self.path)
        with self._lock:  # the watch takes this version for the one it sent
            if self._sent is not None:
                self._sent = (disk, self._sent[1])
        self.say(f"saved {self.path.name} ({format_count(len(request.workflow.tasks), 'task')})")
        return EditResult(outcome="saved", message=f"saved {self.path}", disk=disk)

    def run(self, request: EditRequest) -> EditResult:
        """Submit the draft with the sources recorded again, as `simrun submit` does."""
        from simrun_cli.request import Submission

        group = request.group if request.group is not None else self.group
        with tempfile.TemporaryDirectory(prefix="simrun-edit-") as tmp:
            draft = Path(tmp) / self.path.name
            draft.write_text(workflow_yaml(request.workflow))
            try:
                submission = Submission(draft, self.sources, self.policy, group)
                body = submission.request(self.client)
            except WorkflowError as error:
                return EditResult(
                    outcome="refused",
                    message="the workflow cannot run",
                    errors=[problem.text() for problem in error.problems],
                )
            try:
                run = self.client.submit(body)
            except ServiceError as error:
                if error.status != UNPROCESSABLE:
                    raise
                errors = error.detail.splitlines() or [error.detail]
                self.say(f"the service refused the run: {errors[0]}")
                return EditResult(
                    outcome="refused", message="the workflow cannot run", errors=errors
                )
        self._sources = list(body.sources)
        with contextlib.suppress(ServiceError, ServiceUnreachable):
            assert self.session is not None
            state = EditState(
                disk=read_disk(self.path), trees=tree_states(self.sources), sources=self._sources
            )
            self.edits.edit_state(self.session.id, state)
        self.say(f"run {run.id}: submitted")
        return EditResult(outcome="submitted", message=f"run {run.id}: submitted", run=run.id)


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does, meanwhile."""

    def interrupt(number: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def edit(command: EditCommand) -> int:
    """Open the session and serve it until Ctrl-C or SIGTERM (0); a second one ends at once."""
    with terminate_as_interrupt():
        with contextlib.suppress(KeyboardInterrupt, Stopped):
            command.open()
            command.serve()
        command.close()
    return 0


def clock() -> str:
    return datetime.now().strftime("%H:%M:%S")


def printer(text: str) -> None:
    """Print what the command says after the time; a line after its first (the link of the
    Editor) stands alone, to be clicked or copied whole."""
    print(f"{clock()} {text}", flush=True)
