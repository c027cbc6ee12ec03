"""Uploads that expand and file lists past their limits, against a real service over HTTP: a
small tar whose members declare more than `max_upload_bytes` (sparse, compressed, many) is a
413 before anything is written; a file list past its limits (entries, directories, path
length, name length, depth) a 422 naming the limit, without the memory of the old checks; the
checks of deep paths never hold the other requests; and a full store answers 507 naming what
failed, not where the store is."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from live_service import command
from service_helpers import (
    ConfiguredService,
    spooling_service,
    start_configured_service,
    stop_configured_service,
)

from simrun_core.snapshot import FileEntry, Scan

COMMIT = "0123456789abcdef0123456789abcdef01234567"
UPLOAD_LIMIT = 4 * 1024**2
FILES_LIMIT = 1000
MIB = 1024**2


@pytest.fixture(scope="module")
def tmpdir_of_service(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service-tmp")


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, tmpdir_of_service: Path
) -> Iterator[ConfiguredService]:
    """A service that takes uploads of 4 MiB and file lists of 1,000 entries."""
    with spooling_service(
        tmp_path_factory.mktemp("limits"),
        tmpdir_of_service,
        max_upload_bytes=UPLOAD_LIMIT,
        max_snapshot_files=FILES_LIMIT,
    ) as started:
        yield started


def written_bytes(pid: int) -> int:
    """The bytes the process passed to write() so far (`wchar` of /proc/PID/io)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/PID/io")


def peak_memory(pid: int) -> int:
    """The peak resident memory of the process so far (`VmHWM`), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


def scan_of(entries: list[FileEntry]) -> Scan:
    return Scan(branch="main", commit=COMMIT, dirty=False, files=entries)


def upload(http: httpx.Client, name: str, scan: Scan, tar: bytes) -> httpx.Response:
    files = {
        "scan": (None, msgspec.json.encode(scan), "application/json"),
        "files": ("files.tar", tar, "application/x-tar"),
    }
    return http.post(f"/snapshots/{name}", files=files)


# -- tars that expand --------------------------------------------------------------------------


def sparse_tar(name: str, size: int) -> bytes:
    """A tar of one sparse member (PAX, GNU sparse 0.1) of `size` bytes, all of it a hole: a
    few KiB that extract to `size` bytes of zeros."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = 0
        info.mode = 0o444
        info.pax_headers = {"GNU.sparse.map": f"{size},0", "GNU.sparse.size": str(size)}
        tar.addfile(info, io.BytesIO(b""))
    return buffer.getvalue()


