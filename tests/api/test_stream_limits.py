"""A run's event stream holds a bounded part of the log, whatever its size and however slowly its
client reads: the log is read a chunk at a time, a client too far behind a live run is cut and
resumes from the log with `Last-Event-ID`, and an identity has a bounded number of streams."""

from __future__ import annotations

from pathlib import Path

import pytest
from live_service import wait_until
from service_helpers import start_configured_service, stop_configured_service
from sse_sockets import messages, open_stream, read_to_end

from simrun_api.streams import CHUNK_BYTES
from simrun_core import events as ev
from simrun_core.store import LogWriter, RunPaths
from simrun_core.workflow import Workflow

BIG_RUN = "20260101-000000-b1b1b1"
BIG_UNITS = 40_000  # about 4 MiB of log, 60 times a chunk
QUEUE_BYTES = 4096


def write_big_run(store: Path) -> int:
    """An ended run whose log is many chunks long; its number of events."""
    paths = RunPaths(store, BIG_RUN)
    workflow = Workflow(name="big", tasks=[])
    writer = LogWriter(paths.events, fsync=False)
    writer.append(
        ev.Submitted(seq=1, run=BIG_RUN, workflow=workflow, submitted_by="mk", owner="mk")
    )
    for start in range(0, BIG_UNITS, 5_000):
        writer.append(
            *(
                ev.UnitDone(seq=2 + index, task="t", index=index, worker="w0")
                for index in range(start, min(start + 5_000, BIG_UNITS))
            )
        )
    writer.append(ev.Succeeded(seq=BIG_UNITS + 2))
    writer.close()
    assert paths.events.stat().st_size > 40 * CHUNK_BYTES
    return BIG_UNITS + 2


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("streams")
    write_big_run(root / "store")
    started = start_configured_service(root, stream_queue_bytes=QUEUE_BYTES)
    yield started
    stop_configured_service(started)


def port_of(service) -> int:
    return int(service.url.rsplit(":", 1)[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_long_log_goes_out_whole_and_in_order_while_idle_readers_hold_little(service):
    port = port_of(service)
    before = rss_mib(service.process.pid)
    idle = [
        open_stream(port, f"/runs/{BIG_RUN}/events", "t-mk", receive_buffer=4096) for _ in range(8)
    ]
    try:
        for sock in idle:  # the answer began: the stream is open and read from the log
            sock.settimeout(30)
            assert sock.recv(100).startswith(b"HTTP/1.1 200")
        grown = rss_mib(service.process.pid) - before
        # Each held about 4x its 4 MiB log when a stream read the whole log at connect.
        assert grown < 24, f"8 streams that read nothing took {grown:.0f} MiB"

        data, _ = read_to_end(open_stream(port, f"/runs/{BIG_RUN}/events", "t-mk"))
        sent = messages(data)
        assert [seq for seq, _ in sent] == list(range(1, BIG_UNITS + 3))
        assert sent[-1][1] == "succeeded"

        middle = BIG_UNITS // 2
        resumed, _ = read_to_end(
            open_stream(port, f"/runs/{BIG_RUN}/events", "t-mk", last_event_id=middle)
        )
        assert [seq for seq, _ in messages(resumed)] == list(range(middle + 1, BIG_UNITS + 3))
    finally:
        for sock in idle:
            sock.close()


def test_a_client_that_reads_nothing_of_a_live_run_is_cut_and_resumes_from_the_log(service):
    port = port_of(service)
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": 1500, "sleep_s": 0.002}}
    run = service.submit("mk", {"name": "followed", "tasks": [task]})
    path = f"/runs/{run['id']}/events"
    silent = open_stream(port, path, "t-mk", receive_buffer=4096)
    try:
        assert service.wait(run["id"], timeout=120)["state"] == "succeeded"
        log_events = len(service.events(run["id"]))
        data, _ = read_to_end(silent)
    finally:
        silent.close()
    first = messages(data)
    assert first, data[:300]
    seqs = [seq for seq, _ in first]
    assert seqs == list(range(1, len(seqs) + 1))
    # Cut once its queue passed the bound: it never got the end of the run.
    assert len(seqs) < log_events and "succeeded" not in {kind for _, kind in first}

    rest, ended = read_to_end(open_stream(port, path, "t-mk", last_event_id=seqs[-1]))
    resumed = messages(rest)
    assert [seq for seq, _ in resumed] == list(range(seqs[-1] + 1, log_events + 1))
    assert resumed[-1][1] == "succeeded" and ended == "eof"


def test_an_identity_gets_429_beyond_its_streams_and_a_stream_again_once_one_ended(tmp_path):
    started = start_configured_service(tmp_path, max_streams_per_identity=2)
    port = port_of(started)
    opened = []
    try:
        for _ in range(2):
            sock = open_stream(port, "/events", "t-mk")
            sock.settimeout(30)
            assert sock.recv(100).startswith(b"HTTP/1.1 200")
            opened.append(sock)
        refused = started.clients["mk"].get("/events")
        assert refused.status_code == 429, refused.text
        assert "max_streams_per_identity" in refused.json()["detail"]
        # The agent of mk is an identity of its own.
        with started.clients["mk-bot"].stream("GET", "/events") as other:
            assert other.status_code == 200

        opened.pop().close()

        def again() -> bool:
            sock = open_stream(port, "/events", "t-mk")
            sock.settimeout(30)
            if sock.recv(100).startswith(b"HTTP/1.1 200"):
                opened.append(sock)
                return True
            sock.close()
            return False

        wait_until(again, what="a stream of mk once one of its two ended")
    finally:
        for sock in opened:
            sock.close()
        stop_configured_service(started)
