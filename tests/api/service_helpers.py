"""The service of `serve_from_config` in a subprocess (a settings file, a tokens file of several
identities, a free port), and a reader of server-sent events."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from live_service import end_service_process, wait_until

SERVE = "import sys, simrun_api.app as app; app.serve_from_config(int(sys.argv[1]))"

# The owner of the service is mk; mk-bot is mk's agent, ann another person, ann-bot hers.
TOKENS = {
    "t-mk": {"name": "mk", "kind": "person"},
    "t-mk-bot": {"name": "mk-bot", "kind": "agent", "owner": "mk"},
    "t-ann": {"name": "ann", "kind": "person"},
    "t-ann-bot": {"name": "ann-bot", "kind": "agent", "owner": "ann"},
}


@dataclasses.dataclass
class ConfiguredService:
    """A service started by `serve_from_config`, with a client per identity of its tokens."""

    root: Path
    process: subprocess.Popen[bytes]
    url: str
    clients: dict[str, httpx.Client]

    @property
    def store(self) -> Path:
        return self.root / "store"

    def run_dir(self, run_id: str) -> Path:
        return self.store / "runs" / run_id

    def submit(self, who: str, workflow: dict[str, Any], **extra: Any) -> dict[str, Any]:
        response = self.clients[who].post("/runs", json={"workflow": workflow, **extra})
        assert response.status_code == 201, response.text
        return response.json()

    def wait(self, run_id: str, timeout: float = 60.0) -> dict[str, Any]:
        response = self.clients["mk"].get(f"/runs/{run_id}/wait", params={"timeout": timeout})
        assert response.status_code == 200, response.text
        return response.json()

    def events(self, run_id: str) -> list[dict[str, Any]]:
        lines = (self.run_dir(run_id) / "events.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def free_port() -> int:
    """A port free now (the service binds it right after; a clash fails its start)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_configured_service(
    root: Path, tokens: dict[str, dict[str, str]] = TOKENS, **settings: Any
) -> ConfiguredService:
    """Write `tokens.yaml` and `settings.yaml` (owner mk, store and db in `root`, `settings`
    on top) and run `serve_from_config` with them until it answers `GET /me`."""
    tokens_file = root / "tokens.yaml"
    tokens_file.write_text(yaml.safe_dump(tokens))
    tokens_file.chmod(0o600)
    config = {"store": "store", "db": "db/simrun.sqlite", "tokens": "tokens.yaml", "owner": "mk"}
    (root / "settings.yaml").write_text(yaml.safe_dump({**config, **settings}))
    port = free_port()
    log = open(root / "service.log", "ab")  # noqa: SIM115 - closed with the process
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(port)],
        cwd=root,
        env={**os.environ, "SIMRUN_CONFIG": str(root / "settings.yaml")},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    clients = {
        identity["name"]: httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=90
        )
        for token, identity in tokens.items()
    }
    first = next(iter(clients.values()))

    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"the service exited: {(root / 'service.log').read_text()[-2000:]}")
        try:
            return first.get("/me").status_code == 200
        except httpx.TransportError:
            return False

    wait_until(ready, what="the configured service to answer")
    return ConfiguredService(root=root, process=process, url=url, clients=clients)


def stop_configured_service(service: ConfiguredService, timeout: float = 60.0) -> int:
    """SIGTERM the service and wait for its end (SIGKILL and fail after `timeout`)."""
    for client in service.clients.values():
        client.close()
    return end_service_process(service.process, timeout)


@contextlib.contextmanager
def spooling_service(root: Path, spool: Path, **settings: Any) -> Iterator[ConfiguredService]:
    """A configured service for the length of the block whose uploads are spooled to `spool`
    (its TMPDIR), for tests that look at what an upload leaves there; it must end cleanly."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(spool))
        started = start_configured_service(root, **settings)
    try:
        yield started
    finally:
        assert stop_configured_service(started) == 0


def sse(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """The messages of a server-sent event stream: (event, data decoded as JSON)."""
    event, data = "message", []
    for line in lines:
        if not line:
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def next_event(
    messages: Iterator[tuple[str, Any]], event: str, condition: Any = lambda data: True
) -> Any:
    """The data of the next message `event` whose data meets `condition`; the stream's read
    timeout fails the test when none comes."""
    for name, data in messages:
        if name == event and condition(data):
            return data
    pytest.fail(f"the stream ended without a {event!r} event that meets the condition")