def zeros_tar_gz(members: dict[str, int]) -> bytes:
    """A gzip-compressed tar of members of zeros, by name and size."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, size in members.items():
            info = tarfile.TarInfo(name)
            info.size = size
            info.mode = 0o444
            tar.addfile(info, io.BytesIO(bytes(size)))
    return gzip.compress(buffer.getvalue(), compresslevel=9)


def zeros_sha(size: int) -> str:
    return hashlib.sha256(bytes(size)).hexdigest()


EXPANDING = {
    # 300 MiB of holes in 10 KiB; its sha256 is not even checked before the 413
    "sparse": (sparse_tar("big.bin", 300 * MIB), {"big.bin": 300 * MIB}),
    "compressed": (zeros_tar_gz({"big.bin": 64 * MIB}), {"big.bin": 64 * MIB}),
    # each member under the limit, together above it
    "many": (
        zeros_tar_gz({f"part{n}.bin": 2 * MIB for n in range(3)}),
        {f"part{n}.bin": 2 * MIB for n in range(3)},
    ),
}


@pytest.mark.parametrize("case", sorted(EXPANDING))
def test_a_tar_declaring_more_than_max_upload_bytes_is_a_413_and_nothing_is_written(
    service, tmpdir_of_service, case
):
    tar, sizes = EXPANDING[case]
    assert len(tar) < UPLOAD_LIMIT // 8
    scan = scan_of(
        [FileEntry(path=path, mode=0o444, sha256=zeros_sha(size)) for path, size in sizes.items()]
    )
    before = written_bytes(service.process.pid)
    response = upload(service.clients["mk-bot"], f"expand-{case}", scan, tar)
    assert response.status_code == 413, response.text[:500]
    detail = response.json()["detail"]
    assert str(UPLOAD_LIMIT) in detail and "max_upload_bytes" in detail, detail
    # The service wrote its spool of the body (a few KiB) and its log, never the members.
    assert written_bytes(service.process.pid) - before < UPLOAD_LIMIT // 4
    assert not (service.store / "snapshots" / f"expand-{case}").exists()
    assert list(tmpdir_of_service.iterdir()) == []


def test_a_tar_within_max_upload_bytes_expanded_is_written(service):
    sizes = {"one.bin": MIB, "two.bin": 2 * MIB}
    scan = scan_of(
        [FileEntry(path=path, mode=0o444, sha256=zeros_sha(size)) for path, size in sizes.items()]
    )
    response = upload(service.clients["mk"], "within", scan, zeros_tar_gz(sizes))
    assert response.status_code == 201, response.text
    snapshot = service.store / response.json()["snapshot"]
    assert (snapshot / "two.bin").stat().st_size == 2 * MIB


# -- file lists past their limits ----------------------------------------------------------------

ENTRY = {"mode": 0o444, "sha256": "0" * 64}


def file_list(paths: list[str]) -> bytes:
    return msgspec.json.encode({"files": [dict(ENTRY, path=path) for path in paths]})


def missing(service: ConfiguredService, body: bytes) -> httpx.Response:
    return service.clients["mk"].post(
        "/snapshots/lists/missing", content=body, headers={"content-type": "application/json"}
    )


LIMITS = {
    # the body of the issue: one path of 60 KiB, 30,000 directories deep
    "path-length": (["a/" * 30_000 + "f"], "60001 bytes long", "4096 (PATH_MAX)"),
    "name-length": ([f"dir/{'n' * 256}"], "'dir/nnnn", "255 bytes of a name of the store"),
    "depth": (["d/" * 257 + "f"], "257 directories deep", "at most 256"),
    "entries": ([f"f{n}" for n in range(FILES_LIMIT + 1)], "more than 1000 entries", ""),
    "directories": (
        [f"d{n}/e/f" for n in range(FILES_LIMIT // 2 + 1)],
        "makes 1002 directories",
        "at most 1000",
    ),
}


@pytest.mark.parametrize("case", sorted(LIMITS))
def test_a_file_list_past_a_limit_is_refused_naming_it(service, case):
    paths, named, limit = LIMITS[case]
    response = missing(service, file_list(paths))
    assert response.status_code == 422, response.text[:500]
    (error,) = response.json()["errors"]
    assert error.startswith("files: ") and named in error and limit in error, error
    assert len(error) < 500  # a long path is cut in the message


def test_the_deep_path_of_the_issue_is_refused_without_the_memory_of_its_checks(tmp_path):
    """A 60 KiB path 30,000 directories deep raised the service's peak memory by 863 MiB (the
    directories above each path of a scan, all kept at once); in the file list of `missing`
    and in the scan of an upload it is refused naming PATH_MAX. A service of its own, so the
    peak is this test's."""
    root = tmp_path / "service"
    root.mkdir()
    service = start_configured_service(root)
    try:
        deep = "a/" * 30_000 + "f"
        body = file_list([deep])
        assert len(body) < 64 * 1024
        before = peak_memory(service.process.pid)
        listed = missing(service, body)
        assert listed.status_code == 422, listed.text[:500]
        assert "PATH_MAX" in listed.json()["errors"][0]
        scan = scan_of([FileEntry(path=deep, mode=0o444, sha256="0" * 64)])
        uploaded = upload(service.clients["mk"], "deep", scan, b"")
        assert uploaded.status_code == 422, uploaded.text[:500]
        assert "PATH_MAX" in uploaded.json()["errors"][0]
        assert peak_memory(service.process.pid) - before < 100 * MIB
        assert not (service.store / "snapshots" / "deep").exists()
    finally:
        stop_configured_service(service)


