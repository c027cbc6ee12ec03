"""The routes that follow runs while they run: the event streams, the servers, the workers, the
logs and the outputs of a task (listed, one by one, or as one tar)."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
import tarfile
import weakref
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import PurePosixPath
from typing import Annotated, Any, BinaryIO
from urllib.parse import quote

import anyio
from litestar import MediaType, Request, get
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import State
from litestar.exceptions import ClientException, NotFoundException
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, FromQuery, HeaderParameter, QueryParameter
from litestar.response import ServerSentEvent, Stream

from simrun_api import logs, streams
from simrun_api.beneath import open_beneath
from simrun_api.event_response import EventStream
from simrun_api.routes.common import (
    CORRUPT_LOG,
    SHOW_500,
    corrupt_log,
    paths_of,
    refusals,
    service_of,
    task_of,
)
from simrun_api.server import CONNECTION_EXTENSION
from simrun_api.workers import claims_by_worker, worker_views
from simrun_core.outputs import GLOB_MAX_CHARS, OUTPUTS_LIMIT, matches, select_outputs
from simrun_core.states import RunState
from simrun_core.store import LogCorrupt, RunPaths, iter_log, output_below_out, output_path
from simrun_core.store_layout import OUT, TASKS
from simrun_core.wire import Identity, OutputFile, OutputListing, ServerUsage, WorkerView

CHUNK = 1024**2
TAR_BLOCK = 512


def _task_dir(paths: RunPaths, task: str, name: str) -> int | None:
    """The descriptor of `tasks/<task>/<name>` of a run, None when it does not exist;
    NotFoundException when it, or a directory on the way, is a link."""
    try:
        return open_beneath(paths.dir, (TASKS, task, name), is_dir=True)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise NotFoundException(
                f"task {task!r} of run {paths.run_id!r}: {name}/ is a link or no directory; "
                "links are not followed"
            ) from None
        raise


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
            "the event as the log holds it (see `/runs/{run}/history`), its `id` its `seq`; "
            "with `views`, also `run` (the `RunView`), `progress` (the `ProgressView`) and "
            "`workers` (the `WorkerView`s of every task by task id), each on connect and when "
            "it changed, `id` the `seq` they are folded up to"
        ),
        **refusals(404, 429),
        **CORRUPT_LOG,
    },
    exception_handlers=SHOW_500,
)
async def run_events(
    request: Request[Identity, str, State],
    run: FromPath[str],
    last_event_id: Annotated[int | None, HeaderParameter(name="Last-Event-ID", ge=0)] = None,
    views: FromQuery[bool] = False,
) -> ServerSentEvent | EventStream:
    """Server-sent events: every event of the run, `id` its `seq`, from after `Last-Event-ID`;
    with `views` also the run (`run`), its progress (`progress`) and the workers of its tasks
    (`workers`) as the public views have them, on connect and whenever one changed.

    The stream ends after the run's last event, or after `events_max_s` (reconnect then);
    a client more than `stream_queue_bytes` behind the run is closed (reconnect with
    `Last-Event-ID`: nothing is lost). An identity has at most `max_streams_per_identity`
    streams open (429 beyond). A log whose first chunk cannot be read answers 500 naming the
    file and the line; a line that cannot be read later ends the stream with a message
    `error`, its data as the detail of a 500.
    """
    service = service_of(request.app.state)
    paths = paths_of(service, run)
    try:
        first = streams.read_chunk(paths, events=views)
    except FileNotFoundError:
        raise NotFoundException(f"run {run!r} does not exist") from None
    except LogCorrupt as error:
        raise corrupt_log(run, error) from None
    release = service.streams.open(request.user, service.settings.max_streams_per_identity)
    connection = _connection(request)
    messages = streams.run_events(
        service, paths, last_event_id or 0, first, views, connection=connection, release=release
    )
    return ServerSentEvent(messages) if connection is None else EventStream(messages)


def _connection(request: Request[Identity, str, State]) -> streams.Connection | None:
    """The request's connection as the server hands it (`simrun_api.server`), if it does."""
    extensions: dict[str, Any] = request.scope.get("extensions") or {}
    connection: streams.Connection | None = extensions.get(CONNECTION_EXTENSION)
    return connection


