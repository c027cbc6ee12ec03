"""A local service of a project directory for the benchmarks: `simrun serve --local`, as users do.

It is started with the same console script as the `simrun` commands the benchmarks run, so those
commands find it (same interpreter, same environment) and never start one of their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import simrun_command

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


class ServiceFailed(RuntimeError):
    """The service did not start, or stopped; the message has the end of its log."""


@dataclasses.dataclass
class BenchService:
    """A local service running in a subprocess, with a client that carries its token."""

    root: Path
    process: subprocess.Popen[bytes]
    info: dict[str, Any]
    client: httpx.Client

    @property
    def url(self) -> str:
        """The base URL of the service."""
        return str(self.info["url"])

    @property
    def token(self) -> str:
        """The token of the user."""
        return str(self.info["token"])

    @property
    def store(self) -> Path:
        """The run store of the service."""
        return self.root / ".simrun" / "store"

    def events_path(self, run_id: str) -> Path:
        """The event log of a run."""
        return self.store / "runs" / run_id / "events.jsonl"

    def submit(self, workflow: dict[str, Any]) -> dict[str, Any]:
        """POST /runs; the record."""
        response = self.client.post("/runs", json={"workflow": workflow})
        if response.status_code != 201:
            raise ServiceFailed(f"POST /runs answered {response.status_code}: {response.text}")
        return response.json()

    def wait(self, run_id: str, timeout: float = 120.0) -> dict[str, Any]:
        """Wait for the end of a run; its summary."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            response = self.client.get(
                f"/runs/{run_id}/wait", params={"timeout": min(60.0, remaining)}
            )
            response.raise_for_status()
            item = response.json()
            if item["state"] in ("succeeded", "failed", "cancelled") or remaining <= 0:
                return item

    def peak_rss_bytes(self) -> int:
        """The peak resident memory of the service process (VmHWM)."""
        return _status_bytes(self.process.pid, "VmHWM")

    def rss_bytes(self) -> int:
        """The resident memory of the service process now (VmRSS)."""
        return _status_bytes(self.process.pid, "VmRSS")

    def log_tail(self, lines: int = 30) -> str:
        """The end of the log of the service process."""
        try:
            text = (self.root / "service-bench.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def start_service(root: Path) -> BenchService:
    """Start `simrun serve --local` in `root` and wait until it answers with its token."""
    root.mkdir(parents=True, exist_ok=True)
    log = open(root / "service-bench.log", "ab")  # noqa: SIM115 - closed below, the child has it
    try:
        process = subprocess.Popen(
            [*simrun_command(), "serve", "--local"],
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=environment(),
        )
    finally:
        log.close()
    service_json = root / ".simrun" / "service.json"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise ServiceFailed(f"the service exited: {_tail(root)}")
        with contextlib.suppress(OSError, ValueError):
            info = json.loads(service_json.read_text())
            if info.get("pid") == process.pid:
                break
        if time.monotonic() > deadline:
            _kill(process)
            raise ServiceFailed(
                f"the service did not start in {START_TIMEOUT_S:g} s: {_tail(root)}"
            )
        time.sleep(0.02)
    client = httpx.Client(
        base_url=info["url"],
        headers={"Authorization": f"Bearer {info['token']}"},
        timeout=120.0,
        trust_env=False,
    )
    return BenchService(root=root, process=process, info=info, client=client)


def stop_service(service: BenchService) -> None:
    """SIGTERM the service (it cancels its live runs) and wait; SIGKILL its group if it hangs."""
    service.client.close()
    if service.process.poll() is None:
        service.process.send_signal(signal.SIGTERM)
        try:
            service.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill(service.process)


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def environment() -> dict[str, str]:
    """This environment without the settings of a remote service: for the service and `simrun`."""
    return {
        key: value
        for key, value in os.environ.items()
        if key not in ("SIMRUN_URL", "SIMRUN_TOKEN", "SIMRUN_CONFIG")
    }


def _tail(root: Path) -> str:
    try:
        return (root / "service-bench.log").read_text(errors="replace")[-2000:]
    except OSError:
        return "(no log)"


def _status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"/proc/{pid}/status has no {field}")
