"""Snapshots uploaded to a real service over HTTP: which contents the store lacks, the upload of
a scan with a tar of them, every refusal (nothing written), a service killed in the middle of
an upload, and the removal of the snapshots no run refers to any more."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import socket
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from live_service import wait_until
from service_helpers import (
    ConfiguredService,
    spooling_service,
    start_configured_service,
    stop_configured_service,
)

from simrun_cli.client import Client, ServiceError
from simrun_core.snapshot import LATEST, FileEntry, Scan, manifest_path, tree_hash

COMMIT = "0123456789abcdef0123456789abcdef01234567"
UPLOAD_LIMIT = 4 * 1024**2
AN_HOUR_AGO = 2 * 3600  # older than the grace of a snapshot no run refers to (1 h)


# -- scans and tars ------------------------------------------------------------------------------


def sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def scan_of(
    files: dict[str, bytes],
    links: dict[str, str] | None = None,
    modes: dict[str, int] | None = None,
    dirs: dict[str, int] | None = None,
    patch: bytes = b"",
) -> Scan:
    """The scan of a tree of regular files (read-only, or `modes`) and links."""
    entries = [
        FileEntry(path=path, mode=(modes or {}).get(path, 0o444), sha256=sha(content))
        for path, content in files.items()
    ]
    entries += [
        FileEntry(path=path, mode=0o555, link=target) for path, target in (links or {}).items()
    ]
    return Scan(
        branch="main",
        commit=COMMIT,
        dirty=bool(patch),
        changed_files=["M a.txt"] if patch else [],
        patch=patch,
        files=entries,
        dirs=dirs or {},
    )


def tar_of(
    members: list[tuple[str, bytes]],
    links: dict[str, str] | None = None,
    others: dict[str, bytes] | None = None,
) -> bytes:
    """A tar of regular files (in the order given, names as given), symbolic links and
    members of other types (`tarfile` type by name)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in members:
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o444
            tar.addfile(info, io.BytesIO(content))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
        for name, kind in (others or {}).items():
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "a.txt" if kind == tarfile.LNKTYPE else ""
            tar.addfile(info)
    return buffer.getvalue()


def post_upload(
    http: httpx.Client, name: str, scan: Scan | bytes, tar: bytes | None, **kwargs: Any
) -> httpx.Response:
    """`POST /snapshots/{name}` with the parts `scan` and (unless None) `files`."""
    body = scan if isinstance(scan, bytes) else msgspec.json.encode(scan)
    files: dict[str, Any] = {"scan": (None, body, "application/json")}
    if tar is not None:
        files["files"] = ("files.tar", tar, "application/x-tar")
    return http.post(f"/snapshots/{name}", files=files, **kwargs)


def entries_below(directory: Path) -> set[str]:
    """Every path below a directory, relative to it."""
    return {str(path.relative_to(directory)) for path in directory.rglob("*")}


def inodes(directory: Path) -> dict[str, int]:
    """The inode of every regular file below a directory, by its relative path."""
    return {
        str(path.relative_to(directory)): path.lstat().st_ino
        for path in directory.rglob("*")
        if path.is_file() and not path.is_symlink()
    }


def assert_no_partial(base: Path) -> None:
    """Below `snapshots/<name>/` only complete snapshots, their manifests, `.latest` and
    the patches."""
    for entry in base.iterdir():
        name = entry.name
        if name in (LATEST, "patches"):
            continue
        if name.endswith(".files.json"):
            assert (base / name.removesuffix(".files.json")).is_dir(), name
            continue
        assert len(name) == 64 and entry.is_dir(), f"not a snapshot: {name}"
        assert manifest_path(entry).is_file(), f"a snapshot without its manifest: {name}"


def client_of(service: ConfiguredService, token: str = "t-mk") -> Client:
    return Client(service.url, token)


@pytest.fixture(scope="module")
def tmpdir_of_service(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service-tmp")


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, tmpdir_of_service: Path
) -> Iterator[ConfiguredService]:
    """A service whose uploads are limited to 4 MiB and spooled to a directory of the test."""
    with spooling_service(
        tmp_path_factory.mktemp("snapshots"), tmpdir_of_service, max_upload_bytes=UPLOAD_LIMIT
    ) as started:
        yield started


