"""The local service of a project directory: the service with the local backend in `.simrun/`.

`.simrun/` holds the store, the scratch, the index, the tokens (0600) and, while the service
runs, `service.json` (0600). One service runs per directory: it holds the lock of its store
(`store_lock`, which a service of a settings file on that store takes too). It listens on
127.0.0.1 only, kills what a service that died left running, and cancels its runs when it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import secrets
import signal
import socket
from collections.abc import Callable
from pathlib import Path

import msgspec
import uvicorn

from simrun_api.app import create_app, stop_on_signals
from simrun_api.auth import load_tokens, write_tokens
from simrun_api.backends.local import local_backend
from simrun_api.server import server_config
from simrun_api.service import Service
from simrun_api.settings import ServiceSettings
from simrun_api.store_lock import StoreLocked, lock_index, lock_store
from simrun_core.environment import environment
from simrun_core.local_layout import LOCAL_STORE, SERVICE_FILE, local_dir
from simrun_core.service_allocator import adopt_service_allocator
from simrun_core.store import write_atomic
from simrun_core.wire import Identity, LocalServiceInfo


class ServiceRunning(RuntimeError):
    """The local service of the directory runs already."""


def local_settings(root: Path) -> ServiceSettings:
    """The settings of the local service; the tokens file is made once with a token of the user."""
    path = local_dir(root)
    tokens = path / "tokens.yaml"
    user = getpass.getuser()
    if not tokens.exists():
        write_tokens(tokens, {secrets.token_urlsafe(32): Identity(user, "person", user)})
    return ServiceSettings(
        store=path / LOCAL_STORE,
        db=path / "simrun.sqlite",
        tokens=tokens,
        owner=user,
        scratch=path / "scratch",
        events_poll_s=0.5,
    )


def user_token(settings: ServiceSettings) -> str:
    """The token of the directory's user (the owner of its local service)."""
    for token, identity in load_tokens(settings.tokens).items():
        if identity == Identity.person(settings.owner):
            return token
    raise RuntimeError(f"{settings.tokens} has no token of the user {settings.owner}")


def listening_socket(port: int = 0) -> socket.socket:
    """A socket bound to `port` of 127.0.0.1 (0: a free one) for a service to listen on. Named
    IPPROTO_TCP: asyncio then sets TCP_NODELAY on each connection (no Nagle wait)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def serve_local(
    root: Path,
    port: int = 0,
    idle_exit_s: float | None = None,
    background: bool = False,
    ready: Callable[[LocalServiceInfo], None] | None = None,
    stopping: Callable[[str], None] | None = None,
) -> None:
    """Run the local service of a directory until stopped (SIGINT, SIGTERM, SIGHUP, idle).

    Raises ServiceRunning when the directory's service runs already.
    """
    adopt_service_allocator()
    root = root.resolve()
    path = local_dir(root)
    try:
        lock = lock_store(path / LOCAL_STORE)  # held for the service's life
    except StoreLocked as error:
        holder = error.holder
        held = f" (pid {holder.pid} on host {holder.host})" if holder is not None else ""
        raise ServiceRunning(f"the local service of {root} runs already{held}") from None
    index_lock = None
    try:
        settings = local_settings(root)
        index_lock = lock_index(settings.db)  # a service of a settings file may name it
        token = user_token(settings)
        backend = local_backend(settings, None)
        instance = secrets.token_hex(16)
        app = create_app(settings, backend, instance=instance)
        sock = listening_socket(port)
        bound = sock.getsockname()[1]
        info = LocalServiceInfo(
            instance=instance,
            pid=os.getpid(),
            port=bound,
            token=token,
            url=f"http://127.0.0.1:{bound}",
            background=background,
            **environment(),
        )
        config = server_config(app, settings, log_level="warning", access_log=False)
        server = uvicorn.Server(config)
        service: Service = app.state.service
        # uvicorn re-raises the signal that stopped it once it is done; handled, it ends here.
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop_signal, lambda number, frame: None)
        try:
            asyncio.run(_serve(server, sock, path, info, service, idle_exit_s, ready, stopping))
        finally:
            stop_on_signals()
    finally:
        with contextlib.suppress(OSError):
            current = msgspec.json.decode((path / SERVICE_FILE).read_bytes())
            if current.get("instance") == instance:
                (path / SERVICE_FILE).unlink()
        if index_lock is not None:
            index_lock.release()
        lock.release()


async def _serve(
    server: uvicorn.Server,
    sock: socket.socket,
    path: Path,
    info: LocalServiceInfo,
    service: Service,
    idle_exit_s: float | None,
    ready: Callable[[LocalServiceInfo], None] | None,
    stopping: Callable[[str], None] | None,
) -> None:
    async def watch() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.02)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, lambda: setattr(server, "should_exit", True))
        write_atomic(path / SERVICE_FILE, msgspec.json.encode(info), mode=0o600)
        if ready is not None:
            ready(info)
        while not server.should_exit:
            await asyncio.sleep(1.0)
            if idle_exit_s is not None and service.idle_for() >= idle_exit_s:
                server.should_exit = True
        live = service.supervisor.live_runs()
        if live and stopping is not None:
            stopping(f"cancelling {live} live runs and waiting for their processes")

    watcher = asyncio.create_task(watch())
    try:
        await server.serve(sockets=[sock])
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
