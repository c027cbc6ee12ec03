"""The client of a command: the service of `SIMRUN_URL`, or the local one of the directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from simrun_cli import warm
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


def connect(local: bool) -> Client:
    """The client of a command: `local_client()` with `--local`, else `make_client()`.

    A command that found the local service running (not the one that started it) starts the
    warm command process of the directory too, if none runs: the commands after it start in a
    few ms (`simrun_cli.warm`).
    """
    if not local:
        return make_client()
    root = Path.cwd().resolve()
    if warm.in_fork:  # the command runs in the warm process already
        return local_client(root)
    found = read_service(root)
    client = local_client(root)
    info = read_service(root) if found is not None else None
    if found is not None and info is not None and found.pid == info.pid:
        warm.start_warm(root, info.pid)
    return client


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
