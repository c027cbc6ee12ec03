"""`GET /runs/{run}/progress` with the ledger counts and the first and last progress lines of
a split task, and `GET /runs/{run}/wait` with a timeout above its maximum (issue 15), on the
real local service."""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from live_service import LocalService, command, start_service, stop_service, wait_until
from unit_events import unit_lines

N = 12


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
    started = start_service(tmp_path_factory.mktemp("progress"))
    try:
        yield started
    finally:
        stop_service(started)


def squares(n: int = N, sleep_s: float = 0.0) -> dict:
    return {"id": "squares", "type": "demo.squares", "settings": {"n": n, "sleep_s": sleep_s}}


def test_the_progress_of_a_live_split_task_has_its_ledger_counts(service: LocalService) -> None:
    run = service.submit({"name": "p", "tasks": [squares(sleep_s=0.3)]})
    path = f"/runs/{run['id']}/progress"

    def claimed() -> dict | None:
        task = service.client.get(path).json()["tasks"]["squares"]
        counts = task["counts"]
        return task if counts and counts["claimed"] > 0 and counts["done"] < N else None

    live = wait_until(claimed, what="units claimed by the worker")
    counts = live["counts"]
    assert counts["total"] == N
    assert counts["pending"] + counts["claimed"] + counts["done"] == N
    assert counts["done"] == live["done"]
    assert service.wait(run["id"])["state"] == "succeeded"


def test_the_progress_of_an_ended_task_has_its_counts_and_lines(service: LocalService) -> None:
    tasks = [squares(), command("after", ["true"], inputs={"x": "squares.squares"})]
    run = service.submit({"name": "p", "tasks": tasks})
    assert service.wait(run["id"])["state"] == "succeeded"
    progress = service.client.get(f"/runs/{run['id']}/progress").json()
    task = progress["tasks"]["squares"]
    assert task["counts"] == {"pending": 0, "claimed": 0, "done": N, "total": N}
    first, last = task["first"], task["last"]
    assert set(first) == set(last) == {"index", "worker", "seconds", "time"}
    assert first["worker"] == last["worker"] == "w0"
    assert 0 <= first["index"] < N and 0 <= last["index"] < N
    assert first["seconds"] >= 0 and last["seconds"] >= 0
    assert datetime.fromisoformat(first["time"]) == datetime.fromisoformat(task["first_done"])
    assert datetime.fromisoformat(last["time"]) == datetime.fromisoformat(task["last_done"])
    # the last line is the last unit done of the log, the first its first
    done = unit_lines(service.events(run["id"]))
    assert (last["index"], last["seconds"]) == done[-1]
    assert (first["index"], first["seconds"]) == done[0]
    unsplit = progress["tasks"]["after"]
    assert (unsplit["counts"], unsplit["first"], unsplit["last"]) == (None, None, None)


def test_a_wait_above_the_maximum_is_capped_not_refused(service: LocalService) -> None:
    run = service.submit({"name": "w", "tasks": [command("one", ["true"])]})
    started = time.monotonic()
    answer = service.client.get(f"/runs/{run['id']}/wait", params={"timeout": 3600})
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "succeeded"
    assert time.monotonic() - started < 30
    huge = service.client.get(f"/runs/{run['id']}/wait", params={"timeout": "1e300"})
    assert huge.status_code == 200, huge.text
    negative = service.client.get(f"/runs/{run['id']}/wait", params={"timeout": -1})
    assert negative.status_code == 400, negative.text


def test_a_listing_shows_the_results_first_and_stops_at_its_limit(service: LocalService) -> None:
    run = service.submit({"name": "many", "tasks": [squares(n=120)]})
    assert service.wait(run["id"])["state"] == "succeeded"
    base = f"/runs/{run['id']}/outputs/squares"
    out = f"runs/{run['id']}/tasks/squares/out"

    def listing(**params: str | int) -> dict:
        answer = service.client.get(base, params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()

    first = listing()
    assert len(first["files"]) == 50 and first["left_out"] == 71, "121 files, 50 by default"
    assert first["files"][0]["path"] == f"{out}/summary.json"
    assert first["files"][1]["path"] == f"{out}/squares/0.json"
    summary = listing(glob="summary*")
    assert [file["path"] for file in summary["files"]] == [f"{out}/summary.json"]
    assert summary["left_out"] == 0
    ones = listing(glob="squares/1*.json", limit=5)  # 1, 10-19, 100-119
    assert [file["path"] for file in ones["files"]] == [
        f"{out}/squares/{index}.json" for index in (1, 10, 11, 12, 13)
    ]
    assert ones["left_out"] == 31 - 5
    every = listing(limit=0)
    assert len(every["files"]) == 121 and every["left_out"] == 0
    assert listing(glob="nothing*") == {"files": [], "left_out": 0}
    negative = service.client.get(base, params={"limit": -1})
    assert negative.status_code == 400, negative.text
    archive = service.client.get(
        f"/runs/{run['id']}/tasks/squares/outputs.tar", params={"glob": "summary*"}
    )
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        assert tar.getnames() == ["summary.json"]


def test_the_outputs_are_listed_relative_to_the_store(service: LocalService) -> None:
    run = service.submit({"name": "o", "tasks": [squares(n=3)]})
    assert service.wait(run["id"])["state"] == "succeeded"
    answer = service.client.get(f"/runs/{run['id']}/outputs/squares").json()
    listed = answer["files"]
    out = f"runs/{run['id']}/tasks/squares/out"
    assert [file["path"] for file in listed] == [
        f"{out}/summary.json",
        f"{out}/squares/0.json",
        f"{out}/squares/1.json",
        f"{out}/squares/2.json",
    ]
    assert answer["left_out"] == 0
    for file in listed:
        assert (Path(service.store) / file["path"]).stat().st_size == file["bytes"]
        fetched = service.client.get(f"/runs/{run['id']}/outputs/squares/{file['path']}")
        assert fetched.content == (Path(service.store) / file["path"]).read_bytes()
