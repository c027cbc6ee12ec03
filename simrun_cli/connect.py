"""The client of a command: the service of `SIMRUN_URL`, or the local one of the directory."""

from __future__ import annotations

import os
from pathlib import Path

from simrun_cli.client import Client
from simrun_cli.errors import CliError
from simrun_cli.local import ensure_local


def make_client() -> Client:
    """The client of the environment: `SIMRUN_URL` and `SIMRUN_TOKEN`; CliError if one is unset."""
    url = os.environ.get("SIMRUN_URL", "").strip()
    token = os.environ.get("SIMRUN_TOKEN", "").strip()
    missing = [name for name, value in (("SIMRUN_URL", url), ("SIMRUN_TOKEN", token)) if not value]
    if missing:
        raise CliError(
            f"{' and '.join(missing)} not set: export SIMRUN_URL (the address of the service) "
            "and SIMRUN_TOKEN (your token), or add --local for the local service of this "
            "directory"
        )
    return Client(url, token)


def local_client(root: Path | None = None) -> Client:
    """The client of the local service of a directory (the current one), started if none runs."""
    try:
        info = ensure_local(root or Path.cwd())
    except RuntimeError as error:
        raise CliError(f"the local service is not available: {error}") from None
    return Client(info.url, info.token)


def connect(local: bool) -> Client:
    """The client of a command: `local_client()` with `--local`, else `make_client()`."""
    return local_client() if local else make_client()
