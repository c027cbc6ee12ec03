"""A real local service in a temp directory for tests, and helpers to wait and to find processes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from wait_helpers import wait_until

SERVE = (
    "import sys; from pathlib import Path; from simrun_api.local import serve_local; "
    "serve_local(Path('.'), port=int(sys.argv[1]) if len(sys.argv) > 1 else 0)"
)
"""The local service of the current directory, on the port of its argument (else a free one)."""


@dataclasses.dataclass
class LocalService:
    """A local service running in a subprocess, with a client that carries its token."""

    root: Path
    process: subprocess.Popen[bytes]
    info: dict[str, Any]
    client: httpx.Client

    @property
    def store(self) -> Path:
        return self.root / ".simrun" / "store"

    def run_dir(self, run_id: str) -> Path:
        return self.store / "runs" / run_id

    def submit(self, workflow: dict[str, Any], **extra: Any) -> dict[str, Any]:
        response = self.client.post("/runs", json={"workflow": workflow, **extra})
        assert response.status_code == 201, response.text
        return response.json()

    def wait(self, run_id: str, timeout: float = 60.0) -> dict[str, Any]:
        response = self.client.get(f"/runs/{run_id}/wait", params={"timeout": timeout})
        assert response.status_code == 200, response.text
        return response.json()

    def events(self, run_id: str) -> list[dict[str, Any]]:
        lines = (self.run_dir(run_id) / "events.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def start_service(
    root: Path,
    python: str = sys.executable,
    port: int | None = None,
    env: dict[str, str] | None = None,
) -> LocalService:
    """Start `serve_local` of `root` in a subprocess (of `python`, which must see simrun; on
    `port`, else a free one; in `env`, else the test's environment) and wait for its
    `service.json`."""
    log = open(root / "service-test.log", "ab")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [python, "-c", SERVE, *([str(port)] if port is not None else [])],
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    service_json = root / ".simrun" / "service.json"

    def ready() -> dict[str, Any] | None:
        if process.poll() is not None:
            pytest.fail(f"the service exited: {(root / 'service-test.log').read_text()[-2000:]}")
        try:
            info = json.loads(service_json.read_text())
        except (OSError, ValueError):
            return None
        return info if info["pid"] == process.pid else None

    info = wait_until(ready, what="the local service to write service.json")
    client = httpx.Client(
        base_url=info["url"], headers={"Authorization": f"Bearer {info['token']}"}, timeout=90
    )
    return LocalService(root=root, process=process, info=info, client=client)


def stop_service(service: LocalService, timeout: float = 60.0) -> None:
    """SIGTERM the service and wait for its end; SIGKILL if it does not end in time."""
    service.client.close()
    end_service_process(service.process, timeout)


def end_service_process(process: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGTERM a service's process and wait for its end; its exit code. SIGKILL to its group
    and fail the test when it does not end within `timeout`."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail("the service did not stop on SIGTERM in time")
    return process.returncode


def command(task_id: str, args: list[str], **extra: Any) -> dict[str, Any]:
    """A task of the built-in type `command` running `args`."""
    settings = {"image": "none", "args": args, "cores": 1, "memory_gb": 0.5}
    return {"id": task_id, "type": "command", "settings": settings, **extra}


def python(code: str) -> list[str]:
    """The argv that runs python code with this interpreter."""
    return [sys.executable, "-c", code]


WRITE = (
    "import sys, pathlib; p = pathlib.Path(sys.argv[1], 'out'); p.mkdir(); "
    "(p / 'x.txt').write_text('42')"
)
READ = (
    "import sys; port, path = sys.argv[1].split('=', 1); "
    "print('read', open(path + '/x.txt').read())"
)


def run_processes(run_id: str) -> list[int]:
    """The live processes whose environment names the run (`SIMRUN_RUN`)."""
    marker = f"SIMRUN_RUN={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def processes_in(tree: Path) -> list[int]:
    """The live processes working in a tree or naming it in their command line: an installer
    of the tree and the build backend it runs."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(entry / "cwd")
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if state != "Z" and (cwd.startswith(str(tree)) or str(tree).encode() in command):
            found.append(int(entry.name))
    return found
