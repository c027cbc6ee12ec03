"""The browser tests' service and browser: a local service (`serve_local`, what `simrun serve
--local` runs) on a port of its own that a restart keeps, and headless Chromium from Debian
driven by Playwright, with every console error of a page collected.

Chromium is Debian's (`apt-get install chromium`; `.ci/run` installs it when missing), never one
`playwright install` downloads. Its flags keep it off the network: the machine's network is
closed and the background connections of a browser are refused otherwise.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import socket
from pathlib import Path
from typing import Any

from live_service import LocalService, end_service_process, start_service

CHROMIUM = os.environ.get("SIMRUN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = os.environ.get("SIMRUN_WEB_SCREENSHOTS")
"""A directory to write the screenshots of `docs/` into (`SIMRUN_WEB_SCREENSHOTS=docs`)."""

NETWORK_REFUSAL = "Failed to load resource"
"""How Chromium logs a request that failed or was refused (a 401, a 404, a service away)."""


def free_port() -> int:
    """A port free now; the service binds it right after."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_local(root: Path, port: int) -> LocalService:
    """Start the local service of `root` on `port` and wait for its `service.json`."""
    return start_service(root, port=port)


def kill_local(service: LocalService) -> None:
    """SIGKILL the service (not its runs' processes, in groups of their own)."""
    service.client.close()
    os.kill(service.process.pid, signal.SIGKILL)
    service.process.wait()


def stop_local(service: LocalService) -> None:
    service.client.close()
    end_service_process(service.process, 60)


@dataclasses.dataclass
class Console:
    """The errors a page logged (console errors, uncaught exceptions), and those a test expects:
    a message starting with an allowed prefix is not a failure."""

    errors: list[str] = dataclasses.field(default_factory=list)
    allowed: list[str] = dataclasses.field(default_factory=list)

    def allow(self, prefix: str) -> None:
        self.allowed.append(prefix)

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(e.startswith(a) for a in self.allowed)]


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, None when they can."""
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the Python package playwright is missing: pip install -e '.[dev]'"
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM}: apt-get install -y chromium (as .ci/run does)"
    return None


def app_url(service: LocalService, hash_path: str = "") -> str:
    """The address of the web app of a service, `hash_path` after `#` (e.g. `/runs/<id>`)."""
    return f"{service.info['url']}/ui/" + (f"#{hash_path}" if hash_path else "")


def log_in(page: Any, service: LocalService, hash_path: str = "") -> None:
    """Open the app, log in with the token of the service and wait for the identity."""
    page.goto(app_url(service, hash_path))
    page.fill("input[name=token]", service.info["token"])
    page.click("button[type=submit]")
    page.wait_for_selector("[data-role=identity]:not(:empty)")


def screenshot(page: Any, name: str) -> None:
    """Write `<SIMRUN_WEB_SCREENSHOTS>/<name>.png` when screenshots are asked for."""
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"))


def squares(name: str, n: int, sleep_s: float, *more: dict[str, Any]) -> dict[str, Any]:
    """A workflow of the demo task `squares` (n units) and `more` tasks."""
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": n, "sleep_s": sleep_s}}
    return {"name": name, "tasks": [task, *more]}
