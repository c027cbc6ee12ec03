"""The HTTP client against a small real server: refusals, the long poll, SSE and its resumption."""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import msgspec
import pytest
from cli_helpers import RUN_ID, T0, two_task_events, unit_events

from simrun_cli.client import (
    Client,
    RunsUpdate,
    ServersUpdate,
    ServiceError,
    ServiceUnreachable,
    backoff_delays,
)
from simrun_cli.download import archive_size, download_outputs, output_target
from simrun_cli.errors import CliError
from simrun_core import events as ev
from simrun_core.fold import RunFold, fold
from simrun_core.views import progress_view, run_item
from simrun_core.wire import CleanupRequest, OutputFile

EVENTS_PATH = f"/runs/{RUN_ID}/events"


def run_events() -> list[ev.Event]:
    """Seven events of a run: submitted, running, three units, the task done, succeeded."""
    events = two_task_events(units=3)
    events += unit_events(4, "scan", range(3))
    events.append(ev.Succeeded(seq=7, time=T0))
    return events


def sse(event: ev.Event) -> bytes:
    """An event as one SSE message, as the service sends it."""
    data = ev.encode_event(event).decode().strip()
    return f"event: {event.__struct_config__.tag}\nid: {event.seq}\ndata: {data}\n\n".encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeService

    def do_GET(self) -> None:
        self.handle_route("GET")

    def do_POST(self) -> None:
        self.handle_route("POST")

    def do_DELETE(self) -> None:
        self.handle_route("DELETE")

    def handle_route(self, method: str) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        self.server.bodies.append((method, url.path, self.rfile.read(length)))
        self.server.seen.append((method, url.path, parse_qs(url.query), dict(self.headers)))
        route = self.server.routes.get((method, url.path))
        if route is None:
            self.reply(404, {"status_code": 404, "detail": f"no route {url.path}"})
            return
        route(self)

    def reply(self, status: int, body: object, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: object) -> None:
        return


