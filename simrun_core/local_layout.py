"""The directory of a project's local service, `.simrun/`: what is in it, named once.

The service (`simrun_api.local`) and the CLI that starts, finds and stops it
(`simrun_cli.local`) both read this layout: the store, scratch, index and tokens of the
service, its `service.json` while it runs (how the CLI finds it), its log, the lock its
starters take, and how long an idle service started by the CLI lives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

LOCAL_DIR: Final = ".simrun"
"""The directory of the local service in a project directory."""
LOCAL_STORE: Final = "store"
"""The run store of the local service, in `.simrun/`."""
SERVICE_FILE: Final = "service.json"
"""The record of the running service (its pid, URL and token, 0600), in `.simrun/`."""
SERVICE_LOG: Final = "service.log"
"""The output of a service the CLI started in the background, in `.simrun/`."""
START_LOCK: Final = "start.lock"
"""The lock concurrent commands take to start one service, in `.simrun/`."""
IDLE_EXIT_S: Final = 1800.0
"""The seconds without a request and without a live run after which a local service that the
CLI started ends by itself."""


def local_dir(root: Path) -> Path:
    """`.simrun/` of a project directory, created with a `.gitignore` of everything."""
    directory = Path(root) / LOCAL_DIR
    directory.mkdir(exist_ok=True)
    ignore = directory / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    return directory


def service_path(root: Path) -> Path:
    """The path of `.simrun/service.json` of a project directory (it may not exist)."""
    return Path(root) / LOCAL_DIR / SERVICE_FILE
