"""One service writes a store: a second `simrun serve` of a settings file naming the same store
exits at once naming the holder (its pid and host), also beside a local service of that store;
the lock goes with the process that held it, so a service killed never blocks the next one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from live_service import command, end_service_process, start_service, stop_service, wait_until
from service_helpers import free_port

TOKEN = "t-mk"
SECOND_EXIT_S = 30.0
"""A second service exits at once; this only bounds a wait on a loaded machine."""


def write_settings(root: Path, store: Path) -> Path:
    """A settings file of the local backend on `store`, its index and tokens in `root`."""
    tokens = root / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({TOKEN: {"name": "mk", "kind": "person"}}))
    tokens.chmod(0o600)
    settings = root / "settings.yaml"
    config = {"store": str(store), "db": str(root / "index.sqlite"), "tokens": str(tokens)}
    settings.write_text(yaml.safe_dump({**config, "owner": "mk", "scratch": str(root / "tmp")}))
    return settings


def serve(settings: Path, port: int, log: Path | None = None) -> subprocess.Popen[bytes]:
    """`simrun serve --port PORT` of the settings file (its output to `log`, else piped)."""
    return subprocess.Popen(
        [sys.executable, "-m", "simrun_cli", "serve", "--port", str(port)],
        cwd=settings.parent,
        env={**os.environ, "SIMRUN_CONFIG": str(settings)},
        stdin=subprocess.DEVNULL,
        stdout=log.open("ab") if log is not None else subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_answering(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    def answers() -> bool:
        if process.poll() is not None:
            pytest.fail(f"the service exited: {log.read_text()[-2000:]}")
        try:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            return httpx.get(f"http://127.0.0.1:{port}/me", headers=headers).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(answers, timeout=60, what="the service to answer")


def refused(settings: Path) -> str:
    """The output of a second service, which must exit 3 without serving; one line."""
    second = serve(settings, free_port())
    try:
        output, _ = second.communicate(timeout=SECOND_EXIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait()
        pytest.fail("a second service on the store did not exit")
    text = output.decode()
    assert second.returncode == 3, text
    assert len(text.strip().splitlines()) == 1, text
    return text


def test_a_second_service_of_a_store_exits_naming_the_first_and_a_killed_one_blocks_none(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    first_root, second_root = tmp_path / "first", tmp_path / "second"
    first_root.mkdir()
    second_root.mkdir()
    first_settings = write_settings(first_root, store)
    # Another settings file, even another index: the store is what one service writes.
    second_settings = write_settings(second_root, store)
    log = first_root / "service.log"
    port = free_port()
    first = serve(first_settings, port, log)
    try:
        wait_answering(first, port, log)
        for settings in (first_settings, second_settings):
            text = refused(settings)
            assert f"pid {first.pid}" in text, text
            assert f"host {socket.gethostname()}" in text, text
            assert str(store) in text, text
        assert first.poll() is None  # the first goes on serving
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        port = free_port()
        first = serve(second_settings, port, log)
        wait_answering(first, port, log)
    finally:
        end_service_process(first, 60)


def test_a_service_of_a_settings_file_on_the_store_of_a_local_service_exits(
    tmp_path: Path,
) -> None:
    local = start_service(tmp_path)
    try:
        settings_root = tmp_path / "cluster"
        settings_root.mkdir()
        text = refused(write_settings(settings_root, local.store))
        assert f"pid {local.process.pid}" in text, text
    finally:
        stop_service(local)


def test_a_second_service_of_another_store_on_the_same_index_exits_and_the_first_keeps_its_runs(
    tmp_path: Path,
) -> None:
    """Two stores, one index: the second service would rebuild the index from its own store,
    and the first would list none of its runs (the index is one service's too)."""
    first_root, second_root = tmp_path / "first", tmp_path / "second"
    first_root.mkdir()
    second_root.mkdir()
    first_settings = write_settings(first_root, tmp_path / "store-one")
    second_settings = write_settings(second_root, tmp_path / "store-two")
    config = yaml.safe_load(second_settings.read_text())
    config["db"] = str(first_root / "index.sqlite")
    second_settings.write_text(yaml.safe_dump(config))
    log = first_root / "service.log"
    port = free_port()
    first = serve(first_settings, port, log)
    try:
        wait_answering(first, port, log)
        client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        workflow = {"name": "w", "tasks": [command("t", ["true"])]}
        run = client.post("/runs", json={"workflow": workflow})
        assert run.status_code == 201, run.text
        text = refused(second_settings)
        assert f"pid {first.pid}" in text, text
        assert str(first_root / "index.sqlite") in text, text
        assert [item["id"] for item in client.get("/runs").json()] == [run.json()["id"]]
        assert first.poll() is None
    finally:
        end_service_process(first, 60)
