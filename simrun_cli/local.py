"""The local service of a project directory, client side: find it in `.simrun/`, start it, stop it.

A service runs when the pid of `.simrun/service.json` is alive, `GET /local/instance` (without a
token) answers the instance of the file, and `GET /me` with the token answers 200: the token goes
only to a server that proved to be the one of the file. A command that finds none starts one in
the background under an exclusive lock of `.simrun/start.lock`, so concurrent commands start one.
A service in the background that runs another environment than the command (python, simrun, task
types: `environment()`) is started again when it is idle, else used with a warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import msgspec

from simrun_cli.environment_cache import known_environment
from simrun_cli.formats import format_duration
from simrun_core.local_layout import (
    IDLE_EXIT_S,
    LOCAL_DIR,
    SERVICE_LOG,
    START_LOCK,
    local_dir,
    service_path,
)
from simrun_core.service_allocator import service_environment
from simrun_core.states import RunState
from simrun_core.wire import InstanceAnswer, LocalServiceInfo, RunItem

INSTANCE_PATH = "/local/instance"
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 90.0
PROBE_TIMEOUT_S = 2.0
POLL_S = 0.05
LOG_TAIL_LINES = 30
EXIT_SERVICE_RUNNING = 3
LIVE_STATES = tuple(state for state in RunState if not state.ended)
"""The states of a run that has not ended (`simrun_core.states`, the one definition)."""

Warn = Callable[[str], None]


def read_service(root: Path) -> LocalServiceInfo | None:
    """The service `.simrun/service.json` names.

    None without a readable file, with one that is not a service record, or with a URL that is
    not the one of its port on 127.0.0.1 (a token is never sent anywhere else).
    """
    try:
        data = service_path(root).read_bytes()
    except OSError:
        return None
    return _service_of(data)


def _service_of(data: bytes) -> LocalServiceInfo | None:
    try:
        info = msgspec.json.decode(data, type=LocalServiceInfo)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if info.url.rstrip("/") != f"http://127.0.0.1:{info.port}":
        return None
    return info


def pid_alive(pid: int) -> bool:
    """Whether a process runs with this pid (a zombie, which has ended, does not count)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def answers_instance(info: LocalServiceInfo, http: httpx.Client | None = None) -> bool:
    """Whether the server at the URL of `info` answers its instance at `/local/instance`.

    The request carries no token. `http`: the client of the probes (`probe_client()`, left
    open), else one of its own.
    """
    try:
        with _probing(http) as client:
            response = client.get(f"{info.url.rstrip('/')}{INSTANCE_PATH}")
    except httpx.HTTPError:
        return False
    if response.status_code != 200:
        return False
    try:
        answer = msgspec.json.decode(response.content, type=InstanceAnswer)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return answer.instance == info.instance


def accepts_token(info: LocalServiceInfo, http: httpx.Client | None = None) -> bool:
    """Whether `GET /me` with the token of `info` answers 200; ask only after `answers_instance`."""
    try:
        with _probing(http) as client:
            response = client.get(
                f"{info.url.rstrip('/')}/me", headers={"Authorization": f"Bearer {info.token}"}
            )
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def running_service(root: Path, http: httpx.Client | None = None) -> LocalServiceInfo | None:
    """The service of a project directory if it runs: pid alive, instance answered, token taken.

    `http`: the client of the probes (`probe_client()`, left open), else one of its own. A
    service this process verified already (`verify_service`) is not asked again while its
    `service.json` is as it was then and its pid alive.
    """
    found = _running(root, http)
    return found[0] if found is not None else None


def _running(root: Path, http: httpx.Client | None) -> tuple[LocalServiceInfo, bytes] | None:
    """`running_service` and the bytes of the `service.json` that named it."""
    try:
        data = service_path(root).read_bytes()
    except OSError:
        return None
    info = _service_of(data)
    if info is None or not pid_alive(info.pid):
        return None
    known = _verified
    if known is not None and known.root == Path(root) and known.service_file == data:
        return info, data
    if not answers_instance(info, http) or not accepts_token(info, http):
        return None
    return info, data


class Verified(NamedTuple):
    """A local service this process found running, for the forks of the warm command process
    (`simrun_cli.warm`) not to probe it again: the bytes of its `service.json` then, and the
    environment of this process."""

    root: Path
    service_file: bytes
    environment: dict[str, str]


_verified: Verified | None = None


def verify_service(root: Path) -> LocalServiceInfo | None:
    """Probe the local service of a project directory once and keep what was found for this
    process and its forks: the service while its file stays as it was and its pid lives, the
    environment of this process while it runs. None (nothing kept) when no service runs."""
    global _verified
    root = Path(root).resolve()
    with probe_client() as http:
        found = _running(root, http)
    if found is None:
        return None
    info, data = found
    _verified = Verified(root, data, known_environment(local_dir(root), environment))
    return info


