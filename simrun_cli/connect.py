"""The client of a command: the service of `SIMRUN_URL`, or the local one of the directory."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from simrun_cli.client import Client
from simrun_cli.errors import CliError
from simrun_cli.local import Warn, ensure_local, probe_client, read_service


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


def local_client(root: Path | None = None, warn: Warn | None = None) -> Client:
    """The client of the local service of a directory (the current one), started if none runs.

    The client finds the service again when it is lost while waiting or following a run (it
    stopped or was killed): the service is started again, on another port. The client takes
    over the connection of the probes that found the service.
    """
    root = (root or Path.cwd()).resolve()
    say = warn if warn is not None else _stderr

    def relocate() -> tuple[str, str]:
        info = ensure_local(root, warn=say)
        return info.url, info.token

    http = probe_client()
    try:
        info = ensure_local(root, warn=say, http=http)
    except RuntimeError as error:
        http.close()
        raise CliError(f"the local service is not available: {error}") from None
    except BaseException:
        http.close()
        raise
    return Client(info.url, info.token, relocate=relocate, http=http)


@dataclass(frozen=True)
class FoundService:
    """The local service of a directory that a command found running (it did not start it)."""

    root: Path
    pid: int


@dataclass(frozen=True)
class Connection:
    """The client of a command, and the local service it found running, if it looked."""

    client: Client
    found: FoundService | None = None


def connect(local: bool, *, note_found: bool = True) -> Connection:
    """The client of a command: `local_client()` with `--local`, else `make_client()`; with
    `note_found`, whether the local service ran already before the command (the caller starts
    the warm command process for it, see `simrun_cli.main.connect`)."""
    if not local:
        return Connection(make_client())
    root = Path.cwd().resolve()
    if not note_found:
        return Connection(local_client(root))
    before = read_service(root)
    client = local_client(root)
    after = read_service(root) if before is not None else None
    if before is not None and after is not None and before.pid == after.pid:
        return Connection(client, FoundService(root, after.pid))
    return Connection(client)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
