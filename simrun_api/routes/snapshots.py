"""The routes of snapshots: which contents the store lacks, and the upload of a snapshot.

A client without the store mounted asks `POST /snapshots/{name}/missing` with the files of its
scan, then sends `POST /snapshots/{name}`, a multipart/form-data body of two parts: `scan`, the
`simrun_core.snapshot.Scan` as JSON, and `files`, a tar (`application/x-tar`) of the regular
files `missing` named (an empty tar, an empty part or no part when it named none).

The upload is read as it arrives with the push parser of `multipart` (the parser litestar uses
itself): litestar's own form parsing would keep a part without a file name in memory whatever
its size and takes one limit for all routes. Here `scan` is kept in memory up to 64 MiB and
`files` is written to an unnamed temporary file in the service's temporary directory (`TMPDIR`,
else `/tmp`; gone with its descriptor, also when the service is killed), and the body is
refused with 413 as soon as it passes `max_upload_bytes`. `simrun_core.snapshot_store.upload`
then checks every member and writes the snapshot in a thread; a refusal leaves nothing in the
store.

Answers: 200 `MissingFound` / 201 `SourceProvenance`; 400 for a body that is not of the shape
(no JSON file list, no multipart body, a part other than `scan` and `files`, a `scan` that
does not decode); 422 `{status_code, detail, errors}` for a name, a file list, a scan or members
of the tar that cannot become a snapshot, each error `field: what is wrong` naming the path;
409 when the latest snapshot lost a content since `missing` was asked (ask again); 413 above
64 MiB (`missing`) or `max_upload_bytes` (the upload).
"""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass
from typing import IO, Annotated, Any, Final

import msgspec
from litestar import Request, post
from litestar.datastructures import State, UploadFile
from litestar.di import Provide
from litestar.enums import RequestEncodingType
from litestar.exceptions import ClientException, InternalServerException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.openapi import ResponseSpec
from litestar.params import Body, FromPath, JSONBody
from litestar.status_codes import HTTP_201_CREATED
from multipart import (  # type: ignore[import-untyped]
    MultipartSegment,
    ParserError,
    ParserLimitReached,
    PushMultipartParser,
)

from simrun_api.routes.common import Conflict, WorkflowRefused, refusals, service_of
from simrun_api.routes.runs import InsufficientStorage, what_failed
from simrun_api.snapshots import path_limits
from simrun_core.errors import Problem, validation_problem
from simrun_core.file_list import FileListReader, FileListSyntax
from simrun_core.provenance import SourceProvenance
from simrun_core.snapshot import (
    FileEntry,
    MissingAsked,
    MissingContent,
    MissingFound,
    PathLimits,
    Scan,
    SnapshotError,
    check_name,
    check_scan,
)
from simrun_core.snapshot_store import UploadTooLarge
from simrun_core.wire import ErrorDetail, Identity, WorkflowRefusal

MISSING_MAX_BYTES: Final = 64 * 1024**2
"""The largest body of `POST /snapshots/{name}/missing`, and of the part `scan` of an upload."""
FEED_BYTES: Final = 256 * 1024
"""The bytes of a file list gathered before they are read (in a thread)."""
SPOOL_CHUNK: Final = 1024**2
"""The bytes of `files` gathered before one write to the spool (in a thread)."""
PARTS: Final = ("scan", "files")
EMPTY_TAR: Final = b"\0" * 1024
"""The end of a tar: what an empty or absent part `files` stands for."""


class SnapshotRefused(WorkflowRefused):
    """A name, a file list, a scan or an upload that cannot become a snapshot: 422 with every
    problem, in the shape of a refused workflow (`{status_code, detail, errors}`)."""


def _refused(field: str, error: SnapshotError) -> SnapshotRefused:
    return SnapshotRefused([Problem(str(error), field=field)])


def _scan_field(error: SnapshotError) -> str:
    """The field of the scan a refusal of `check_scan` is about."""
    message = str(error)
    if message.startswith("commit"):
        return "scan.commit"
    if message.startswith("directory"):
        return "scan.dirs"
    return "scan.files"


def _check_name(name: str) -> None:
    try:
        check_name(name)
    except SnapshotError as error:
        raise _refused("name", error) from None


REFUSED = ResponseSpec(
    WorkflowRefusal,
    description="The name, the file list, the scan or members of the tar cannot become a "
    "snapshot: every problem in `errors` (`field: what is wrong`, naming the path), one per "
    "line in `detail`; nothing was written",
    generate_examples=False,
)


def _too_large(what: str) -> ResponseSpec:
    return ResponseSpec(ErrorDetail, description=what, generate_examples=False)


def _document_missing(data: JSONBody[MissingAsked]) -> None:
    """Documents the body of `missing` in the OpenAPI document; never called (the route reads
    the body itself as it arrives, `FileListReader`)."""