def environment() -> dict[str, str]:
    """The environment of this process (`simrun_core.environment.environment`, imported on the
    first call: it needs `importlib.metadata` and scans every installed distribution)."""
    from simrun_core.environment import environment as of_this_process

    return of_this_process()


def environment_differences(
    info: LocalServiceInfo, mine: dict[str, str] | None = None
) -> list[str]:
    """What differs between the environment of a service and the one of this process.

    `mine`: the `environment()` of this process if known (it scans the installed distributions).
    """
    mine = environment() if mine is None else mine
    theirs = {"python": info.python, "version": info.version, "types": info.types}
    return [
        f"{key} {theirs[key] or '(none)'} instead of {mine[key]}"
        for key in mine
        if theirs[key] != mine[key]
    ]


def live_runs(info: LocalServiceInfo, http: httpx.Client | None = None) -> int | None:
    """The runs of a service that are submitting, queued or running; None if it did not say."""
    count = 0
    try:
        with _probing(http) as client:
            for state in LIVE_STATES:
                response = client.get(
                    f"{info.url.rstrip('/')}/runs",
                    params={"state": state},
                    headers={"Authorization": f"Bearer {info.token}"},
                )
                if response.status_code != 200:
                    return None
                count += len(msgspec.json.decode(response.content, type=list[RunItem]))
    except (httpx.HTTPError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    return count


def serve_command() -> list[str]:
    """The command of a local service in the background (`-P`: the project is not on the path)."""
    return [
        sys.executable,
        "-P",
        "-m",
        "simrun_cli",
        "serve",
        "--local",
        "--idle-exit",
        str(IDLE_EXIT_S),
    ]


def ensure_local(
    root: Path,
    timeout_s: float = START_TIMEOUT_S,
    warn: Warn | None = None,
    http: httpx.Client | None = None,
) -> LocalServiceInfo:
    """The local service of a project directory, started in the background if none runs.

    The start runs under an exclusive lock of `.simrun/start.lock`, so concurrent calls start
    one service; a start refused because a service of the directory still ends is repeated once
    it has ended. A service whose environment differs from the one of this process runs code
    this command does not: one in the background without a live run is stopped and started
    again (and `warn` told so); one with live runs, or in the foreground, is used and `warn`
    says why. `http` is the client of the probes (`probe_client()`, left open for the client of
    the command), else one is made and closed here.

    Raises:
        RuntimeError: The service did not start within `timeout_s` or its process exited; the
            message has the end of `.simrun/service.log`.
    """
    with _probing(http) as client:
        say = warn if warn is not None else _stderr
        return _ensure_local(Path(root).resolve(), timeout_s, say, client)


def _ensure_local(root: Path, timeout_s: float, say: Warn, http: httpx.Client) -> LocalServiceInfo:
    directory = local_dir(root)
    # Known once, and only to compare with a service: from `.simrun/environment.json` while the
    # installation is unchanged, else scanned.
    known = _verified
    if known is not None and known.root == root:
        mine: Callable[[], dict[str, str]] = lambda: known.environment  # noqa: E731
    else:
        mine = functools.cache(lambda: known_environment(directory, environment))
    info = running_service(root, http)
    if info is not None and not environment_differences(info, mine()):
        return info
    with _exclusive_lock(directory / START_LOCK):
        info = running_service(root, http)
        if info is None:
            return _start(root, time.monotonic() + timeout_s, timeout_s, http)
        differences = environment_differences(info, mine())
        if not differences:
            return info
        what = (
            f"the local service (pid {info.pid}) runs another environment than this command "
            f"({'; '.join(differences)})"
        )
        if not info.background:
            say(
                f"warning: {what}; it runs in the foreground, so this command uses it "
                "(stop it and start it again to run this environment)"
            )
            return info
        # Idle is no live run and no open request. The service does not expose its open
        # requests, so only the runs are checked: a request another command has open right now
        # (or a run it submits between this check and the stop) is cut off by the stop, whose
        # end cancels the runs as any graceful stop does.
        live = live_runs(info, http)
        if live != 0:
            runs = "an unknown number of" if live is None else str(live)
            say(
                f"warning: {what}; it has {runs} live runs, so this command uses it (it is "
                "started again with this environment once it is idle)"
            )
            return info
        say(f"{what}: starting it again")
        stop_local(root, http=http)
        return _start(root, time.monotonic() + timeout_s, timeout_s, http)


def stop_local(
    root: Path,
    timeout_s: float = STOP_TIMEOUT_S,
    stopping: Callable[[LocalServiceInfo], None] | None = None,
    http: httpx.Client | None = None,
) -> LocalServiceInfo | None:
    """Stop the local service of a project directory with SIGTERM and wait for its process to end.

    The service removes its `service.json` before its process ends; the end cancels its runs.

    Returns:
        The service that was stopped, None when none runs.

    Raises:
        RuntimeError: `service.json` names a live process that does not answer as the service
            (it is not signalled), or the service did not end within `timeout_s`.
    """
    root = Path(root).resolve()
    info = read_service(root)
    if info is None or not pid_alive(info.pid):
        return None
    if not answers_instance(info, http):
        raise RuntimeError(
            f"{service_path(root)} names pid {info.pid} at {info.url}, which does not answer as "
            "that service: not stopping it"
        )
    os.kill(info.pid, signal.SIGTERM)
    if stopping is not None:
        stopping(info)
    deadline = time.monotonic() + timeout_s
    while pid_alive(info.pid):
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"the local service (pid {info.pid}) did not end within "
                f"{format_duration(timeout_s)}"
            )
        time.sleep(POLL_S)
    return info