# -- missing, then upload ----------------------------------------------------------------------


def test_missing_then_upload_writes_the_tree_and_a_second_upload_links_to_it(service):
    files = {"a.txt": b"alpha\n", "src/run.py": b"print('run')\n", "src/data/x.bin": b"\0\1\2"}
    scan = scan_of(
        files,
        links={"latest": "src/run.py"},
        modes={"src/run.py": 0o555},
        dirs={"src": 0o750, "src/data": 0o2777},
        patch=b"diff --git a/a.txt b/a.txt\n",
    )
    with client_of(service) as client:
        assert sorted(client.snapshot_missing("model", scan.files)) == sorted(files)
        provenance = client.upload_snapshot("model", scan, tar_of(list(files.items())))
    digest = tree_hash(scan.files)
    assert provenance.snapshot == f"snapshots/model/{digest}"
    assert provenance.diff_sha256 == digest
    assert (provenance.name, provenance.branch, provenance.commit) == ("model", "main", COMMIT)
    assert provenance.dirty and provenance.changed == ["M a.txt"] and provenance.path is None
    assert provenance.patch == f"snapshots/model/patches/{sha(scan.patch)}.patch"
    assert (service.store / provenance.patch).read_bytes() == scan.patch

    snapshot = service.store / provenance.snapshot
    for path, content in files.items():
        assert (snapshot / path).read_bytes() == content
    assert (snapshot / "a.txt").stat().st_mode & 0o7777 == 0o444
    assert (snapshot / "src/run.py").stat().st_mode & 0o7777 == 0o555
    assert os.readlink(snapshot / "latest") == "src/run.py"
    assert (snapshot / "src").stat().st_mode & 0o7777 == 0o750
    # A directory writable by all in the scan (and setgid) is stored writable by its owner only.
    assert (snapshot / "src/data").stat().st_mode & 0o7777 == 0o755
    assert manifest_path(snapshot).is_file()
    assert (snapshot.parent / LATEST).read_text().strip() == digest
    assert_no_partial(snapshot.parent)

    # The same tree again: nothing is missing, an empty tar makes the same snapshot and no file
    # (only its manifest and `.latest` are written again).
    before, entries = inodes(snapshot), entries_below(service.store / "snapshots")
    with client_of(service) as client:
        assert client.snapshot_missing("model", scan.files) == []
        again = client.upload_snapshot("model", scan, tar_of([]))
    assert again.snapshot == provenance.snapshot
    assert inodes(snapshot) == before
    assert entries_below(service.store / "snapshots") == entries

    # One file changed: only it is missing and sent, the others are links to the first files.
    changed = {**files, "a.txt": b"alpha, changed\n"}
    second = scan_of(changed, links={"latest": "src/run.py"}, modes={"src/run.py": 0o555})
    with client_of(service) as client:
        assert client.snapshot_missing("model", second.files) == ["a.txt"]
        tar = service.root / "second.tar"
        tar.write_bytes(tar_of([("a.txt", changed["a.txt"])]))
        newer = client.upload_snapshot("model", second, tar)
    assert newer.snapshot != provenance.snapshot and newer.patch is None
    first, linked = inodes(snapshot), inodes(service.store / newer.snapshot)
    assert linked["src/run.py"] == first["src/run.py"]
    assert linked["src/data/x.bin"] == first["src/data/x.bin"]
    assert linked["a.txt"] != first["a.txt"]
    assert (service.store / newer.snapshot / "a.txt").read_bytes() == changed["a.txt"]
    assert_no_partial(snapshot.parent)


def test_an_upload_without_files_or_with_an_empty_part_needs_no_tar(service):
    scan = scan_of({}, links={"l": "l2"})
    for tar in (None, b""):
        response = post_upload(service.clients["ann-bot"], "links", scan, tar)
        assert response.status_code == 201, response.text
        assert response.json()["snapshot"] == f"snapshots/links/{tree_hash(scan.files)}"


# -- refusals --------------------------------------------------------------------------------------

GOOD = {"a.txt": b"alpha\n", "b.txt": b"beta\n"}


def good_tar() -> bytes:
    return tar_of(list(GOOD.items()))


def with_entry(entry: FileEntry) -> Scan:
    scan = scan_of(GOOD)
    return msgspec.structs.replace(scan, files=[*scan.files, entry])


