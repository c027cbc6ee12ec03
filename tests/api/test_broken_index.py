"""The index is a projection of the logs: a service whose index file is garbage, truncated, has a
page overwritten, is a directory or is gone starts anyway. It moves the file aside
(`<name>.broken-<time>`), says so in its log, rebuilds the index from the logs and learns the
resources again from the worker reports in them; SIGTERM stops it as always. A start that fails
for another reason (the file locked by another process) ends the process instead of hanging."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from live_service import wait_until
from service_helpers import (
    SERVE,
    ConfiguredService,
    start_configured_service,
    stop_configured_service,
)

PAGE = 4096


def squares(n: int) -> dict:
    return {
        "name": "squares",
        "tasks": [{"id": "squares", "type": "demo.squares", "settings": {"n": n, "sleep_s": 0.01}}],
    }


def learned(service: ConfiguredService) -> str:
    """What the resources of `squares` are learned from, as `POST /estimate` says."""
    response = service.clients["mk"].post("/estimate", json={"workflow": squares(8)})
    assert response.status_code == 200, response.text
    return str(response.json()["squares"]["resources"]["source"])


@pytest.fixture(scope="module")
def served_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str]]]:
    """A service's directory (settings, store, index) after two runs of `demo.squares`, the
    service stopped; and the ids of the runs."""
    root = tmp_path_factory.mktemp("served")
    service = start_configured_service(root)
    try:
        runs = [service.submit("mk", squares(8))["id"] for _ in range(2)]
        for run in runs:
            assert service.wait(run)["state"] == "succeeded"
        assert learned(service) == "learned from 2 runs"
    finally:
        assert stop_configured_service(service) == 0
    yield root, runs


def overwrite_with_garbage(db: Path) -> None:
    db.write_bytes(os.urandom(db.stat().st_size))


def truncate(db: Path) -> None:
    size = db.stat().st_size
    assert size > 2 * PAGE, size
    with db.open("r+b") as file:
        file.truncate(size // 2 + 100)


def overwrite_a_page(db: Path) -> None:
    """Page 2 (the first after the schema) of garbage; the header and schema are kept."""
    with db.open("r+b") as file:
        file.seek(PAGE)
        file.write(os.urandom(PAGE))


def replace_by_a_directory(db: Path) -> None:
    db.unlink()
    db.mkdir()
    (db / "something").write_text("not a database")


def delete(db: Path) -> None:
    db.unlink()


BREAKAGES: dict[str, Callable[[Path], None]] = {
    "garbage": overwrite_with_garbage,
    "truncated": truncate,
    "page": overwrite_a_page,
    "directory": replace_by_a_directory,
    "deleted": delete,
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_service_with_a_broken_index_rebuilds_it_and_starts(
    served_store: tuple[Path, list[str]], tmp_path: Path, breakage: str
) -> None:
    original, runs = served_store
    root = tmp_path / "service"
    shutil.copytree(original, root, symlinks=True)
    (root / "service.log").write_text("")
    db = root / "db" / "simrun.sqlite"
    assert db.is_file() and not db.with_name(db.name + "-wal").exists()
    BREAKAGES[breakage](db)
    service = start_configured_service(root)
    try:
        listed = service.clients["mk"].get("/runs").json()
        assert sorted(item["id"] for item in listed) == sorted(runs)
        assert {item["state"] for item in listed} == {"succeeded"}
        assert learned(service) == "learned from 2 runs"
        run = service.clients["mk"].get(f"/runs/{runs[0]}")
        assert run.status_code == 200 and run.json()["state"] == "succeeded", run.text
        moved = sorted(path.name for path in db.parent.glob(f"{db.name}.broken-*"))
        if breakage == "deleted":
            assert moved == []
        else:
            assert len(moved) == 1, moved
            assert "cannot be used" in (root / "service.log").read_text()
            assert moved[0] in (root / "service.log").read_text()
        assert db.is_file()
    finally:
        assert stop_configured_service(service, timeout=30) == 0


def test_sigterm_ends_a_start_that_waits_on_a_locked_index(tmp_path: Path) -> None:
    """An index another process holds locked is not broken (it is not moved): the start waits
    for it, then fails. SIGTERM meanwhile, and that failure, end the process rather than leave
    it waiting forever on the thread of its database."""
    assert stop_configured_service(start_configured_service(tmp_path)) == 0
    db = tmp_path / "db" / "simrun.sqlite"
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("PRAGMA journal_mode=DELETE")  # a lock that keeps out readers too
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("DELETE FROM runs")
        log = tmp_path / "second.log"
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE, "0"],
            cwd=tmp_path,
            env={**os.environ, "SIMRUN_CONFIG": str(tmp_path / "settings.yaml")},
            stdin=subprocess.DEVNULL,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_until(lambda: b"Started server process" in log.read_bytes(), what="the start")
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail("SIGTERM did not end a service whose start failed")
        assert process.returncode != 0
        assert b"database is locked" in log.read_bytes(), log.read_text()[-2000:]
        assert list(db.parent.glob("*.broken-*")) == []
    finally:
        holder.close()