@post(
    "/snapshots/{name:str}/missing",
    status_code=200,
    summary="The contents a snapshot upload must send",
    request_max_body_size=MISSING_MAX_BYTES,
    dependencies={"missing_asked": Provide(_document_missing, sync_to_thread=False)},
    responses={
        **refusals(),
        413: _too_large("The body is larger than 64 MiB"),
        422: REFUSED,
    },
)
async def snapshot_missing(
    request: Request[Identity, str, State], name: FromPath[str]
) -> MissingFound:
    """The paths of the regular files of a file list (path, mode, `sha256` or `link`) whose
    content the latest snapshot of the source `name` lacks (all of them without one): what the
    tar of `POST /snapshots/{name}` must hold. A name or a file list that could write outside
    the tree (an absolute path, `..`, `.git`, a NUL, a link out of the tree, mode bits beyond
    read and execute, a path listed twice) is refused with 422 naming the path, as is one past
    the limits (`max_snapshot_files` entries or directories, a path longer than the store's
    `PATH_MAX`, a name longer than its `NAME_MAX`, deeper than 256 directories), checked as
    the list arrives."""
    _check_name(name)
    service = service_of(request.app.state)
    limits = await _limits(service)
    files = await _read_file_list(request, limits)
    return MissingFound(missing=await service.supervisor.snapshots.missing(name, files))


async def _limits(service: Any) -> PathLimits:
    """The limits of a file list of this service's store."""
    settings = service.settings
    return await asyncio.to_thread(path_limits, settings.store, settings.max_snapshot_files)


async def _read_file_list(request: Request[Any, Any, Any], limits: PathLimits) -> list[FileEntry]:
    """The file list of a body, decoded and checked as it arrives (in threads, a part of
    `FEED_BYTES` at a time): 422 at the first entry past a limit, 400 for a body of another
    shape, 413 past 64 MiB."""
    reader = FileListReader(limits)
    pending = bytearray()
    try:
        async for chunk in request.stream():
            pending += chunk
            if len(pending) >= FEED_BYTES:
                await asyncio.to_thread(reader.feed, bytes(pending))
                pending.clear()
        await asyncio.to_thread(reader.feed, bytes(pending))
        return await asyncio.to_thread(reader.finish)
    except RequestEntityTooLarge:
        raise _TooLarge(detail=f"the file list is larger than {MISSING_MAX_BYTES} bytes") from None
    except InternalServerException:
        raise ClientException("the body ended before its end (the client went away)") from None
    except FileListSyntax as error:
        raise ClientException(str(error)) from None
    except SnapshotError as error:
        raise _refused("files", error) from None


@dataclass
class SnapshotUpload:
    """The body of `POST /snapshots/{name}` (multipart/form-data): `scan`, the scan as JSON,
    and `files`, a tar (`application/x-tar`) of the regular files `missing` named."""

    scan: Scan
    files: UploadFile


def _document_upload(
    data: Annotated[SnapshotUpload, Body(media_type=RequestEncodingType.MULTI_PART)],
) -> None:
    """Documents the body of the upload in the OpenAPI document; never called (the route
    reads the body itself, see the module), as the route does not take `snapshot_upload`."""


class _TooLarge(RequestEntityTooLarge):
    """A 413 whose detail names the limit."""


@post(
    "/snapshots/{name:str}",
    status_code=HTTP_201_CREATED,
    summary="Upload a snapshot",
    request_max_body_size=None,  # `max_upload_bytes`, checked while the body is read
    dependencies={"snapshot_upload": Provide(_document_upload, sync_to_thread=False)},
    responses={
        **refusals(),
        409: ResponseSpec(
            ErrorDetail,
            description="The latest snapshot of the source lost a content since `missing` "
            "was asked: ask `missing` again and send what it names",
            generate_examples=False,
        ),
        413: _too_large("The body is larger than `max_upload_bytes` (2 GiB by default)"),
        422: REFUSED,
        507: ResponseSpec(
            ErrorDetail,
            description="The store or the temporary directory of the service cannot be "
            "written: the detail names the error; nothing was written",
            generate_examples=False,
        ),
    },
)
async def upload_snapshot(
    request: Request[Identity, str, State], name: FromPath[str]
) -> SourceProvenance:
    """Write a snapshot of the source `name` from a multipart body: `scan` (the git state and
    the file list as JSON) and `files` (a tar of the files `missing` named; empty or left out
    when it named none). The files of the tar are renamed into the snapshot, the others are
    hard links to the latest snapshot of the name; files and directories keep the modes of
    the scan. Answers the provenance of the snapshot, its paths relative to the store.

    Refused with 422 naming every refused member (a member that is not a regular file of the
    scan, sent twice, or whose content does not match its sha256; a tar that cannot be read)
    or what is wrong with the scan (a path outside the tree, a link out of it, mode bits
    beyond read and execute); with 409 when the latest snapshot lost a content since `missing`
    was asked; with 413 as soon as the body passes `max_upload_bytes`. Nothing of a refused
    upload stays in the store or the temporary directory."""
    _check_name(name)
    service = service_of(request.app.state)
    limit = service.settings.max_upload_bytes
    boundary = _boundary(request)
    if (request.content_length or 0) > limit:
        raise _upload_too_large(limit)
    try:
        spool: IO[bytes] = await asyncio.to_thread(tempfile.TemporaryFile)
    except OSError as error:
        raise InsufficientStorage(
            detail=f"the upload cannot be spooled: the temporary directory of the service "
            f"cannot be written: {what_failed(error)}"
        ) from None
    try:
        body = await _receive(request, boundary, limit, spool)
        scan = await asyncio.to_thread(_decode_scan, body)
        limits = await _limits(service)
        try:
            await asyncio.to_thread(check_scan, scan, limits)
        except SnapshotError as error:
            raise _refused(_scan_field(error), error) from None
        await asyncio.to_thread(_rewind, spool)
        try:
            return await service.supervisor.snapshots.upload(name, scan, spool, limit, limits)
        except UploadTooLarge as error:
            raise _TooLarge(detail=str(error)) from None
        except MissingContent as error:
            raise Conflict(str(error)) from None
        except SnapshotError as error:
            raise _refused("files", error) from None
        except OSError as error:
            raise InsufficientStorage(
                detail=f"the snapshot was not written: the store cannot be written: "
                f"{what_failed(error)}"
            ) from None
    finally:
        await asyncio.to_thread(spool.close)