SCAN_REFUSALS = {
    "absolute": (
        with_entry(FileEntry(path="/etc/passwd", mode=0o444, sha256=sha(b"x"))),
        "scan.files: path '/etc/passwd': absolute",
    ),
    "dotdot": (
        with_entry(FileEntry(path="a/../../x", mode=0o444, sha256=sha(b"x"))),
        "scan.files: path 'a/../../x': has a '..' component",
    ),
    "git": (
        with_entry(FileEntry(path="sub/.git/config", mode=0o444, sha256=sha(b"x"))),
        "scan.files: path 'sub/.git/config': has a '.git' component",
    ),
    "nul": (
        with_entry(FileEntry(path="a\0b", mode=0o444, sha256=sha(b"x"))),
        "scan.files: path 'a\\x00b': empty or has a NUL character",
    ),
    "link-out": (
        with_entry(FileEntry(path="sub/l", mode=0o555, link="../../etc/passwd")),
        "scan.files: link 'sub/l': target '../../etc/passwd' leaves the tree",
    ),
    "link-absolute": (
        with_entry(FileEntry(path="l", mode=0o555, link="/etc/passwd")),
        "scan.files: link 'l': absolute target '/etc/passwd'",
    ),
    "write-bit": (
        with_entry(FileEntry(path="w.txt", mode=0o644, sha256=sha(b"x"))),
        "scan.files: path 'w.txt': mode 644 has more than read and execute bits",
    ),
    "setuid": (
        with_entry(FileEntry(path="s", mode=0o4555, sha256=sha(b"x"))),
        "scan.files: path 's': mode 4555 has more than read and execute bits",
    ),
    "listed-twice": (
        with_entry(FileEntry(path="a.txt", mode=0o444, sha256=sha(b"x"))),
        "scan.files: path 'a.txt': listed twice",
    ),
    "commit": (
        msgspec.structs.replace(scan_of(GOOD), commit="HEAD; rm -rf /"),
        "scan.commit: commit 'HEAD; rm -rf /': not a hexadecimal hash",
    ),
    "directory": (
        msgspec.structs.replace(scan_of(GOOD), dirs={"nowhere": 0o755}),
        "scan.dirs: directory 'nowhere': holds no file of the scan",
    ),
}

MEMBER_REFUSALS = {
    "duplicate": (
        tar_of([("a.txt", GOOD["a.txt"]), ("b.txt", GOOD["b.txt"]), ("a.txt", GOOD["a.txt"])]),
        ["'a.txt': sent twice"],
    ),
    "not-in-scan": (
        tar_of([*GOOD.items(), ("extra.txt", b"extra")]),
        ["'extra.txt': not a regular file of the scan"],
    ),
    "absolute-member": (
        tar_of([*GOOD.items(), ("/etc/cron.d/x", b"* * * * * root sh")]),
        ["'/etc/cron.d/x': not a regular file of the scan"],
    ),
    "dotdot-member": (
        tar_of([*GOOD.items(), ("../../escape", b"x")]),
        ["'../../escape': not a regular file of the scan"],
    ),
    "hash-mismatch": (
        tar_of([("a.txt", b"not alpha\n"), ("b.txt", GOOD["b.txt"])]),
        ["'a.txt': its content does not match its sha256"],
    ),
    "not-regular": (
        tar_of(
            list(GOOD.items()),
            links={"b.txt-link": "/etc/passwd"},
            others={"dir": tarfile.DIRTYPE, "hard": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE},
        ),
        [
            "'b.txt-link': not a regular file",
            "'dir': not a regular file",
            "'hard': not a regular file",
            "'fifo': not a regular file",
        ],
    ),
    "every-member-named": (
        tar_of([("a.txt", b"wrong"), ("x", b"x"), ("b.txt", GOOD["b.txt"])], links={"l": "a"}),
        [
            "'a.txt': its content does not match its sha256",
            "'x': not a regular file of the scan",
            "'l': not a regular file",
        ],
    ),
    "unreadable": (b"this is no tar at all" * 100, ["the upload is no readable tar"]),
    "truncated": (good_tar()[:700], ["the upload is no readable tar"]),
}


