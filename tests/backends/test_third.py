"""A backend defined in a test module alone (`third_backend`) keeps the whole contract, and a
real `simrun serve` runs on it with its block in the settings file: adding a backend is one
module and one contract subclass, no edit of `simrun_api`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from live_service import end_service_process, wait_until

from .contract import BackendContract, Script
from .test_local import PROGRAM
from .third_backend import ThirdBackend, ThirdSettings

HERE = Path(__file__).parent
REPO = HERE.parent.parent
SQUARES = REPO / "examples" / "squares.yaml"


class TestThirdBackend(BackendContract):
    """The third backend on a store of the test, its processes playing the scripts as the
    local backend's do."""

    def make_backend(self, store: Path) -> ThirdBackend:
        return ThirdBackend(store, ThirdSettings(scratch=store.parent / "scratch"))

    def args(self, script: Script) -> list[str]:
        return [sys.executable, "-c", PROGRAM.replace("EXITS", repr(list(script.exits)))]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve(root: Path, settings: dict[str, Any], port: int) -> subprocess.Popen[bytes]:
    """Start `simrun serve` with a settings file in `root` (owner mk, `settings` on top), this
    directory on `PYTHONPATH` so that the settings can name `third_backend`."""
    (root / "tokens.yaml").write_text(yaml.safe_dump({"t-mk": {"name": "mk", "kind": "person"}}))
    (root / "tokens.yaml").chmod(0o600)
    base = {"store": "store", "db": "db/simrun.sqlite", "tokens": "tokens.yaml", "owner": "mk"}
    (root / "settings.yaml").write_text(yaml.safe_dump({**base, **settings}))
    env = {
        **os.environ,
        "SIMRUN_CONFIG": str(root / "settings.yaml"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "simrun_cli", "serve", "--port", str(port)],
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=open(root / "service.log", "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


THIRD = {
    "backend": "third_backend:third_backend",
    "third": {"node": "third-box", "cores": 3, "memory_gb": 6.0, "scratch": "scratch"},
}


def test_simrun_serve_runs_a_workflow_on_a_backend_of_a_test_module(tmp_path: Path) -> None:
    port = free_port()
    process = serve(tmp_path, THIRD, port)
    client = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer t-mk"}, timeout=90
    )

    def answers() -> bool:
        if process.poll() is not None:
            pytest.fail(f"the service exited: {(tmp_path / 'service.log').read_text()[-2000:]}")
        try:
            return client.get("/me").status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(answers, what="simrun serve on the third backend to answer")
        [server] = client.get("/servers").json()
        assert (server["name"], server["cores"], server["memory_gb"]) == ("third-box", 3, 6.0)
        workflow = yaml.safe_load(SQUARES.read_text())
        workflow["tasks"][0]["settings"] = {"n": 30}
        response = client.post("/runs", json={"workflow": workflow})
        assert response.status_code == 201, response.text
        run_id = response.json()["id"]
        end = client.get(f"/runs/{run_id}/wait", params={"timeout": 60}).json()
        assert end["state"] == "succeeded", end
        run = tmp_path / "store" / "runs" / run_id
        summary = (run / "tasks" / "squares" / "out" / "summary.json").read_text()
        assert summary == f'{{"n": 30, "sum": {sum(i * i for i in range(30))}}}'
        assert (run / "tasks" / "squares" / "logs" / "w0-0.log").is_file()
        assert any((tmp_path / "scratch" / run_id).iterdir()), "the scratch of its block"
    finally:
        client.close()
        end_service_process(process, 60)


def test_simrun_serve_refuses_an_unknown_key_of_the_backend_s_block(tmp_path: Path) -> None:
    settings = {**THIRD, "third": {"node": "x", "nodes": 2, "cores": "many"}}
    process = serve(tmp_path, settings, free_port())
    assert process.wait(60) != 0
    said = (tmp_path / "service.log").read_text()
    assert f"settings file {tmp_path / 'settings.yaml'}: unknown settings: third.nodes" in said