def _upload_too_large(limit: int) -> _TooLarge:
    return _TooLarge(
        detail=f"the upload is larger than the {limit} bytes this service takes (max_upload_bytes)"
    )


def _boundary(request: Request[Any, Any, Any]) -> bytes:
    """The boundary of a multipart/form-data body; 400 for another body."""
    media_type, options = request.content_type
    boundary = options.get("boundary")
    if media_type != RequestEncodingType.MULTI_PART or not boundary:
        raise ClientException(
            "the body is no multipart/form-data with a boundary: an upload has the parts "
            "'scan' (JSON) and 'files' (a tar)"
        )
    try:
        return boundary.encode("latin-1")
    except UnicodeEncodeError:
        raise ClientException(f"the multipart boundary {boundary!r} is not latin-1") from None


async def _receive(
    request: Request[Any, Any, Any], boundary: bytes, limit: int, spool: IO[bytes]
) -> bytes:
    """Read a multipart body as it arrives: the part `scan` returned, the part `files`
    written to `spool`. 413 past `limit` bytes (or a `scan` past 64 MiB), 400 for a body that
    is no multipart body of these parts."""
    scan: bytearray | None = None
    seen: set[str] = set()
    current: str | None = None
    pending = bytearray()
    received = 0
    parser = PushMultipartParser(boundary, max_header_count=8, strict=True)

    async def flush() -> None:
        if pending:
            try:
                await asyncio.to_thread(spool.write, bytes(pending))
            except OSError as error:
                raise InsufficientStorage(
                    detail=f"the upload cannot be spooled: the temporary directory of the "
                    f"service cannot be written: {what_failed(error)}"
                ) from None
            pending.clear()

    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise _upload_too_large(limit)
            if parser.closed:
                continue  # after the last boundary: the epilogue, ignored
            for event in parser.parse(chunk):
                if isinstance(event, MultipartSegment):
                    current = _part_name(event, seen)
                    if current == "scan":
                        scan = bytearray()
                elif event is None:
                    await flush()
                    current = None
                elif current == "scan":
                    assert scan is not None
                    scan += event
                    if len(scan) > MISSING_MAX_BYTES:
                        raise _TooLarge(
                            detail=f"the part 'scan' is larger than {MISSING_MAX_BYTES} bytes"
                        )
                else:
                    pending += event
                    if len(pending) >= SPOOL_CHUNK:
                        await flush()
        parser.close()
    except InternalServerException:
        raise ClientException("the body ended before its end (the client went away)") from None
    except ParserLimitReached as error:
        raise ClientException(f"the multipart body passes a limit: {error}") from None
    except ParserError as error:
        raise ClientException(f"the body is no multipart/form-data: {error}") from None
    if scan is None:
        raise ClientException("the part 'scan' is missing: the scan as JSON")
    if spool.tell() == 0:
        await asyncio.to_thread(spool.write, EMPTY_TAR)
    return bytes(scan)


def _part_name(segment: MultipartSegment, seen: set[str]) -> str:
    """The name of a part, one of `PARTS` and not seen before; 400 else."""
    name = segment.name
    if name not in PARTS:
        raise ClientException(f"the part {name!r} is none of an upload: 'scan' and 'files'")
    if name in seen:
        raise ClientException(f"the part {name!r} is sent twice")
    seen.add(name)
    return str(name)


def _decode_scan(body: bytes) -> Scan:
    """The scan of the part `scan`; 400 naming the field for one that does not decode."""
    try:
        return msgspec.json.decode(body, type=Scan)
    except msgspec.ValidationError as error:
        problem = validation_problem(error).under("scan")
        raise ClientException(f"the part 'scan' is no scan: {problem.text()}") from None
    except msgspec.DecodeError as error:
        raise ClientException(f"the part 'scan' is no JSON: {error}") from None
    except RecursionError:
        raise ClientException("the part 'scan' is nested too deeply") from None


def _rewind(spool: IO[bytes]) -> None:
    spool.flush()
    spool.seek(0)
