"""The client side of the local service: `.simrun/`, `service.json`, the instance check, start."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_helpers import wait_until

from simrun_cli import local
from simrun_cli.connect import local_client
from simrun_cli.local import (
    ensure_local,
    environment,
    local_dir,
    pid_alive,
    read_service,
    running_service,
    stop_local,
)

FAKE = Path(__file__).with_name("fake_local_service.py")


def write_service(root: Path, **fields: object) -> None:
    """Write `.simrun/service.json` with defaults for the fields not given."""
    info: dict[str, object] = {
        "instance": "abc",
        "pid": os.getpid(),
        "port": 4321,
        "token": "secret",
        "url": "http://127.0.0.1:4321",
    }
    info.update(fields)
    local_dir(root)
    (root / ".simrun" / "service.json").write_text(json.dumps(info))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def starts(root: Path) -> list[list[str]]:
    """The starts the fake service recorded: pid and SIMRUN_BACKGROUND."""
    path = root / ".simrun" / "starts.txt"
    return [line.split(" ") for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def fake_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ensure_local` starts the fake service instead of `simrun serve --local`.

    The fake records the environment of this process: its own `sys.path` may see other
    distributions (`python -m pytest` puts the current directory on the path).
    """
    monkeypatch.setattr(local, "serve_command", lambda: [sys.executable, str(FAKE)])
    monkeypatch.setenv("FAKE_TYPES", local.environment()["types"])


class Recorder(ThreadingHTTPServer):
    """A server on 127.0.0.1 answering an instance, recording every request and its token."""

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self.requests: list[tuple[str, str | None]] = []
        super().__init__(("127.0.0.1", 0), RecorderHandler)


class RecorderHandler(BaseHTTPRequestHandler):
    server: Recorder

    def do_GET(self) -> None:
        self.server.requests.append((self.path, self.headers.get("Authorization")))
        if self.path == "/local/instance":
            body = json.dumps({"instance": self.server.instance}).encode()
            status = 200
        elif self.path == "/me":
            body, status = b'{"name": "me", "kind": "person", "owner": "me"}', 200
        else:
            body, status = b"{}", 404
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder("right")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_local_dir_ignores_everything_in_git(tmp_path: Path) -> None:
    directory = local_dir(tmp_path)
    assert directory == tmp_path / ".simrun"
    assert (directory / ".gitignore").read_text() == "*\n"
    assert local_dir(tmp_path) == directory


def test_read_service_reads_the_file(tmp_path: Path) -> None:
    write_service(tmp_path, python="/usr/bin/python3", background=True)
    info = read_service(tmp_path)
    assert info is not None
    assert (info.instance, info.port, info.token, info.url) == (
        "abc",
        4321,
        "secret",
        "http://127.0.0.1:4321",
    )
    assert info.background is True and info.python == "/usr/bin/python3"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:4322",
        "http://localhost:4321",
        "http://10.0.0.1:4321",
        "https://127.0.0.1:4321",
    ],
)
def test_read_service_refuses_a_url_that_is_not_its_port_on_loopback(
    tmp_path: Path, url: str
) -> None:
    write_service(tmp_path, url=url)
    assert read_service(tmp_path) is None


def test_read_service_without_a_readable_record_is_none(tmp_path: Path) -> None:
    assert read_service(tmp_path) is None
    local_dir(tmp_path)
    (tmp_path / ".simrun" / "service.json").write_text('{"instance": "abc", "pid": 1')
    assert read_service(tmp_path) is None
    (tmp_path / ".simrun" / "service.json").write_text('{"instance": "abc"}')
    assert read_service(tmp_path) is None


def test_pid_alive_tells_live_dead_and_zombie_processes_apart() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(0)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    assert not pid_alive(ended.pid)
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])

    def is_zombie() -> bool:
        stat = Path(f"/proc/{zombie.pid}/stat").read_text()
        return stat.rpartition(")")[2].split()[0] == "Z"

    wait_until(is_zombie, what="the child to end unreaped")
    assert not pid_alive(zombie.pid)
    zombie.wait()


def test_the_token_goes_only_to_the_server_that_answers_the_instance(
    tmp_path: Path, recorder: Recorder
) -> None:
    port = recorder.server_address[1]
    write_service(tmp_path, instance="wrong", port=port, url=f"http://127.0.0.1:{port}")
    assert running_service(tmp_path) is None
    assert recorder.requests == [("/local/instance", None)]

    recorder.requests.clear()
    write_service(tmp_path, instance="right", port=port, url=f"http://127.0.0.1:{port}")
    info = running_service(tmp_path)
    assert info is not None and info.instance == "right"
    assert recorder.requests == [("/local/instance", None), ("/me", "Bearer secret")]