class FakeService(ThreadingHTTPServer):
    """A server on 127.0.0.1 with routes set by a test; it records every request."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.routes: dict[tuple[str, str], Callable[[Handler], None]] = {}
        self.seen: list[tuple[str, str, dict[str, list[str]], dict[str, str]]] = []
        self.bodies: list[tuple[str, str, bytes]] = []
        self.released = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stream(self, *connections: Callable[[Handler], None]) -> None:
        """The events route answers the connections in turn, one script each."""
        scripts = iter(connections)
        self.routes[("GET", EVENTS_PATH)] = lambda handler: next(scripts)(handler)

    def body_of(self, method: str, path: str) -> bytes:
        """The body of the last request of a route."""
        return next(body for m, p, body in reversed(self.bodies) if (m, p) == (method, path))

    def last_event_ids(self) -> list[str | None]:
        return [
            headers.get("Last-Event-ID") for _, path, _, headers in self.seen if path == EVENTS_PATH
        ]


@pytest.fixture
def service() -> Iterator[FakeService]:
    server = FakeService()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.released.set()
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(service: FakeService, sleeps: list[float]) -> Iterator[Client]:
    with Client(service.url, "tok", sleep=sleeps.append) as client:
        yield client


def send(events: list[ev.Event], end: str) -> Callable[[Handler], None]:
    """A connection that sends events, then ends cleanly (`end`), drops, or hangs."""

    def script(handler: Handler) -> None:
        handler.start_stream()
        for event in events:
            handler.chunk(sse(event))
        if end == "end":
            handler.end_stream()
        elif end == "hang":
            handler.server.released.wait(30)

    return script


def test_follow_resumes_a_dropped_stream_after_the_last_seq(
    client: Client, service: FakeService, sleeps: list[float]
) -> None:
    events = run_events()
    service.stream(send(events[:3], "drop"), send(events[3:], "end"))
    followed = list(client.follow(RUN_ID))
    assert [event.seq for event in followed] == [1, 2, 3, 4, 5, 6, 7]
    assert isinstance(followed[-1], ev.Succeeded)
    assert service.last_event_ids() == ["0", "3"]
    assert sleeps == [], "a stream that delivered events is opened again at once"
    assert fold(followed).state == "succeeded"


def test_follow_opens_an_ended_stream_again_until_the_run_ends(
    client: Client, service: FakeService
) -> None:
    events = run_events()
    service.stream(send(events[:2], "end"), send(events[2:5], "end"), send(events[5:], "end"))
    assert [event.seq for event in client.follow(RUN_ID)] == [1, 2, 3, 4, 5, 6, 7]
    assert service.last_event_ids() == ["0", "2", "5"]


def test_follow_backs_off_while_no_event_arrives(
    client: Client, service: FakeService, sleeps: list[float]
) -> None:
    events = run_events()
    service.stream(send([], "drop"), send([], "end"), send([], "drop"), send(events, "end"))
    assert len(list(client.follow(RUN_ID))) == 7
    assert sleeps == [1.0, 2.0, 4.0]


def test_follow_skips_events_a_server_sends_twice(client: Client, service: FakeService) -> None:
    events = run_events()
    service.stream(send(events[:4], "drop"), send(events[2:], "end"))
    assert [event.seq for event in client.follow(RUN_ID)] == [1, 2, 3, 4, 5, 6, 7]


def test_an_unknown_event_type_keeps_its_seq_for_the_fold(
    client: Client, service: FakeService
) -> None:
    events = run_events()
    future = {"seq": 4, "time": "2025-01-02T03:04:05Z", "type": "future-thing", "x": 1}
    message = f"event: future-thing\nid: 4\ndata: {json.dumps(future)}\n\n".encode()
    shifted = [msgspec.structs.replace(event, seq=event.seq + 1) for event in events[3:]]

    def script(handler: Handler) -> None:
        handler.start_stream()
        for event in events[:3]:
            handler.chunk(sse(event))
        handler.chunk(b": keep-alive\n\n")
        handler.chunk(message)
        for event in shifted:
            handler.chunk(sse(event))
        handler.end_stream()

    service.stream(script)
    followed = list(client.follow(RUN_ID))
    assert [event.seq for event in followed] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert isinstance(followed[3], ev.UnknownEvent) and followed[3].kind == "future-thing"
    folder = RunFold()
    for event in followed:
        folder.apply(event)
    assert folder.record is not None
    assert folder.record.seq == 8 and folder.record.state == "succeeded"
    assert folder.record.progress["scan"].done == 3


def test_follow_stops_at_its_timeout_without_the_end(client: Client, service: FakeService) -> None:
    service.stream(send(run_events()[:1], "hang"))
    started = time.monotonic()
    followed = list(client.follow(RUN_ID, timeout_s=0.5))
    assert [event.seq for event in followed] == [1]
    assert 0.4 < time.monotonic() - started < 10


def test_follow_of_an_unknown_run_raises_the_refusal(client: Client, service: FakeService) -> None:
    with pytest.raises(ServiceError) as raised:
        list(client.follow("nope"))
    assert raised.value.status == 404
    assert raised.value.detail == "no route /runs/nope/events"


def test_a_refusal_carries_the_detail_of_the_service(client: Client, service: FakeService) -> None:
    service.routes[("POST", f"/runs/{RUN_ID}/cancel")] = lambda handler: handler.reply(
        409, {"status_code": 409, "detail": f"run {RUN_ID!r} has ended (failed)"}
    )
    service.routes[("GET", f"/runs/{RUN_ID}")] = lambda handler: handler.reply(
        500, b"Internal Server Error", "text/plain"
    )
    with pytest.raises(ServiceError) as raised:
        client.cancel(RUN_ID)
    assert (raised.value.status, raised.value.detail) == (409, f"run {RUN_ID!r} has ended (failed)")
    with pytest.raises(ServiceError) as raised:
        client.run(RUN_ID)
    assert (raised.value.status, raised.value.detail) == (500, "Internal Server Error")


def test_requests_carry_the_token(client: Client, service: FakeService) -> None:
    service.routes[("GET", "/me")] = lambda handler: handler.reply(
        200, {"name": "mk", "kind": "person", "owner": "mk"}
    )
    assert client.me().name == "mk"
    assert service.seen[-1][3]["Authorization"] == "Bearer tok"


def test_wait_repeats_the_long_poll_until_the_run_ended(
    client: Client, service: FakeService
) -> None:
    running = fold(run_events()[:3])
    ended = fold(run_events())
    answers = iter([running, running, ended])
    service.routes[("GET", f"/runs/{RUN_ID}/wait")] = lambda handler: handler.reply(
        200, msgspec.to_builtins(run_item(next(answers)))
    )
    item = client.wait(RUN_ID, timeout_s=None)
    assert item.state == "succeeded"
    timeouts = [
        float(query["timeout"][0]) for _, path, query, _ in service.seen if path.endswith("/wait")
    ]
    assert timeouts == [60.0, 60.0, 60.0]


def test_wait_asks_for_no_more_than_the_time_left(client: Client, service: FakeService) -> None:
    running = run_item(fold(run_events()[:3]))
    service.routes[("GET", f"/runs/{RUN_ID}/wait")] = lambda handler: handler.reply(
        200, msgspec.to_builtins(running)
    )
    item = client.wait(RUN_ID, timeout_s=0.3)
    assert item.state == "running"
    timeouts = [
        float(query["timeout"][0]) for _, path, query, _ in service.seen if path.endswith("/wait")
    ]
    assert timeouts and all(0 <= value <= 0.3 for value in timeouts)


def test_a_service_that_never_answered_is_named_by_its_url(sleeps: list[float]) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    server.server_close()
    with (
        Client(url, "tok", sleep=sleeps.append) as client,
        pytest.raises(ServiceUnreachable) as raised,
    ):
        client.wait(RUN_ID, timeout_s=30)
    assert str(raised.value).startswith(f"cannot reach the service at {url}")
    assert sleeps == []


def test_backoff_doubles_from_one_to_ten_seconds() -> None:
    delays = backoff_delays()
    assert [next(delays) for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_download_streams_a_file_by_its_quoted_path(client: Client, service: FakeService) -> None:
    content = bytes(range(256)) * 100
    path = f"/runs/{RUN_ID}/outputs/scan/squares/a%20b.bin"
    service.routes[("GET", path)] = lambda handler: handler.reply(
        200, content, "application/octet-stream"
    )
    chunks: list[bytes] = []
    assert client.download(RUN_ID, "scan", "squares/a b.bin", chunks.append) == len(content)
    assert b"".join(chunks) == content


def test_output_paths_that_leave_the_directory_are_refused(tmp_path: Path) -> None:
    assert output_target(tmp_path, "squares/1.json") == tmp_path / "squares" / "1.json"
    for bad in ("../x", "/etc/passwd", "", "a/../../b", "."):
        with pytest.raises(CliError, match="nothing was downloaded"):
            output_target(tmp_path, bad)


ARCHIVE_PATH = f"/runs/{RUN_ID}/tasks/scan/outputs.tar"


def tar_of(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    """A tar of members, each a TarInfo and the content of a regular file."""
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w") as archive:
        for member, content in members:
            if member.isreg():
                member.size = len(content)
            archive.addfile(member, io.BytesIO(content) if member.isreg() else None)
    return body.getvalue()


def regular(name: str, mode: int = 0o600) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.mode = mode
    return member


def serve_archive(service: FakeService, body: bytes) -> None:
    service.routes[("GET", ARCHIVE_PATH)] = lambda handler: handler.reply(
        200, body, "application/x-tar"
    )


def test_the_outputs_come_as_one_archive_extracted_into_a_new_directory(
    client: Client, service: FakeService, tmp_path: Path
) -> None:
    big = bytes(range(256)) * 9000
    body = tar_of(
        (regular("summary.json"), b"{}"),
        (regular("squares/deep/1.bin"), big),
        (regular("run.sh", 0o755), b"echo"),
    )
    serve_archive(service, body)
    seen: list[int] = []
    target = tmp_path / "new" / "results"
    written = download_outputs(client, RUN_ID, "scan", target, seen.append)
    assert written == [
        (target / "run.sh", 4),
        (target / "squares/deep/1.bin", len(big)),
        (target / "summary.json", 2),
    ]
    assert (target / "squares/deep/1.bin").read_bytes() == big
    assert sum(seen) == len(body), "progress counts every byte of the archive"
    assert os.access(target / "run.sh", os.X_OK) and not os.access(target / "summary.json", os.X_OK)
    assert sorted(path.name for path in target.iterdir()) == ["run.sh", "squares", "summary.json"]
    assert archive_size([OutputFile("summary.json", 2), OutputFile("a", 513)]) == 7 * 512


@pytest.mark.parametrize(
    "bad",
    ["link", "hardlink", "parent", "absolute", "fifo", "cut"],
)
def test_an_archive_that_is_cut_or_leads_out_leaves_nothing_behind(
    client: Client, service: FakeService, tmp_path: Path, bad: str
) -> None:
    first = (regular("a.txt"), b"a")
    if bad == "cut":
        body = tar_of(first, (regular("b.bin"), b"b" * 5000))[:2000]
    else:
        member = regular({"parent": "../evil.txt", "absolute": "/tmp/evil.txt"}.get(bad, "evil"))
        if bad == "link":
            member.type, member.linkname = tarfile.SYMTYPE, "/etc/passwd"
        elif bad == "hardlink":
            member.type, member.linkname = tarfile.LNKTYPE, "a.txt"
        elif bad == "fifo":
            member.type = tarfile.FIFOTYPE
        body = tar_of(first, (member, b"evil"))
    serve_archive(service, body)
    existing = tmp_path / "existing"
    existing.mkdir()
    for target in (tmp_path / "fresh" / "results", existing):
        with pytest.raises(CliError, match="nothing was"):
            download_outputs(client, RUN_ID, "scan", target)
    assert sorted(tmp_path.rglob("*")) == [existing], "no file, no staging, no new directory"


def test_a_dropped_archive_is_no_whole_download(
    client: Client, service: FakeService, tmp_path: Path
) -> None:
    body = tar_of((regular("a.bin"), b"a" * 100_000))

    def cut(handler: Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/x-tar")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body[:50_000])
        drop(handler)

    service.routes[("GET", ARCHIVE_PATH)] = cut
    with pytest.raises(CliError, match=r"did not arrive whole.*nothing was written"):
        download_outputs(client, RUN_ID, "scan", tmp_path / "results")
    assert list(tmp_path.iterdir()) == []


def drop(handler: Handler) -> None:
    """Close the connection without an answer, as a service that dies does."""
    handler.close_connection = True
    handler.connection.shutdown(2)


def test_wait_retries_a_dropped_connection_and_a_restarting_service(
    client: Client, service: FakeService, sleeps: list[float]
) -> None:
    running = msgspec.to_builtins(run_item(fold(run_events()[:3])))
    ended = msgspec.to_builtins(run_item(fold(run_events())))
    restarting = {"status_code": 503, "detail": "the service is starting"}
    answers = iter(
        [
            lambda h: h.reply(200, running),
            drop,
            lambda h: h.reply(503, restarting),
            drop,
            lambda h: h.reply(200, running),
            drop,
            lambda h: h.reply(200, ended),
        ]
    )
    service.routes[("GET", f"/runs/{RUN_ID}/wait")] = lambda handler: next(answers)(handler)
    item = client.wait(RUN_ID, timeout_s=None)
    assert item.state == "succeeded"
    assert sleeps == [1.0, 2.0, 4.0, 1.0], "the backoff starts again after an answer"


def test_wait_answers_the_last_summary_when_the_timeout_passes_in_an_outage(
    client: Client, service: FakeService, sleeps: list[float]
) -> None:
    running = msgspec.to_builtins(run_item(fold(run_events()[:3])))
    answers = iter([lambda h: h.reply(200, running)])
    service.routes[("GET", f"/runs/{RUN_ID}/wait")] = lambda handler: next(answers, drop)(handler)
    started = time.monotonic()
    item = client.wait(RUN_ID, timeout_s=1.5)
    assert item.state == "running"
    assert time.monotonic() - started < 10
    assert sleeps == [1.0], "no pause that passes the timeout"


def test_wait_does_not_retry_a_refusal(
    client: Client, service: FakeService, sleeps: list[float]
) -> None:
    service.routes[("GET", f"/runs/{RUN_ID}/wait")] = lambda handler: handler.reply(
        404, {"status_code": 404, "detail": "run does not exist"}
    )
    with pytest.raises(ServiceError, match="does not exist"):
        client.wait(RUN_ID, timeout_s=30)
    assert sleeps == []


def test_wait_follows_a_service_that_moved(service: FakeService, sleeps: list[float]) -> None:
    """A lost service is asked for again (`relocate`), e.g. the local one on another port."""
    ended = msgspec.to_builtins(run_item(fold(run_events())))
    service.routes[("GET", f"/runs/{RUN_ID}/wait")] = lambda handler: handler.reply(200, ended)
    gone = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    old = f"http://127.0.0.1:{gone.server_address[1]}"
    gone.server_close()
    asked: list[str] = []

    def relocate() -> tuple[str, str]:
        asked.append("where")
        return service.url, "new-token"

    with Client(old, "old-token", sleep=sleeps.append, relocate=relocate) as moved:
        assert moved.wait(RUN_ID, timeout_s=30).state == "succeeded"
        assert moved.base_url == service.url
    assert asked == ["where"] and sleeps == []
    assert service.seen[-1][3]["Authorization"] == "Bearer new-token"


def test_follow_opens_a_stream_again_after_a_503(
    client: Client, service: FakeService, sleeps: list[float]
) -> None:
    events = run_events()
    service.stream(
        send(events[:2], "drop"),
        lambda h: h.reply(503, {"status_code": 503, "detail": "starting"}),
        send(events[2:], "end"),
    )
    assert [event.seq for event in client.follow(RUN_ID)] == [1, 2, 3, 4, 5, 6, 7]
    assert sleeps == [1.0]


def reply_json(status: int, body: object) -> Callable[[Handler], None]:
    return lambda handler: handler.reply(status, body)


def test_the_routes_of_compare_cleanup_usage_servers_and_workers(
    client: Client, service: FakeService
) -> None:
    table = {"columns": ["run", "squares.sum"], "rows": [{"run": RUN_ID, "squares.sum": 4}]}
    removed = {"runs": [RUN_ID], "snapshots": ["snapshots/x"], "bytes_freed": 9, "dry_run": True}
    pod = {"run_id": RUN_ID, "task_id": "scan", "pod": "w0", "phase": "Running"}
    server = {"name": "here", "cores": 8, "memory_gb": 16, "gpus": 0, "reserved_by": None}
    worker = {
        "worker": "w0",
        "node": "here",
        "state": "done",
        "attempts": 1,
        "processes": 2,
        "units_done": 3,
        "units_claimed": 3,
        "peak_memory_gb": 0.1,
        "memory_limit_gb": 1.0,
        "oom_killed": False,
    }
    service.routes[("POST", "/compare")] = reply_json(200, table)
    service.routes[("POST", "/cleanup")] = reply_json(200, removed)
    service.routes[("DELETE", f"/runs/{RUN_ID}")] = reply_json(200, {**removed, "dry_run": False})
    service.routes[("GET", "/usage")] = reply_json(200, {"runs": {RUN_ID: 9}, "groups": {"": 9}})
    service.routes[("GET", "/servers")] = reply_json(
        200, [{**server, "pods": [{**pod, "cores": 1, "memory_gb": 0.5}]}]
    )
    service.routes[("GET", f"/runs/{RUN_ID}/tasks/scan/workers")] = reply_json(200, [worker])
    service.routes[("GET", f"/runs/{RUN_ID}/progress")] = reply_json(
        200, msgspec.to_builtins(progress_view(fold(run_events()[:5])))
    )

    assert client.compare([RUN_ID, "other"]).rows == [{"run": RUN_ID, "squares.sum": 4}]
    assert json.loads(service.body_of("POST", "/compare")) == {"runs": [RUN_ID, "other"]}
    result = client.cleanup(CleanupRequest(older_than_days=7, group="g", dry_run=True))
    assert result.runs == [RUN_ID] and result.dry_run
    assert json.loads(service.body_of("POST", "/cleanup")) == {
        "older_than_days": 7.0,
        "group": "g",
        "failed_only": False,
        "dry_run": True,
    }
    assert client.delete(RUN_ID).bytes_freed == 9
    assert client.usage().runs == {RUN_ID: 9}
    [here] = client.servers()
    assert here.name == "here" and here.pods[0].task_id == "scan"
    [w0] = client.workers(RUN_ID, "scan")
    assert w0.units_done == 3 and w0.state == "done"
    progress = client.progress(RUN_ID)
    assert progress.tasks["scan"].done == 2 and progress.tasks["scan"].units == 3


def test_updates_read_the_runs_and_the_servers_of_the_event_stream(
    client: Client, service: FakeService, sleeps: list[float]
) -> None:
    runs = [msgspec.to_builtins(run_item(fold(run_events()[:3])))]
    servers = [
        {"name": "here", "cores": 8, "memory_gb": 16, "gpus": 0, "reserved_by": None, "pods": []}
    ]

    def first(handler: Handler) -> None:
        handler.start_stream()
        handler.chunk(f"event: runs\ndata: {json.dumps(runs)}\n\n".encode())
        handler.chunk(b": keep-alive\n\n")
        handler.chunk(b"event: future\ndata: {}\n\n")

    def second(handler: Handler) -> None:
        handler.start_stream()
        handler.chunk(f"event: servers\ndata: {json.dumps(servers)}\n\n".encode())
        handler.server.released.wait(30)

    connections = iter([first, second])
    service.routes[("GET", "/events")] = lambda handler: next(connections)(handler)
    updates = client.updates(timeout_s=20)
    got = [next(updates), next(updates)]
    updates.close()
    assert isinstance(got[0], RunsUpdate) and got[0].runs[0].id == RUN_ID
    assert isinstance(got[1], ServersUpdate) and got[1].servers[0].name == "here"
    assert sleeps == [], "a stream that sent an update is opened again at once"


@pytest.fixture
def ca_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The loads of certifi's CA bundle (an SSL context that verifies) from now on."""
    import certifi

    loads: list[str] = []
    where = certifi.where
    monkeypatch.setattr(certifi, "where", lambda: loads.append("ca") or where())
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    return loads


def test_a_plain_http_client_builds_no_verifying_ssl_context(
    service: FakeService, ca_loads: list[str]
) -> None:
    service.routes[("GET", "/me")] = lambda handler: handler.reply(
        200, {"name": "me", "kind": "person", "owner": "me"}
    )
    with Client(service.url, "tok") as plain:
        assert plain.me().name == "me"
    assert ca_loads == []


def test_an_https_client_still_verifies_certificates(ca_loads: list[str]) -> None:
    with Client("https://127.0.0.1:1", "tok"):
        pass
    assert ca_loads, "https keeps an SSL context that verifies with certifi's CA bundle"


def test_a_client_takes_over_an_open_httpx_client(service: FakeService) -> None:
    service.routes[("GET", "/me")] = lambda handler: handler.reply(
        200, {"name": "me", "kind": "person", "owner": "me"}
    )
    http = httpx.Client(timeout=1.0, headers={"X-Probe": "1"})
    with Client(service.url, "tok", http=http) as taken:
        assert taken.me().name == "me"
    headers = service.seen[-1][3]
    assert headers["Authorization"] == "Bearer tok" and "X-Probe" not in headers
    assert http.is_closed, "the client closes the one it took over"