@get(
    "/events",
    summary="Follow the runs and the servers (SSE)",
    responses={
        200: _event_stream(
            "Server-sent events: `runs`, the list of `RunItem` (as `GET /runs` with the same "
            "filters), and `servers`, the list of `ServerUsage` (as `GET /servers`); each on "
            "connect and whenever it changed"
        ),
        **refusals(429),
    },
)
async def service_events(
    request: Request[Identity, str, State],
    group: FromQuery[str | None] = None,
    owner: FromQuery[str | None] = None,
    agent: FromQuery[str | None] = None,
    run_state: Annotated[RunState | None, QueryParameter(name="state")] = None,
) -> ServerSentEvent:
    """Server-sent events `runs` and `servers`, each when it changed; filtered as `GET /runs`.

    The stream ends after `events_max_s` (reconnect then); a client more than
    `stream_queue_bytes` behind is closed. An identity has at most `max_streams_per_identity`
    streams open (429 beyond).
    """
    service = service_of(request.app.state)
    release = service.streams.open(request.user, service.settings.max_streams_per_identity)
    messages = streams.service_events(
        service, group, owner, agent, run_state, _connection(request), release
    )
    return ServerSentEvent(messages)


@get("/servers", summary="The servers and the pods of runs on them", responses=refusals())
async def servers(state: State) -> list[ServerUsage]:
    """The servers with the cores and memory the pods of runs may have, their reservation and
    the pods of runs on them with their requests; locally this machine and its processes."""
    return await service_of(state).backend.servers()


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


TASK_LOGS_DESCRIPTION = f"""The logs of the processes of a task, oldest first, the last
`tail_lines` (0 all) of each: the kept logs once the task is final (`logs-kept`), else those of
its live processes.

An answer holds at most {logs.LOG_ANSWER_MAX_BYTES:,} bytes of the logs, the newest: they are
read from their end, the last log first, up to that bound. A log cut so (a line longer than the
bound, or a log asked whole) is shown from where the bound stopped the reading, after a line
`[simrun: the first N bytes of this log are left out: ...]`; a log before it that got none of
the bound is that line alone."""


@get(
    "/runs/{run:str}/logs/{task:str}",
    summary="The logs of a task",
    description=TASK_LOGS_DESCRIPTION,
    media_type=MediaType.TEXT,
    responses=refusals(404),
)
async def task_logs(
    state: State,
    run: FromPath[str],
    task: FromPath[str],
    tail_lines: Annotated[
        int, QueryParameter(ge=0, description="The last lines of each log, 0 for all")
    ] = 300,
) -> str:
    """The logs of a task, at most `LOG_ANSWER_MAX_BYTES` (`TASK_LOGS_DESCRIPTION`)."""
    service = service_of(state)
    record, paths = task_of(service, run, task)
    directory = paths.logs(task)

    def read() -> str:
        fd = _task_dir(paths, task, "logs")
        if fd is None:
            return ""
        try:
            pods = logs.kept_pods(directory) if task in record.logs_kept else None
            if pods is None:
                pods = logs.live_pods(directory)
            return logs.render(directory, [pod for pod in pods if _plain_log(fd, pod)], tail_lines)
        finally:
            os.close(fd)

    return await asyncio.to_thread(read)