def log_tail(root: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of `.simrun/service.log`, or a note that it is empty."""
    try:
        text = (Path(root) / LOCAL_DIR / SERVICE_LOG).read_text(errors="replace")
    except OSError:
        return "(no .simrun/service.log)"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else "(.simrun/service.log is empty)"


def _start(
    root: Path, deadline: float, timeout_s: float, http: httpx.Client | None = None
) -> LocalServiceInfo:
    retried = False
    while True:
        child = _spawn(root)
        info = _await_service(root, child, deadline, timeout_s, http)
        if info is not None:
            return info
        if child.returncode == EXIT_SERVICE_RUNNING and not retried:
            retried = True
            _await_old_service_end(root, deadline, timeout_s)
            continue
        raise RuntimeError(
            f"the local service exited with code {child.returncode} before it answered; "
            f"the end of {root / LOCAL_DIR / SERVICE_LOG}:\n{log_tail(root)}"
        )


def open_service_log(root: Path) -> int:
    """The descriptor of `.simrun/service.log` for appending, the file private (0600, also
    one an older version left readable): what a service logs is its user's alone."""
    fd = os.open(
        Path(root) / LOCAL_DIR / SERVICE_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
    )
    os.fchmod(fd, 0o600)
    return fd


def _spawn(root: Path) -> subprocess.Popen[bytes]:
    with os.fdopen(open_service_log(root), "ab") as log:
        return subprocess.Popen(
            serve_command(),
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**service_environment(os.environ), "SIMRUN_BACKGROUND": "1"},
        )


def _await_service(
    root: Path,
    child: subprocess.Popen[bytes],
    deadline: float,
    timeout_s: float,
    http: httpx.Client | None = None,
) -> LocalServiceInfo | None:
    """The service once it answers; None when the child exited and no service answers."""
    while True:
        info = running_service(root, http)
        if info is not None:
            return info
        if child.poll() is not None:
            return running_service(root, http)
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"the local service (pid {child.pid}) did not answer within "
                f"{format_duration(timeout_s)}; "
                f"the end of {root / LOCAL_DIR / SERVICE_LOG}:\n{log_tail(root)}"
            )
        time.sleep(POLL_S)


def _await_old_service_end(root: Path, deadline: float, timeout_s: float) -> None:
    """Wait for the process `service.json` names (a service still ending) to end."""
    while True:
        info = read_service(root)
        if info is None or not pid_alive(info.pid):
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"the local service of pid {info.pid} runs and does not answer; it did not end "
                f"within {format_duration(timeout_s)}"
            )
        time.sleep(POLL_S)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def probe_client() -> httpx.Client:
    """A client for the probes of a local service: no proxies, no redirects, no token.

    The URL of a local service is always plain http on 127.0.0.1 (`read_service`), so the client
    has no SSL context that verifies certificates: building one loads certifi's CA bundle (~30 ms
    a client). The client of a command may take it over (`Client(http=...)`) once the service
    proved to be the one of `service.json`, reusing its connection. A client made ahead
    (`prepare_probe_client`) is taken first.
    """
    global _prepared_client
    client, _prepared_client = _prepared_client, None
    return client if client is not None else _new_probe_client()


_prepared_client: httpx.Client | None = None


def prepare_probe_client() -> None:
    """Make the client of the next `probe_client()` now: the warm command process does, for
    its forks (building one takes a few ms: its transport, pool and SSL context)."""
    global _prepared_client
    _prepared_client = _new_probe_client()


def _new_probe_client() -> httpx.Client:
    return httpx.Client(
        timeout=PROBE_TIMEOUT_S, trust_env=False, follow_redirects=False, verify=False
    )


@contextlib.contextmanager
def _probing(http: httpx.Client | None) -> Iterator[httpx.Client]:
    """`http`, left open, or a new probe client closed at the end."""
    if http is not None:
        yield http
        return
    with probe_client() as client:
        yield client


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