def test_a_file_list_at_the_limits_is_answered(service):
    deep = "/".join(f"{n:015d}" for n in range(255))  # 255 directories, 4080 bytes
    paths = [f"{deep}/f{n}" for n in range(FILES_LIMIT)]
    response = missing(service, file_list(paths))
    assert response.status_code == 200, response.text[:500]
    assert sorted(response.json()["missing"]) == sorted(paths)


def test_a_file_list_of_another_shape_is_a_400(service):
    for body in (b"[]", b'{"files": [1]}', b'{"files": [{"path": 3}]}', b'{"files": []} more'):
        response = missing(service, body)
        assert response.status_code == 400, (body, response.text)
        assert "file list" in response.json()["detail"]


# -- the checks never hold the other requests ---------------------------------------------------


def test_deep_paths_do_not_hold_the_other_requests(service):
    """Deep paths (the issue's, refused, in the scans of uploads; and a file list at the
    limits) sent one after another while `GET /me` is asked again and again: each answer of
    `/me` comes within a bound only a blocked event loop breaks (the issue saw `POST /runs`
    wait 7 s)."""
    at_limits = file_list(
        ["/".join(f"{n:015d}" for n in range(255)) + f"/f{m}" for m in range(FILES_LIMIT)]
    )
    too_deep = scan_of(
        [FileEntry(path=f"{m}/" + "a/" * 30_000 + "f", mode=0o444, sha256="0" * 64) for m in (1, 2)]
    )
    answers: list[int] = []
    done = threading.Event()

    def send() -> None:
        try:
            with httpx.Client(
                base_url=service.url, headers={"Authorization": "Bearer t-ann"}, timeout=120
            ) as http:
                for _ in range(2):
                    answers.append(upload(http, "deep", too_deep, b"").status_code)
                    answers.append(
                        http.post(
                            "/snapshots/deep/missing",
                            content=at_limits,
                            headers={"content-type": "application/json"},
                        ).status_code
                    )
        finally:
            done.set()

    sender = threading.Thread(target=send)
    sender.start()
    waits: list[float] = []
    try:
        while not done.is_set():
            started = time.monotonic()
            assert service.clients["mk"].get("/me").status_code == 200
            waits.append(time.monotonic() - started)
    finally:
        sender.join(120)
    assert answers == [422, 200, 422, 200]
    assert waits and max(waits) < 2.0, max(waits)


# -- a full store --------------------------------------------------------------------------------


def test_a_full_store_answers_507_naming_what_failed_not_where_the_store_is(tmp_path):
    full = tmp_path / "disk-full"
    root = tmp_path / "service"
    root.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SIMRUN_FAULTS", f"atomic:ENOSPC:while={full}")
        service = start_configured_service(root)
    try:
        full.touch()
        quick: dict[str, Any] = {
            "name": "quick",
            "tasks": [command("t", ["true"])],
        }
        content = b"content\n"
        scan = scan_of(
            [FileEntry(path="a.txt", mode=0o444, sha256=hashlib.sha256(content).hexdigest())]
        )
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo("a.txt")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        answers = [
            service.clients["mk"].post("/runs", json={"workflow": quick}),
            upload(service.clients["mk"], "full", scan, buffer.getvalue()),
        ]
        for response in answers:
            assert response.status_code == 507, response.text
            detail = response.json()["detail"]
            assert "the store cannot be written: No space left on device" in detail, detail
            assert str(service.store) not in detail and str(root) not in detail, detail
    finally:
        stop_configured_service(service)