def test_the_probes_and_the_command_share_one_http_client(
    tmp_path: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`local_client` probes the service and sends the requests of the command with one httpx
    client (each new one costs an SSL context), the token still only after the instance."""
    made: list[httpx.Client] = []
    init = httpx.Client.__init__

    def counted(self: httpx.Client, *args: Any, **kwargs: Any) -> None:
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(httpx.Client, "__init__", counted)
    port = recorder.server_address[1]
    write_service(
        tmp_path, instance="right", port=port, url=f"http://127.0.0.1:{port}", **environment()
    )
    warnings: list[str] = []
    with local_client(tmp_path, warn=warnings.append) as client:
        assert client.me().name == "me"
    assert recorder.requests == [
        ("/local/instance", None),
        ("/me", "Bearer secret"),
        ("/me", "Bearer secret"),
    ]
    assert len(made) == 1 and made[0].is_closed
    assert warnings == []


def test_a_dead_pid_is_not_asked_anything(tmp_path: Path, recorder: Recorder) -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    port = recorder.server_address[1]
    write_service(
        tmp_path, instance="right", pid=ended.pid, port=port, url=f"http://127.0.0.1:{port}"
    )
    assert running_service(tmp_path) is None
    assert recorder.requests == []


def test_ensure_local_starts_one_service_in_the_background(
    project: Path, fake_service: None
) -> None:
    results = []

    def call() -> None:
        results.append(ensure_local(project, timeout_s=20))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4
    assert len({info.instance for info in results}) == 1
    [[pid, background]] = starts(project)
    assert int(pid) == results[0].pid
    assert background == "1"
    assert os.getpgid(results[0].pid) == results[0].pid, "the service runs in its own session"
    started_with = Path(f"/proc/{results[0].pid}/environ").read_bytes().split(b"\0")
    assert b"PYTHONMALLOC=malloc" in started_with, "its objects from malloc (service_allocator)"
    assert ensure_local(project).instance == results[0].instance
    assert len(starts(project)) == 1


def test_ensure_local_reports_the_log_of_a_service_that_exits(
    project: Path, fake_service: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "exit")
    with pytest.raises(RuntimeError, match=r"exited with code 4") as raised:
        ensure_local(project, timeout_s=20)
    assert "boom: the fake service cannot start" in str(raised.value)


def test_ensure_local_gives_up_after_its_timeout(
    project: Path, fake_service: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MODE", "silent")
    try:
        with pytest.raises(RuntimeError, match=r"did not answer within 0.5 s"):
            ensure_local(project, timeout_s=0.5)
    finally:
        for pid, _ in starts(project):
            os.kill(int(pid), 9)


def test_ensure_local_starts_again_once_an_ending_service_ended(
    project: Path, fake_service: None
) -> None:
    ending = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        port = free_port()
        write_service(project, pid=ending.pid, port=port, url=f"http://127.0.0.1:{port}")
        results = []
        thread = threading.Thread(target=lambda: results.append(ensure_local(project, 20)))
        thread.start()
        wait_until(lambda: len(starts(project)) == 1, what="the first start")
        first = int(starts(project)[0][0])
        wait_until(lambda: not pid_alive(first), what="the first start to be refused")
        assert results == []
    finally:
        ending.kill()
        ending.wait()
    thread.join()
    assert len(starts(project)) == 2
    assert results and results[0].pid == int(starts(project)[1][0])


def test_stop_local_stops_the_service_and_waits_for_its_end(
    project: Path, fake_service: None
) -> None:
    info = ensure_local(project, timeout_s=20)
    stopped = stop_local(project, timeout_s=20)
    assert stopped is not None and stopped.pid == info.pid
    assert not pid_alive(info.pid)
    assert not (project / ".simrun" / "service.json").exists()
    assert stop_local(project) is None


def test_stop_local_does_not_signal_a_process_that_is_not_the_service(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        port = free_port()
        write_service(tmp_path, pid=other.pid, port=port, url=f"http://127.0.0.1:{port}")
        with pytest.raises(RuntimeError, match=rf"pid {other.pid} .* not stopping it"):
            stop_local(tmp_path)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