def assert_refused_with(response: httpx.Response, expected: list[str], field: str) -> None:
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["status_code"] == 422
    assert len(body["errors"]) == 1 and body["errors"][0].startswith(f"{field}: ")
    for text in expected:
        assert text in body["errors"][0], (text, body)
        assert text in body["detail"]


@pytest.mark.parametrize("case", sorted(SCAN_REFUSALS))
def test_a_scan_that_could_write_outside_its_tree_is_refused_naming_the_path(service, case):
    scan, expected = SCAN_REFUSALS[case]
    name = f"refused-{case}"
    response = post_upload(service.clients["mk"], name, scan, good_tar())
    assert response.status_code == 422, response.text
    assert response.json()["errors"] == [expected]
    assert not (service.store / "snapshots" / name).exists()
    if case not in ("commit", "directory"):
        missing = service.clients["mk"].post(
            f"/snapshots/{name}/missing", content=msgspec.json.encode({"files": scan.files})
        )
        assert missing.status_code == 422, missing.text
        assert missing.json()["errors"] == [expected.replace("scan.files", "files", 1)]


@pytest.mark.parametrize("case", sorted(MEMBER_REFUSALS))
def test_a_refused_member_is_named_and_nothing_is_written(service, case):
    tar, expected = MEMBER_REFUSALS[case]
    name = "members"
    base = service.store / "snapshots" / name
    before = entries_below(base) if base.exists() else set()
    response = post_upload(service.clients["mk"], name, scan_of(GOOD), tar)
    assert_refused_with(response, expected, "files")
    assert (entries_below(base) if base.exists() else set()) == before
    assert_no_partial(base)


def test_a_refused_name_is_named(service):
    for name in (".hidden", "-dash", "a b", "%2e%2e"):
        for response in (
            post_upload(service.clients["mk"], name, scan_of(GOOD), good_tar()),
            service.clients["mk"].post(f"/snapshots/{name}/missing", json={"files": []}),
        ):
            assert response.status_code == 422, (name, response.text)
            assert response.json()["errors"][0].startswith("name: source name ")
    assert not list(service.store.glob("snapshots/.*"))


def test_a_body_that_is_no_upload_is_a_400(service):
    http = service.clients["mk"]
    cases = [
        http.post("/snapshots/shape", json={"scan": {}}),
        http.post(
            "/snapshots/shape",
            content=b'--b\r\nContent-Disposition: form-data; name="scan"\r\n\r\n{}',
            headers={"content-type": "multipart/form-data; boundary=b"},
        ),
        http.post("/snapshots/shape", files={"other": (None, b"x")}),
        http.post("/snapshots/shape", files={"files": ("f.tar", good_tar())}),
        post_upload(http, "shape", b"{not json", good_tar()),
        post_upload(http, "shape", b'{"branch": null, "commit": 3, "dirty": false}', None),
        http.post(
            "/snapshots/shape",
            files=[("scan", (None, msgspec.json.encode(scan_of(GOOD)))), ("scan", (None, b"{}"))],
        ),
    ]
    details = [response.json()["detail"] for response in cases]
    assert [response.status_code for response in cases] == [400] * len(cases), details
    assert "no multipart/form-data" in details[0]
    assert "no multipart/form-data" in details[1]
    assert "the part 'other' is none of an upload" in details[2]
    assert "the part 'scan' is missing" in details[3]
    assert "the part 'scan' is no JSON" in details[4]
    assert "scan.commit: expected `str`, got `int`" in details[5]
    assert "the part 'scan' is sent twice" in details[6]
    assert not (service.store / "snapshots" / "shape").exists()


def test_an_upload_whose_content_the_store_lost_meanwhile_is_a_409(service):
    v1 = {"a.txt": b"one\n", "b.txt": b"two\n"}
    v2 = {"a.txt": b"one\n", "c.txt": b"three\n"}
    with client_of(service) as client:
        client.upload_snapshot("lost", scan_of(v1), tar_of(list(v1.items())))
        # The client asks what the store lacks: only c.txt, a.txt is in the latest snapshot.
        assert client.snapshot_missing("lost", scan_of(v2).files) == ["c.txt"]
        # Another client uploads meanwhile a tree without a.txt: the latest lacks it now.
        v3 = {"d.txt": b"four\n"}
        client.upload_snapshot("lost", scan_of(v3), tar_of(list(v3.items())))
        base = service.store / "snapshots" / "lost"
        before = entries_below(base)
        with pytest.raises(ServiceError) as refused:
            client.upload_snapshot("lost", scan_of(v2), tar_of([("c.txt", v2["c.txt"])]))
        assert refused.value.status == 409
        assert "'a.txt'" in refused.value.detail and "ask again" in refused.value.detail
        assert entries_below(base) == before
        # Asked again, the client sends both and the upload goes through.
        assert sorted(client.snapshot_missing("lost", scan_of(v2).files)) == ["a.txt", "c.txt"]
        done = client.upload_snapshot("lost", scan_of(v2), tar_of(list(v2.items())))
    assert (service.store / done.snapshot / "a.txt").read_bytes() == b"one\n"


