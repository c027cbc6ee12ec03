"""Bad input over real HTTP: oversized bodies are refused with 413 before they are read whole,
and no path of a run, a task, an output or a log leads to a file out of the run directory.

Requests whose target must reach the service as written (`..`, `%00`, `//`) go through
`http.client`, which sends the target verbatim; httpx would normalise the dot segments away.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import select
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from live_service import command, python, run_processes, wait_until
from service_helpers import ConfiguredService, start_configured_service, stop_configured_service

from simrun_api.settings import load_settings

LIMIT = 8 * 1024**2
PASSWD = Path("/etc/passwd")
SECRET = b"root:"  # in every /etc/passwd
SLEEP = python("import time; time.sleep(600)")

PLANT = (
    "import os, sys, pathlib; out = pathlib.Path(sys.argv[1], 'out'); out.mkdir(); "
    "(out / 'ok.txt').write_text('fine'); "
    "os.symlink('/etc/passwd', out / 'passwd'); "
    "os.symlink('/etc', out / 'etc'); "
    "os.symlink('ok.txt', out / 'inside'); "
    "os.mkfifo(out / 'pipe'); "
    "print('planted')"
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfiguredService]:
    started = start_configured_service(tmp_path_factory.mktemp("bad-input"))
    try:
        yield started
    finally:
        assert stop_configured_service(started) == 0


@pytest.fixture(scope="module")
def planted(service: ConfiguredService) -> str:
    """An ended run whose task planted in its `out/` a link to /etc/passwd, a link to /etc, a
    link to a file beside it and a FIFO."""
    run = service.submit(
        "mk", {"name": "plant", "tasks": [command("t", [*python(PLANT), "{out}"])]}
    )
    end = service.wait(run["id"])
    assert end["state"] == "succeeded", end
    out = service.run_dir(run["id"]) / "tasks/t/out/out"
    assert (out / "passwd").is_symlink() and (out / "passwd").read_bytes() == PASSWD.read_bytes()
    assert (out / "etc").is_symlink() and (out / "pipe").is_fifo()
    return run["id"]


def address(service: ConfiguredService) -> tuple[str, int]:
    parts = urlsplit(service.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def raw_request(
    service: ConfiguredService, method: str, target: str, token: str | None = "t-mk"
) -> tuple[int, bytes]:
    """Send `target` exactly as written; the status and the body."""
    host, port = address(service)
    connection = http.client.HTTPConnection(host, port, timeout=15)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        connection.request(method, target, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def detail(body: bytes) -> str:
    return json.loads(body)["detail"]


# Bodies.


def head(service: ConfiguredService, length: str, token: str | None = "t-mk") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST /validate HTTP/1.1\r\nHost: {address(service)[0]}\r\n{auth}"
        f"Content-Type: application/json\r\n{length}\r\n"
    ).encode()


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of the one response on a socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended before a response: {data!r}"
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
    }
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "the connection ended within the body of the response"
        body += chunk
    return status, headers, body


def send_until_answered(sock: socket.socket, cap: int) -> int:
    """Send a chunked body of `x` until the service answers (or `cap` bytes); the bytes sent."""
    chunk = b"x" * 65536
    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    sent = 0
    while sent < cap:
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            break
        try:
            sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += len(chunk)
    return sent


def cut_off(sock: socket.socket, cap: int) -> bool:
    """Whether the service ends the connection while more of the body comes: before `cap`
    further bytes are sent, a send fails or the socket reads its end."""
    chunk = b"x" * 65536
    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"
    sent = 0
    deadline = time.monotonic() + 30
    while sent < cap and time.monotonic() < deadline:
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable and sock.recv(65536) == b"":
                return True
            sock.sendall(frame)
        except (BrokenPipeError, ConnectionResetError):
            return True
        sent += len(chunk)
    return False


def test_the_limit_is_8_mib_by_default_and_a_setting(tmp_path):
    base = "store: s\ndb: d.sqlite\ntokens: t.yaml\nowner: mk\n"
    (tmp_path / "a.yaml").write_text(base)
    assert load_settings(tmp_path / "a.yaml").max_body_bytes == LIMIT
    (tmp_path / "b.yaml").write_text(base + "max_body_bytes: 1024\n")
    assert load_settings(tmp_path / "b.yaml").max_body_bytes == 1024


def test_a_body_over_the_limit_is_refused_and_one_under_it_is_read(service):
    client = service.clients["mk"]
    # 9 MiB is below litestar's own default of 10 MB: the refusal is the service's limit.
    over = json.dumps({"workflow": {"name": "x" * (LIMIT + LIMIT // 8), "tasks": []}})
    refused = client.post("/validate", content=over, headers={"content-type": "application/json"})
    assert refused.status_code == 413, refused.text
    assert str(LIMIT) in refused.json()["detail"] and "max_body_bytes" in refused.json()["detail"]
    under = json.dumps({"workflow": {"name": "x" * (LIMIT - 1024), "tasks": []}})
    read = client.post("/validate", content=under, headers={"content-type": "application/json"})
    assert read.status_code == 200, read.text[:300]
    assert read.headers.get("connection") != "close"


def test_a_content_length_over_the_limit_is_refused_before_a_byte_of_the_body(service):
    with socket.create_connection(address(service), timeout=15) as sock:
        sock.sendall(head(service, f"Content-Length: {2**40}\r\n"))
        status, headers, body = read_response(sock)
        assert status == 413, body
        assert str(LIMIT) in detail(body)
        assert headers["connection"] == "close"
        assert sock.recv(65536) == b""


@pytest.mark.parametrize("token", ["t-mk", None], ids=["token", "no-token"])
def test_a_chunked_body_without_a_length_is_cut_off_at_the_limit(service, token):
    """The service answers while the body still comes (413, or 401 unread) and ends the
    connection: it does not go on receiving and discarding a body without end."""
    cap = 256 * 1024**2
    with socket.create_connection(address(service), timeout=15) as sock:
        sock.sendall(head(service, "Transfer-Encoding: chunked\r\n", token))
        sent = send_until_answered(sock, cap)
        assert sent < cap, "no answer while 256 MiB of the body were sent"
        status, headers, body = read_response(sock)
        assert status == (413 if token else 401), body
        assert headers["connection"] == "close"
        if token:
            assert sent > LIMIT  # the bytes up to the limit were read, then no more
        assert cut_off(sock, cap), "the service went on reading the body after its answer"


def test_a_client_streaming_a_large_body_gets_the_413(service):
    chunks = (b"x" * 65536 for _ in range(3 * LIMIT // 65536))
    response = service.clients["mk"].post(
        "/runs", content=chunks, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert "max_body_bytes" in response.json()["detail"]
    assert service.clients["mk"].get("/me").status_code == 200


@pytest.mark.parametrize("path", ["/validate", "/runs", "/estimate", "/compare", "/cleanup"])
def test_a_body_nested_too_deeply_is_refused_with_400_or_as_a_workflow(service, path):
    """msgspec raises RecursionError past the recursion limit; it is no 500. The routes of
    workflows refuse it as they refuse any workflow, with 422."""
    status = 422 if path in ("/validate", "/runs", "/estimate") else 400
    for depth in (2_000, 100_000):
        for nested in ("[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth):
            response = service.clients["mk"].post(
                path, content=nested, headers={"content-type": "application/json"}
            )
            assert response.status_code == status, (depth, response.text)
            assert response.json()["detail"] == "the JSON body is nested too deeply"


@pytest.mark.parametrize("days", [1e6, 2.86e16, 1.7e308])
def test_a_cleanup_older_than_any_date_removes_nothing(service, days):
    """`now - older_than_days` before the year 1 overflowed into a 500 (found by
    test_schemathesis.py)."""
    for dry_run in (True, False):
        body = {"older_than_days": days, "dry_run": dry_run}
        response = service.clients["mk"].post("/cleanup", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["runs"] == [] and response.json()["bytes_freed"] == 0


# Paths.

RUN_ROUTES = [
    ("GET", "/runs/{run}"),
    ("DELETE", "/runs/{run}"),
    ("GET", "/runs/{run}/wait?timeout=0"),
    ("GET", "/runs/{run}/progress"),
    ("GET", "/runs/{run}/history"),
    ("GET", "/runs/{run}/events"),
    ("POST", "/runs/{run}/cancel"),
    ("GET", "/runs/{run}/tasks/{task}/workers"),
    ("GET", "/runs/{run}/logs/{task}"),
    ("GET", "/runs/{run}/outputs/{task}"),
    ("GET", "/runs/{run}/outputs/{task}/out/ok.txt"),
    ("GET", "/runs/{run}/tasks/{task}/outputs.tar"),
]
BAD_IDS = [
    "..",
    "%2e%2e",
    "..%2f..%2f..%2fetc",
    "%2fetc%2fpasswd",
    "%00",
    "20260101-000000-abcdef%00",
    "20260101-000000-abcdef%2f..",
    ".",
    "~",
]


def assert_refused(status: int, body: bytes, what: object) -> None:
    assert status in (400, 404, 405), (what, status, body[:300])
    assert detail(body), what
    assert SECRET not in body, what


def test_every_route_refuses_a_run_id_that_is_a_path(service, planted):
    for method, route in RUN_ROUTES:
        for bad in BAD_IDS:
            target = route.format(run=bad, task="t")
            status, body = raw_request(service, method, target)
            assert_refused(status, body, (method, target))
            if "{task}" in route:
                target = route.format(run=planted, task=bad)
                status, body = raw_request(service, method, target)
                assert_refused(status, body, (method, target))
    ok = raw_request(service, "GET", f"/runs/{planted}/outputs/t/out/ok.txt")
    assert ok == (200, b"fine")


def test_the_compare_of_run_ids_that_are_paths_is_refused(service, planted):
    for bad in ("..", "../../etc", "/etc/passwd", "\0", f"{planted}/.."):
        response = service.clients["mk"].post("/compare", json={"runs": [planted, bad]})
        assert response.status_code == 404, (bad, response.text)
        assert "does not exist" in response.json()["detail"]


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("../../../../../../../../etc/passwd", 400),
        ("out/../../events.jsonl", 400),
        ("%2e%2e/%2e%2e/%2e%2e/events.jsonl", 400),
        ("out/%2e%2e/%2e%2e/%2e%2e/settings.json", 400),
        # The router folds `//` and `/%2f` into one `/`: an absolute path arrives relative.
        ("/etc/passwd", 404),
        ("/%2fetc/passwd", 404),
        ("out/ok.txt%00.png", 400),
        ("out/passwd", 404),
        ("out/etc/passwd", 404),
        ("out/inside", 404),
        ("out/pipe", 404),
        ("out/missing", 404),
        ("out", 404),
    ],
)
def test_an_output_path_out_of_the_outputs_is_refused(service, planted, path, status):
    started = time.monotonic()
    got, body = raw_request(service, "GET", f"/runs/{planted}/outputs/t/{path}")
    assert got == status, (path, body)
    assert SECRET not in body
    if "%00" in path:
        assert "NUL byte" in detail(body)  # refused before any route (simrun_api.browsers)
    elif status == 400:
        assert "not a relative path inside the outputs" in detail(body)
    else:
        assert "has no output" in detail(body)
    if path in ("out/passwd", "out/inside"):
        assert "links are not followed" in detail(body)
    assert time.monotonic() - started < 10  # the FIFO is not read


def test_the_outputs_list_only_the_regular_files_and_follow_no_link(service, planted):
    listed = service.clients["mk"].get(f"/runs/{planted}/outputs/t")
    assert listed.status_code == 200, listed.text
    assert listed.json() == {
        "files": [{"path": f"runs/{planted}/tasks/t/out/out/ok.txt", "bytes": 4}],
        "left_out": 0,
    }
    file = service.clients["mk"].get(f"/runs/{planted}/outputs/t/out/ok.txt")
    assert file.content == b"fine" and file.headers["content-length"] == "4"
    assert file.headers["content-disposition"] == "attachment; filename*=utf-8''ok.txt"


def test_the_archive_of_the_outputs_holds_the_regular_files_only(service, planted):
    started = time.monotonic()
    response = service.clients["mk"].get(f"/runs/{planted}/tasks/t/outputs.tar")
    assert response.status_code == 200, response.text
    assert SECRET not in response.content
    with tarfile.open(fileobj=io.BytesIO(response.content)) as archive:
        assert [(m.name, m.size, m.isreg()) for m in archive] == [("out/ok.txt", 4, True)]
    assert time.monotonic() - started < 10  # the FIFO is not read


def test_serving_and_refusing_outputs_leaves_no_descriptor_open(service, planted):
    def descriptors() -> int:
        return len(os.listdir(f"/proc/{service.process.pid}/fd"))

    client = service.clients["mk"]
    client.get("/me")
    before = descriptors()
    for _ in range(50):
        for path in ("out/ok.txt", "out/passwd", "out/etc/passwd", "out/pipe", "out/missing"):
            client.get(f"/runs/{planted}/outputs/t/{path}")
        client.get(f"/runs/{planted}/outputs/t")
        with client.stream("GET", f"/runs/{planted}/outputs/t/out/ok.txt"):
            pass  # dropped unread
        with client.stream("GET", f"/runs/{planted}/tasks/t/outputs.tar"):
            pass
    wait_until(lambda: descriptors() <= before + 2, what=f"the {before} descriptors again")


def test_an_output_directory_swapped_for_a_link_is_refused(service, tmp_path):
    run = service.submit("mk", {"name": "swap", "tasks": [command("t", [*python(PLANT), "{out}"])]})
    assert service.wait(run["id"])["state"] == "succeeded"
    task = service.run_dir(run["id"]) / "tasks/t"
    (task / "out").rename(task / "out-real")
    os.symlink("/etc", task / "out")
    client = service.clients["mk"]
    listed = client.get(f"/runs/{run['id']}/outputs/t")
    assert listed.status_code == 404, listed.text
    assert "out/ is a link" in listed.json()["detail"]
    for path in ("passwd", "out/ok.txt"):
        response = client.get(f"/runs/{run['id']}/outputs/t/{path}")
        assert response.status_code == 404 and SECRET not in response.content, path
    # a link on the way: tasks/t itself
    (task / "out").unlink()
    (task / "out-real").rename(task / "out")
    task.rename(task.with_name("t-real"))
    os.symlink(task.with_name("t-real"), task)
    for path in (f"/runs/{run['id']}/outputs/t", f"/runs/{run['id']}/outputs/t/out/ok.txt"):
        assert client.get(path).status_code == 404, path


def test_a_log_that_is_a_link_is_not_served(service):
    talk = python("print('hello from talk')")
    run = service.submit("mk", {"name": "logs", "tasks": [command("talk", talk)]})
    assert service.wait(run["id"])["state"] == "succeeded"
    logs = service.run_dir(run["id"]) / "tasks/talk/logs"
    assert json.loads((logs / "index.json").read_text()) == ["talk-0"]
    (logs / "index.json").write_text('["talk-0", "evil-0"]')
    os.symlink(PASSWD, logs / "evil-0.log")
    client = service.clients["mk"]
    text = client.get(f"/runs/{run['id']}/logs/talk", params={"tail_lines": 0})
    assert text.status_code == 200
    assert text.text == "==> talk-0.log <==\nhello from talk\n"

    (logs / "talk-0.log").unlink()
    os.symlink(PASSWD, logs / "talk-0.log")
    text = client.get(f"/runs/{run['id']}/logs/talk", params={"tail_lines": 0})
    assert text.status_code == 200 and text.text == ""

    logs.rename(logs.with_name("logs-real"))
    os.symlink("/etc", logs)
    refused = client.get(f"/runs/{run['id']}/logs/talk")
    assert refused.status_code == 404 and "logs/ is a link" in refused.json()["detail"]


def test_a_live_log_that_is_a_link_is_not_served(service):
    run = service.submit("mk", {"name": "live", "tasks": [command("sleep", SLEEP)]})
    try:
        wait_until(lambda: run_processes(run["id"]), what="the sleeper")
        logs = service.run_dir(run["id"]) / "tasks/sleep/logs"
        wait_until(lambda: (logs / "sleep-0.log").exists(), what="the live log")
        os.symlink(PASSWD, logs / "evil-0.log")
        text = service.clients["mk"].get(f"/runs/{run['id']}/logs/sleep")
        assert text.status_code == 200
        assert "evil" not in text.text and "root:" not in text.text
        assert "==> sleep-0.log <==" in text.text
    finally:
        service.clients["mk"].post(f"/runs/{run['id']}/cancel")
        service.wait(run["id"])


def test_compare_does_not_follow_a_summary_that_is_a_link(service, tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text('{"token": "secret-of-another-file"}')
    write = "import sys, pathlib; pathlib.Path(sys.argv[1]).mkdir(exist_ok=True)"
    run = service.submit("mk", {"name": "cmp", "tasks": [command("t", [*python(write), "{out}"])]})
    assert service.wait(run["id"])["state"] == "succeeded"
    os.symlink(outside, service.run_dir(run["id"]) / "tasks/t/out/summary.json")
    table = service.clients["mk"].post("/compare", json={"runs": [run["id"]]})
    assert table.status_code == 200
    assert "secret-of-another-file" not in table.text


def test_compare_does_not_follow_an_out_directory_that_is_a_link(service, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "summary.json").write_text('{"token": "secret-of-another-file"}')
    run = service.submit("mk", {"name": "cmp", "tasks": [command("t", python("pass"))]})
    assert service.wait(run["id"])["state"] == "succeeded"
    out = service.run_dir(run["id"]) / "tasks/t/out"
    if out.exists():
        out.rmdir()
    os.symlink(outside, out)
    table = service.clients["mk"].post("/compare", json={"runs": [run["id"]]})
    assert table.status_code == 200
    assert "secret-of-another-file" not in table.text
    assert table.json()["rows"][0]["run"] == run["id"]


def requests_meanwhile(service: ConfiguredService, send: Callable[[], None]) -> list[float]:
    """The seconds of each `GET /me` asked again and again while `send` runs in a thread."""
    done = threading.Event()

    def sending() -> None:
        try:
            send()
        finally:
            done.set()

    sender = threading.Thread(target=sending)
    sender.start()
    waits: list[float] = []
    try:
        while not done.is_set():
            started = time.monotonic()
            assert service.clients["ann"].get("/me").status_code == 200
            waits.append(time.monotonic() - started)
    finally:
        sender.join(300)
    return waits


def test_a_compare_of_one_run_asked_many_times_does_not_hold_the_other_requests(service, planted):
    """The body limit lets a compare name a run 250,000 times: each row is the run's, and
    reading it that often held every other request (20,000 held `/me` 1.7 s)."""
    asked = [planted] * 250_000
    answers: list[httpx.Response] = []
    waits = requests_meanwhile(
        service,
        lambda: answers.append(service.clients["mk"].post("/compare", json={"runs": asked})),
    )
    assert answers[0].status_code == 200, answers[0].text[:500]
    rows = answers[0].json()["rows"]
    assert len(rows) == len(asked) and {row["run"] for row in rows} == {planted}
    assert waits and max(waits) < 2.0, max(waits)


def test_an_output_glob_longer_than_its_limit_is_refused_at_once(service, planted):
    """A glob is compiled to a pattern in time that grows with the square of its length (9 KiB
    of `[a-` took a second of the service's CPU, 36 KiB 12 s): one of more than 1,024
    characters is refused naming the limit, by the listing and by the archive alike."""
    long = "[a-" * 3000
    for route in (f"/runs/{planted}/outputs/t", f"/runs/{planted}/tasks/t/outputs.tar"):
        response = service.clients["ann"].get(route, params={"glob": long})
        assert response.status_code == 400, (route, response.text[:300])
        assert "glob" in response.text and "1024" in response.text, response.text[:300]
    fine = service.clients["ann"].get(
        f"/runs/{planted}/outputs/t", params={"glob": "*" * (1024 - len("ok.txt")) + "ok.txt"}
    )
    assert fine.status_code == 200, fine.text
    assert [file["path"].rsplit("/", 1)[-1] for file in fine.json()["files"]] == ["ok.txt"]


def test_a_task_id_longer_than_its_limit_is_refused_naming_it_and_the_longest_runs(service):
    """A task id names directories and files of the store: one of 300 characters passed the
    checks and was answered 507, as if the store were full."""
    refused = service.clients["ann"].post(
        "/runs", json={"workflow": {"name": "long", "tasks": [command("a" * 300, ["true"])]}}
    )
    assert refused.status_code == 422, refused.text[:300]
    assert "id: 300 characters, at most 63" in refused.json()["detail"]
    checked = service.clients["ann"].post(
        "/validate", json={"workflow": {"name": "long", "tasks": [command("b" * 64, ["true"])]}}
    )
    assert checked.json()["ok"] is False
    assert "at most 63" in checked.json()["errors"][0]
    longest = service.submit("ann", {"name": "long", "tasks": [command("c" * 63, ["true"])]})
    assert service.wait(longest["id"])["state"] == "succeeded"


@pytest.mark.parametrize(("shape", "count"), [("independent", 20_000), ("chain", 3000)])
def test_a_workflow_of_thousands_of_tasks_does_not_hold_the_other_requests(service, shape, count):
    """3,000 tasks (half a MiB of body): ordering them took time growing with the square of
    their number, on the event loop (`POST /validate` held `/me` 23 s); 20,000 (3.5 MiB) held
    it 2.4 s checking and planning them. A chain reads each task from the one before, in
    reverse file order, the longest way to order them."""
    tasks = [command(f"t{index}", ["true"]) for index in range(count)]
    if shape == "chain":
        for index in range(count - 1):
            tasks[index]["inputs"] = {"x": f"t{index + 1}.out"}
    answers: list[httpx.Response] = []
    waits = requests_meanwhile(
        service,
        lambda: answers.append(
            service.clients["mk"].post(
                "/validate", json={"workflow": {"name": "w", "tasks": tasks}}
            )
        ),
    )
    assert answers[0].status_code == 200, answers[0].text[:300]
    assert answers[0].json()["errors"] == []
    assert waits and max(waits) < 2.0, max(waits)


def test_the_yaml_of_a_workflow_of_thousands_of_tasks_does_not_hold_the_other_requests(service):
    """`POST /workflow-yaml` (the Editor's save and download) of 20,000 tasks held `/me` 4 s
    while the YAML was written on the event loop."""
    tasks = [command(f"t{index}", ["true"]) for index in range(20_000)]
    answers: list[httpx.Response] = []
    waits = requests_meanwhile(
        service,
        lambda: answers.append(
            service.clients["mk"].post(
                "/workflow-yaml", json={"workflow": {"name": "w", "tasks": tasks}}
            )
        ),
    )
    assert answers[0].status_code == 200, answers[0].text[:300]
    assert answers[0].json()["text"].count("- id: t") == 20_000
    assert waits and max(waits) < 2.0, max(waits)


def peak_memory_mib(pid: int) -> int:
    """The peak resident memory of a process so far (VmHWM), in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return (
        int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
        // 1024
    )


LOUD = (
    "import sys\n"
    "line = 'x' * 20 + '\\n'\n"
    "for index in range(5_000_000): sys.stdout.write(line)\n"
    "print('the end')\n"
)


def test_the_tail_of_a_long_log_costs_the_memory_of_the_tail(tmp_path):
    """A task's log of 100 MiB: its last 300 lines (what `simrun logs` and the web app ask)
    raised the service's peak memory by five times the log's size; now by little."""
    service = start_configured_service(tmp_path)
    try:
        run = service.submit("mk", {"name": "loud", "tasks": [command("t", python(LOUD))]})
        assert service.wait(run["id"], timeout=300)["state"] == "succeeded"
        before = peak_memory_mib(service.process.pid)
        logs = service.clients["ann"].get(f"/runs/{run['id']}/logs/t")
        assert logs.status_code == 200, logs.text[:300]
        lines = logs.text.splitlines()
        assert lines[-1] == "the end" and lines[-300:-1] == ["x" * 20] * 299, lines[:3]
        assert len(lines) == 301  # the header of the pod's log and its last 300 lines
        assert peak_memory_mib(service.process.pid) - before < 64
    finally:
        assert stop_configured_service(service) == 0


WIDE = (
    "import json, pathlib, sys; out = pathlib.Path(sys.argv[1]); out.mkdir(exist_ok=True); "
    "(out / 'summary.json').write_text(json.dumps(dict(('k%d' % i, i) for i in range(2000))))"
)


def test_a_compare_whose_table_passes_a_million_cells_is_refused_naming_it(service):
    """A run of 2,000 summary keys asked 5,000 times (100 KiB of body) made a table of ten
    million cells: 1.8 GiB of the service's memory. Asked 10 times it is answered."""
    run = service.submit("mk", {"name": "wide", "tasks": [command("t", [*python(WIDE), "{out}"])]})
    assert service.wait(run["id"])["state"] == "succeeded"
    refused = service.clients["ann"].post("/compare", json={"runs": [run["id"]] * 5000})
    assert refused.status_code == 422, refused.text[:300]
    assert "5000 runs of 2004 columns" in refused.json()["detail"]
    assert "at most 1000000" in refused.json()["detail"]
    table = service.clients["ann"].post("/compare", json={"runs": [run["id"]] * 10}).json()
    assert len(table["rows"]) == 10 and len(table["columns"]) == 2004
    assert {row["t.k1999"] for row in table["rows"]} == {1999}