def _plain_log(directory: int, pod: str) -> bool:
    """Whether the log of a pod is a regular file (or missing), not a link or another file."""
    try:
        mode = os.stat(f"{pod}.log", dir_fd=directory, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return True
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(mode)


OutputGlob = Annotated[
    str | None,
    QueryParameter(
        description="Only the files whose path below the task's `out/` matches this pattern "
        f"(`*` also crosses `/`), e.g. `summary*` or `squares/1*.json`; at most "
        f"{GLOB_MAX_CHARS} characters",
        max_length=GLOB_MAX_CHARS,
    ),
]


@get(
    "/runs/{run:str}/outputs/{task:str}",
    summary="The output files of a task, the results first",
    responses=refusals(404),
)
async def task_outputs(
    state: State,
    run: FromPath[str],
    task: FromPath[str],
    glob: OutputGlob = None,
    limit: Annotated[
        int, QueryParameter(ge=0, description="The most files to list, 0 for all")
    ] = OUTPUTS_LIMIT,
) -> OutputListing:
    """The files below the task's `out/`, the results first: `summary.json`, then the files of
    the directories with the fewest files (what the merge wrote), then the crowded ones (the
    units); at most `limit` of those matching `glob`, with `left_out`, how many more match.
    Paths are relative to the store (`runs/<run>/tasks/<task>/out/...`): a client that mounts
    the store opens one as `store / path`, and `GET /runs/{run}/outputs/{task}/{path}` takes
    the path as listed."""
    service = service_of(state)
    _, paths = task_of(service, run, task)
    return await asyncio.to_thread(_list_outputs, paths, task, glob, limit)


def _list_outputs(paths: RunPaths, task: str, glob: str | None, limit: int) -> OutputListing:
    """The regular files below `out/`, hidden ones aside, as `select_outputs` picks them, paths
    relative to the store; links are neither listed nor followed, and an `out/` that is a link
    is refused."""
    fd = _task_dir(paths, task, "out")
    if fd is None:
        return OutputListing(files=[], left_out=0)
    try:
        sizes = {path: size for path, _, _, size in _output_files(fd)}
    finally:
        os.close(fd)
    shown, left_out = select_outputs(list(sizes), glob, limit)
    files = [
        OutputFile(path=output_path(paths.run_id, task, path), bytes=sizes[path]) for path in shown
    ]
    return OutputListing(files=files, left_out=left_out)


def _output_files(fd: int) -> Iterator[tuple[str, int, str, int]]:
    """The regular files below the directory `fd`, hidden ones aside, in the order of their
    paths per directory: each its path relative to `fd`, the descriptor of its directory, its
    name there and its size. No link is followed (`os.fwalk` descends into no link)."""
    for root, directories, names, root_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
        directories.sort()
        for name in sorted(names):
            if name.startswith("."):
                continue
            try:
                info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                yield os.path.normpath(os.path.join(root, name)), root_fd, name, info.st_size


@get(
    "/runs/{run:str}/tasks/{task:str}/outputs.tar",
    summary="The output files of a task as one tar",
    responses={
        200: ResponseSpec(
            bytes,
            description="A tar of the output files (those matching `glob`), streamed",
            media_type="application/x-tar",
            generate_examples=False,
        ),
        **refusals(404),
    },
)
async def task_outputs_archive(
    state: State, run: FromPath[str], task: FromPath[str], glob: OutputGlob = None
) -> Stream:
    """The regular files below the task's `out/` (hidden ones aside) as one tar, paths relative
    to `out/`, streamed as they are read: what one request per file would fetch; with `glob`
    only those whose path below `out/` matches it, as the listing matches them. Links are
    neither followed nor archived; an `out/` that is a link is refused. A file that shrinks
    while it is sent ends the stream within it, so a client never takes a cut file for whole."""
    service = service_of(state)
    _, paths = task_of(service, run, task)
    fd = await asyncio.to_thread(_task_dir, paths, task, "out")
    chunks = _archive(None if fd is None else _Descriptor(fd), glob)
    name = quote(f"{run}-{task}.tar")
    return Stream(
        _in_threads(chunks),
        media_type="application/x-tar",
        headers={"content-disposition": f"attachment; filename*=utf-8''{name}"},
        background=BackgroundTask(chunks.close),  # a response dropped between two chunks
    )


async def _in_threads(chunks: Generator[bytes, None, None]) -> AsyncIterator[bytes]:
    """The chunks of a generator, each read in a thread; the generator is closed at its end
    and when the stream is cancelled (the client went away)."""
    try:
        while (chunk := await anyio.to_thread.run_sync(next, chunks, None)) is not None:
            yield chunk
    finally:
        chunks.close()


class _Descriptor:
    """A descriptor that is closed once: by `close`, or when it is collected (a response that
    is dropped before its stream began)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.close = weakref.finalize(self, os.close, fd)


def _archive(
    directory: _Descriptor | None, glob: str | None = None
) -> Generator[bytes, None, None]:
    """The tar of the output files below `directory` (None: an empty tar) that match `glob`, in
    chunks of about CHUNK bytes; `directory` is closed at the end, or with the dropped response."""
    buffer = bytearray()
    try:
        for path, root, name, _ in () if directory is None else _output_files(directory.fd):
            if not matches(path, glob):
                continue
            try:
                file_fd = os.open(
                    name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=root
                )
            except OSError:  # gone, or swapped for a link, since it was listed
                continue
            with os.fdopen(file_fd, "rb") as file:
                info = os.fstat(file_fd)
                if not stat.S_ISREG(info.st_mode):
                    continue
                os.set_blocking(file_fd, True)
                member = tarfile.TarInfo(path)
                member.size = info.st_size
                member.mtime = int(info.st_mtime)
                member.mode = stat.S_IMODE(info.st_mode)
                buffer += member.tobuf(format=tarfile.PAX_FORMAT)
                left = info.st_size
                while left > 0:
                    chunk = file.read(min(CHUNK, left))
                    if not chunk:  # it shrank: the archive ends cut, as a reader of it sees
                        yield bytes(buffer)
                        return
                    buffer += chunk
                    left -= len(chunk)
                    if len(buffer) >= CHUNK:
                        yield bytes(buffer)
                        buffer.clear()
                buffer += bytes(-info.st_size % TAR_BLOCK)
        buffer += bytes(2 * TAR_BLOCK)  # the end of the archive
        yield bytes(buffer)
    finally:
        if directory is not None:
            directory.close()


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
) -> Stream:
    """The content of one output file, its path relative to the task's `out/` or, as
    `GET /runs/{run}/outputs/{task}` lists it, to the store (`runs/<run>/tasks/<task>/out/...`);
    paths out of the task's `out/` are refused."""
    # A path with `..`, an absolute path or a NUL: 400. A link, at the file or on the way to
    # it, is not followed, and what is no regular file (a FIFO) is not opened for reading: 404.
    service = service_of(state)
    _, paths = task_of(service, run, task)
    relative = path[1:] if path.startswith("/") else path
    relative = output_below_out(run, task, relative) or relative
    parts = PurePosixPath(relative).parts
    if "\0" in relative or relative.startswith("/") or ".." in parts or not parts:
        raise ClientException(
            f"output path {relative!r} is not a relative path inside the outputs of {task!r}"
        )
    missing = f"task {task!r} of run {run!r} has no output {relative!r}"
    try:
        fd = await asyncio.to_thread(
            open_beneath, paths.dir, (TASKS, task, OUT, *parts), is_dir=False
        )
    except OSError as error:
        if error.errno == errno.ELOOP:
            missing += " (a link: links are not followed)"
        raise NotFoundException(missing) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotFoundException(missing + " (not a regular file)")
    os.set_blocking(fd, True)
    # A file object at once: its descriptor is closed with it even if the stream never starts.
    file = os.fdopen(fd, "rb")
    chunks = _chunks(file, info.st_size)
    return Stream(
        _in_threads(chunks),
        media_type="application/octet-stream",
        headers={
            "content-length": str(info.st_size),
            "content-disposition": f"attachment; filename*=utf-8''{quote(parts[-1])}",
        },
        background=BackgroundTask(chunks.close),  # a response dropped between two chunks
    )


def _chunks(file: BinaryIO, size: int) -> Iterator[bytes]:
    """The first `size` bytes of an open file (its size when opened, as the response says);
    the file is closed at the end, or with the dropped response."""
    with file:
        while size > 0 and (chunk := file.read(min(CHUNK, size))):
            size -= len(chunk)
            yield chunk