def test_an_upload_above_max_upload_bytes_is_a_413_and_leaves_nothing(service, tmpdir_of_service):
    big = {"big.bin": os.urandom(UPLOAD_LIMIT + 1024)}
    scan = scan_of(big)
    response = post_upload(service.clients["mk"], "large", scan, tar_of(list(big.items())))
    assert response.status_code == 413, response.text
    detail = response.json()["detail"]
    assert str(UPLOAD_LIMIT) in detail and "max_upload_bytes" in detail

    # A body without a length, streamed: refused once it passes the limit, no more read.
    boundary = "xyzzy"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="scan"\r\n\r\n'.encode()
        + msgspec.json.encode(scan)
        + f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="files"; '
        'filename="f.tar"\r\nContent-Type: application/x-tar\r\n\r\n'.encode()
    )
    sent = [0]

    def chunks() -> Iterator[bytes]:
        yield head
        for _ in range(4 * UPLOAD_LIMIT // 65536):
            sent[0] += 65536
            yield b"\0" * 65536

    try:
        streamed = service.clients["mk"].post(
            "/snapshots/large",
            content=chunks(),
            headers={"content-type": f"multipart/form-data; boundary={boundary}"},
        )
        assert streamed.status_code == 413, streamed.text
        assert "max_upload_bytes" in streamed.json()["detail"]
    except httpx.TransportError:
        pass  # the service answered and closed while the client still sent
    assert sent[0] < 4 * UPLOAD_LIMIT
    assert not (service.store / "snapshots" / "large").exists()
    assert list(tmpdir_of_service.iterdir()) == []

    # The list of `missing` takes up to 64 MiB.
    entry = {"path": "p", "mode": 292, "sha256": "0" * 64}
    files = [dict(entry, path=f"p{i:08d}") for i in range(64 * 1024**2 // 60)]
    huge = json.dumps({"files": files}).encode()
    assert len(huge) > 64 * 1024**2
    too_many = service.clients["mk"].post(
        "/snapshots/large/missing", content=huge, headers={"content-type": "application/json"}
    )
    assert too_many.status_code == 413, too_many.text[:300]
    assert str(64 * 1024**2) in too_many.json()["detail"]
    assert service.clients["mk"].get("/me").status_code == 200


# -- a service killed in the middle of an upload ----------------------------------------------


def spool_of(pid: int, directory: Path) -> bool:
    """Whether the process has a file of `directory` open (the spool of an upload)."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith(str(directory)):
                return True
        except OSError:
            continue
    return False


def big_content(name: str) -> bytes:
    """The 1 MiB content of a file of the large upload."""
    return name.encode().ljust(16, b".") * (1024**2 // 16)


def start_spooling_to(root: Path, tmpdir: Path) -> ConfiguredService:
    """The service of `root` (started again: on another port) with TMPDIR `tmpdir`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmpdir))
        return start_configured_service(root)


def test_a_service_killed_during_uploads_leaves_no_partial_snapshot(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    root = tmp_path / "service"
    root.mkdir()
    service = start_spooling_to(root, tmpdir)
    try:
        small = {"kept.txt": b"kept\n"}
        with client_of(service) as client:
            kept = client.upload_snapshot("big", scan_of(small), tar_of(list(small.items())))
        base = service.store / "snapshots" / "big"

        # Killed while it writes the files of an upload into the store: 384 files of 1 MiB.
        mib = 1024**2
        names = [f"f{i:03d}.bin" for i in range(384)]
        tar = tmp_path / "big.tar"
        with tarfile.open(tar, mode="w") as writer:
            for name in names:
                info = tarfile.TarInfo(name)
                info.size = mib
                writer.addfile(info, io.BytesIO(big_content(name)))
        scan = msgspec.structs.replace(
            scan_of({}),
            files=[FileEntry(path=n, mode=0o444, sha256=sha(big_content(n))) for n in names],
        )
        outcome: dict[str, Any] = {}

        def send() -> None:
            try:
                with client_of(service) as client:
                    outcome["answer"] = client.upload_snapshot("big", scan, tar)
            except Exception as error:
                outcome["error"] = error

        sender = threading.Thread(target=send)
        sender.start()
        wait_until(
            lambda: any(entry.name.startswith((".upload-", ".tmp-")) for entry in base.iterdir()),
            timeout=60,
            what="the upload to be written into the store",
        )
        os.killpg(service.process.pid, signal.SIGKILL)
        service.process.wait()
        sender.join(30)
        assert "answer" not in outcome, "the upload ended before the service was killed"
        assert any(entry.name.startswith((".upload-", ".tmp-")) for entry in base.iterdir())

        service = start_spooling_to(root, tmpdir)
        assert_no_partial(base)
        assert sorted(entry.name for entry in base.iterdir() if len(entry.name) == 64) == [
            kept.snapshot.rsplit("/", 1)[1]
        ]
        assert (service.store / kept.snapshot / "kept.txt").read_bytes() == b"kept\n"

        # Killed while it receives the body: the spool is an unnamed file of TMPDIR.
        port = service.url.rsplit(":", 1)[1]
        with socket.create_connection(("127.0.0.1", int(port)), timeout=30) as sock:
            boundary = "kill"
            head = (
                f'--{boundary}\r\nContent-Disposition: form-data; name="scan"\r\n\r\n'.encode()
                + msgspec.json.encode(scan)
                + f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="files"; '
                'filename="f.tar"\r\n\r\n'.encode()
            )
            request = (
                f"POST /snapshots/big HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                "Authorization: Bearer t-mk\r\n"
                f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                f"Content-Length: {len(head) + 512 * mib}\r\n\r\n"
            ).encode()
            sock.sendall(request + head)
            with tar.open("rb") as stream:
                sock.sendall(stream.read(64 * mib))
            wait_until(lambda: spool_of(service.process.pid, tmpdir), what="the spool")
            os.killpg(service.process.pid, signal.SIGKILL)
            service.process.wait()
        assert list(tmpdir.iterdir()) == []
        service = start_spooling_to(root, tmpdir)
        assert_no_partial(base)
        with client_of(service) as client:
            assert sorted(client.snapshot_missing("big", scan.files)) == names
            done = client.upload_snapshot("big", scan, tar)
        assert (service.store / done.snapshot / "f383.bin").read_bytes() == big_content("f383.bin")
        assert_no_partial(base)
    finally:
        if service.process.poll() is None:
            stop_configured_service(service)


# -- the removal of snapshots no run refers to ------------------------------------------------


def age(store: Path, snapshot: str, seconds: float = AN_HOUR_AGO) -> None:
    """Make a snapshot look written `seconds` ago (its manifest's mtime)."""
    when = time.time() - seconds
    os.utime(manifest_path(store / snapshot), (when, when))


def run_with(service: ConfiguredService, *sources: Any, group: str | None = None) -> str:
    """A run of a demo task with these sources, ended (it fails: the local backend installs
    its snapshots, which are no python projects; ended is all the removal needs)."""
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": 2}}
    body = [msgspec.to_builtins(source) for source in sources]
    extra = {"group": group} if group else {}
    run = service.submit("mk", {"name": "snap", "tasks": [task]}, sources=body, **extra)
    assert service.wait(run["id"])["state"] in ("succeeded", "failed")
    wait_until(lambda: (service.run_dir(run["id"]) / "run.json").exists(), what="run.json")
    return run["id"]


def test_removing_runs_removes_the_snapshots_no_remaining_run_refers_to(tmp_path):
    service = start_configured_service(tmp_path)
    try:
        trees = {
            version: {"a.txt": b"shared\n", "v.txt": f"{version}\n".encode() * 1000}
            for version in ("one", "two", "three", "fresh")
        }
        with client_of(service) as client:
            made = {
                version: client.upload_snapshot(
                    "model", scan_of(files), tar_of(list(files.items()))
                )
                for version, files in trees.items()
            }
        one, two, three, fresh = (made[v].snapshot for v in ("one", "two", "three", "fresh"))
        a = run_with(service, made["one"])
        b = run_with(service, made["one"], msgspec.structs.replace(made["two"], name="other"))
        c = run_with(service, made["fresh"])
        # A source that names no snapshot of the store refers to nothing and is never removed.
        d = run_with(service, msgspec.structs.replace(made["three"], snapshot="runs/../snapshots"))

        # The index of the next start knows the snapshots of the runs from their logs.
        assert stop_configured_service(service) == 0
        service = start_configured_service(tmp_path)
        for snapshot in (one, two, three):
            age(service.store, snapshot)
        mk = service.clients["mk"]

        first = mk.delete(f"/runs/{a}")
        assert first.status_code == 200, first.text
        assert first.json()["snapshots"] == []  # b still refers to one
        assert (service.store / one).is_dir()

        second = mk.delete(f"/runs/{b}")
        assert second.status_code == 200, second.text
        assert second.json()["snapshots"] == sorted([one, two])
        assert second.json()["bytes_freed"] > 2 * 4000
        for snapshot in (one, two):
            assert not (service.store / snapshot).exists()
            assert not manifest_path(service.store / snapshot).exists()
        # three was no snapshot of b: a removal of b leaves it for a cleanup.
        assert (service.store / three).is_dir() and (service.store / fresh).is_dir()
        # The files the remaining snapshots shared with the removed ones are still theirs.
        assert (service.store / three / "a.txt").read_bytes() == b"shared\n"

        # Just written, a snapshot no remaining run refers to is kept for an hour.
        third = mk.delete(f"/runs/{c}")
        assert third.json()["snapshots"] == [] and (service.store / fresh).is_dir()

        # A cleanup lists, then removes every snapshot no run refers to, but the fresh one.
        dry = mk.post("/cleanup", json={"older_than_days": 0, "dry_run": True})
        assert dry.status_code == 200, dry.text
        assert dry.json()["runs"] == [f"runs/{d}"] and dry.json()["snapshots"] == [three]
        assert (service.store / three).is_dir()
        age(service.store, fresh)
        cleaned = mk.post("/cleanup", json={"older_than_days": 0})
        assert cleaned.status_code == 200, cleaned.text
        assert cleaned.json()["runs"] == [f"runs/{d}"]
        assert cleaned.json()["snapshots"] == sorted([three, fresh])
        base = service.store / "snapshots" / "model"
        assert not [entry for entry in base.iterdir() if len(entry.name) == 64]
        assert_no_partial(base)

        # `.latest` names a removed snapshot: the next upload sends every file again.
        with client_of(service) as client:
            again = scan_of(trees["one"])
            assert sorted(client.snapshot_missing("model", again.files)) == ["a.txt", "v.txt"]
            client.upload_snapshot("model", again, tar_of(list(trees["one"].items())))
        assert (service.store / one / "v.txt").read_bytes() == trees["one"]["v.txt"]
    finally:
        stop_configured_service(service)


def test_a_cleanup_keeps_a_snapshot_a_run_it_leaves_refers_to(tmp_path):
    service = start_configured_service(tmp_path)
    try:
        files = {"m.py": b"model\n"}
        with client_of(service) as client:
            made = client.upload_snapshot("kept", scan_of(files), tar_of(list(files.items())))
        old = run_with(service, made, group="old")
        new = run_with(service, made, group="new")
        age(service.store, made.snapshot)
        mk = service.clients["mk"]
        first = mk.post("/cleanup", json={"older_than_days": 0, "group": "old"})
        assert first.status_code == 200, first.text
        assert first.json()["runs"] == [f"runs/{old}"] and first.json()["snapshots"] == []
        assert (service.store / made.snapshot / "m.py").is_file()
        second = mk.post("/cleanup", json={"older_than_days": 0, "group": "new"})
        assert second.json()["runs"] == [f"runs/{new}"]
        assert second.json()["snapshots"] == [made.snapshot]
        assert not (service.store / made.snapshot).exists()
    finally:
        stop_configured_service(service)
