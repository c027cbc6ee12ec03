"""Removing, cleaning up, measuring and comparing runs of the real local service."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_service import (
    LocalService,
    command,
    python,
    run_processes,
    start_service,
    stop_service,
    wait_until,
)

KIB10 = "x" * 10_000
WRITE_10K = (
    "import sys, pathlib; p = pathlib.Path(sys.argv[1], 'out'); p.mkdir(); "
    f"(p / 'data.txt').write_text({KIB10!r})"
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
    started = start_service(tmp_path_factory.mktemp("store"))
    try:
        yield started
    finally:
        stop_service(started)


def finished(service: LocalService, workflow: dict, **extra) -> dict:
    """Submit a run and wait for its end and its record cache (its actor's last write)."""
    run = service.submit(workflow, **extra)
    end = service.wait(run["id"])
    wait_until(lambda: (service.run_dir(run["id"]) / "run.json").exists(), what="run.json")
    return end


def writer(name: str) -> dict:
    return {"name": name, "tasks": [command("w", [*python(WRITE_10K), "{out}"])]}


def squares(n: int) -> dict:
    return {
        "name": "squares",
        "tasks": [{"id": "squares", "type": "demo.squares", "settings": {"n": n}}],
    }


def test_delete_removes_an_ended_run_only(service):
    sleep = python("import time; time.sleep(600)")
    run = service.submit({"name": "s", "tasks": [command("sleep", sleep)]})
    wait_until(lambda: run_processes(run["id"]), what="the process of the run")
    live = service.client.delete(f"/runs/{run['id']}")
    assert live.status_code == 409
    assert f"run {run['id']!r} is " in live.json()["detail"]
    assert "cancel it first" in live.json()["detail"]
    assert service.client.post(f"/runs/{run['id']}/cancel").status_code == 200
    assert service.wait(run["id"])["state"] == "cancelled"

    removed = service.client.delete(f"/runs/{run['id']}")
    assert removed.status_code == 200, removed.text
    result = removed.json()
    assert result["runs"] == [f"runs/{run['id']}"]
    assert result["snapshots"] == [] and result["dry_run"] is False
    assert result["bytes_freed"] > 0
    assert not service.run_dir(run["id"]).exists()
    assert not list((service.store / "runs").glob(".removed-*"))
    assert service.client.get(f"/runs/{run['id']}").status_code == 404
    assert run["id"] not in {item["id"] for item in service.client.get("/runs").json()}
    again = service.client.delete(f"/runs/{run['id']}")
    assert again.status_code == 404
    assert run["id"] in again.json()["detail"]


def test_cleanup_by_age_group_and_failure_and_its_dry_run(service):
    good = finished(service, writer("good"), group="clean")["id"]
    bad = finished(service, {"name": "bad", "tasks": [command("x", ["false"])]}, group="clean")
    other = finished(service, writer("other"), group="keep")["id"]
    assert bad["state"] == "failed"
    client = service.client

    young = client.post("/cleanup", json={"older_than_days": 1, "group": "clean"}).json()
    assert young["runs"] == [] and young["bytes_freed"] == 0
    body = {"older_than_days": 0, "group": "clean", "failed_only": True}
    listed = client.post("/cleanup", json={**body, "dry_run": True}).json()
    assert listed["runs"] == [f"runs/{bad['id']}"] and listed["dry_run"] is True
    assert service.run_dir(bad["id"]).is_dir()

    removed = client.post("/cleanup", json=body).json()
    assert removed["runs"] == listed["runs"]
    assert removed["bytes_freed"] == listed["bytes_freed"] > 0
    assert not service.run_dir(bad["id"]).exists()
    rest = client.post("/cleanup", json={"older_than_days": 0, "group": "clean"}).json()
    assert rest["runs"] == [f"runs/{good}"]
    assert rest["bytes_freed"] >= 10_000
    assert service.run_dir(other).is_dir()


def test_usage_counts_a_hard_linked_file_once(service):
    first = finished(service, writer("first"), group="usage")["id"]
    second = finished(service, writer("second"), group="usage")["id"]

    def usage() -> dict:
        response = service.client.get("/usage")
        assert response.status_code == 200, response.text
        return response.json()

    before = usage()
    assert before["runs"][first] > 10_000
    assert before["groups"]["usage"] == before["runs"][first] + before["runs"][second]
    data = service.run_dir(first) / "tasks/w/out/out/data.txt"
    assert data.stat().st_size == 10_000
    os.link(data, data.with_name("again.txt"))
    os.link(data, service.run_dir(second) / "tasks/w/out/linked.txt")
    after = usage()
    assert after["runs"][first] == before["runs"][first]
    assert after["runs"][second] == before["runs"][second] + 10_000
    assert after["groups"]["usage"] == before["groups"]["usage"]

    removed = service.client.delete(f"/runs/{second}").json()
    assert removed["bytes_freed"] == before["runs"][second]
    assert data.read_text() == KIB10
    assert second not in usage()["runs"]


def test_compare_puts_provenance_and_summaries_side_by_side(service, tmp_path: Path):
    source = {
        "name": "model",
        "path": str(tmp_path),
        "commit": "abc123",
        "changed": ["a.py", "b.py"],
        "diff_sha256": "d1ff",
    }
    three = finished(service, squares(3), group="cmp", sources=[source])["id"]
    four = finished(service, squares(4), group="cmp")["id"]
    response = service.client.post("/compare", json={"runs": [four, three]})
    assert response.status_code == 200, response.text
    table = response.json()
    assert table["columns"] == [
        "run",
        "group",
        "agent",
        "state",
        "model.changed_files",
        "model.diff_sha256",
        "squares.n",
        "squares.sum",
    ]
    assert table["rows"] == [
        {
            "run": four,
            "group": "cmp",
            "agent": None,
            "state": "succeeded",
            "model.changed_files": None,
            "model.diff_sha256": None,
            "squares.n": 4,
            "squares.sum": 14,
        },
        {
            "run": three,
            "group": "cmp",
            "agent": None,
            "state": "succeeded",
            "model.changed_files": ["a.py", "b.py"],
            "model.diff_sha256": "d1ff",
            "squares.n": 3,
            "squares.sum": 5,
        },
    ]
    snapshot = {
        "name": "model",
        "commit": "abc123",
        "changed": ["M a.py"],
        "diff_sha256": "5a",
        "snapshot": "snapshots/model/5a",
        "patch": "snapshots/model/patches/p.patch",
    }
    five = finished(service, squares(5), group="cmp", sources=[snapshot])["id"]
    response = service.client.post("/compare", json={"runs": [three, five]})
    assert response.status_code == 200, response.text
    table = response.json()
    assert table["columns"][4:7] == ["model.changed_files", "model.diff_sha256", "model.snapshot"]
    assert [row["model.snapshot"] for row in table["rows"]] == [None, "snapshots/model/5a"]
    assert table["rows"][1]["model.changed_files"] == ["M a.py"]
    unknown = service.client.post("/compare", json={"runs": [three, "20260101-000000-abcdef"]})
    assert unknown.status_code == 404
    assert "'20260101-000000-abcdef' does not exist" in unknown.json()["detail"]
