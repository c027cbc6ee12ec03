"""The app of the service: people and agents submit, follow, inspect, compare and remove runs.

Every route (`simrun_api.routes`) needs a bearer token of the tokens file but `/local/instance`
and the files of the web app at `/ui/`; there are no documentation routes (`openapi_document()`
gives the document). A refusal is a status code with a `detail` that says what was wrong.
`serve_from_config()` runs the service of the settings file `SIMRUN_CONFIG` names.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import AsyncIterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import msgspec
import uvicorn
from litestar import Litestar, Request, Response
from litestar.datastructures import CacheControlHeader, State
from litestar.exceptions import ValidationException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.middleware import DefineMiddleware
from litestar.openapi import OpenAPIConfig
from litestar.response import Redirect
from litestar.static_files import create_static_files_router

import simrun_core
from simrun_api.access_log import redact_access_log
from simrun_api.auth import write_tokens
from simrun_api.backends.base import Backend
from simrun_api.backends.registry import BACKENDS, declared_settings, factory_of
from simrun_api.browsers import BrowserDefence
from simrun_api.cluster_environments import ClusterEnvironments, environments_for
from simrun_api.database import set_aside_if_unusable
from simrun_api.edits import EditSessions, SessionLimits
from simrun_api.index import SCHEMA as INDEX_SCHEMA
from simrun_api.index import RunIndex
from simrun_api.middleware import (
    OPEN_PATHS,
    ActivityMiddleware,
    BodyReadMiddleware,
    BodyRequest,
    TokenAuthentication,
    close_unread_body,
)
from simrun_api.resources import SCHEMA as LEARNED
from simrun_api.resources import ResourceStore
from simrun_api.routes import ROUTES
from simrun_api.routes.common import WorkflowRefused, workflow_refusal
from simrun_api.server import server_config
from simrun_api.service import Service
from simrun_api.settings import ServiceSettings, SettingsError, decode_block, load_settings
from simrun_api.state_schemas import state_schemas
from simrun_api.store_lock import lock_index, lock_store
from simrun_api.supervisor import Supervisor
from simrun_api.tokens_file import TokensFile
from simrun_core.plugins import TaskType, load_task_types
from simrun_core.service_allocator import adopt_service_allocator

__all__ = ["BACKENDS", "ROUTES", "create_app", "openapi_document", "serve_from_config"]

ENV_CONFIG = "SIMRUN_CONFIG"


def _validation_refusal(request: Request, error: ValidationException) -> Response[dict[str, Any]]:
    """A 400 whose detail names every field that is wrong, not only that validation failed."""
    detail = error.detail
    extra = error.extra if isinstance(error.extra, list) else []
    fields = [
        f"{item['key']}: {item['message']}"
        for item in extra
        if isinstance(item, dict) and "key" in item and "message" in item
    ]
    if fields:
        detail = f"{detail}: " + "; ".join(fields)
    content: dict[str, Any] = {"status_code": 400, "detail": detail}
    if error.extra:
        content["extra"] = error.extra
    return Response(content, status_code=400)


def _too_large(request: Request, error: RequestEntityTooLarge) -> Response[dict[str, Any]]:
    """A 413 that names the limit: the body was refused before it was read whole. The limit
    is the route's (`max_body_bytes` unless the route sets its own); a refusal that says
    which limit it passed (an upload's `max_upload_bytes`) keeps its detail."""
    if error.detail and error.detail != HTTPStatus.REQUEST_ENTITY_TOO_LARGE.phrase:
        detail = error.detail
    else:
        setting = request.app.state.service.settings.max_body_bytes
        limit = setting
        with contextlib.suppress(Exception):  # a refusal before the route was found
            limit = request.route_handler.resolve_request_max_body_size() or setting
        if limit == setting:
            detail = f"the body is larger than the {limit} bytes this service takes"
            detail += " (max_body_bytes)"
        else:
            detail = f"the body is larger than the {limit} bytes this route takes"
    return Response({"status_code": 413, "detail": detail}, status_code=413)


def _into_the_app(request: Request) -> Response[None] | None:
    """`/ui` redirects to `/ui/`: the app's files are named relative to its directory."""
    raw = request.scope.get("raw_path") or request.scope["path"].encode()
    if raw.split(b"?", 1)[0].endswith(b"/ui"):
        return Redirect("ui/")
    return None


OPENAPI = OpenAPIConfig(
    title="simrun",
    version=simrun_core.__version__,
    description="The service of simrun: submit, follow, compare and remove runs.",
    use_handler_docstrings=True,
)


def edit_sessions(settings: ServiceSettings) -> EditSessions:
    """The edit sessions of the store, within the limits of the settings."""
    limits = SessionLimits(
        max_bytes=settings.max_edit_session_bytes,
        per_identity=settings.max_edit_sessions_per_identity,
        max_age_s=settings.edit_session_max_age_s,
    )
    return EditSessions(settings.store, limits=limits)


def create_app(
    settings: ServiceSettings,
    backend: Backend,
    types: dict[str, TaskType] | None = None,
    instance: str | None = None,
    *,
    openapi: bool = False,
) -> Litestar:
    """The app of the service on a backend; its lifespan runs the supervisor.

    `openapi` builds the OpenAPI document (`app.openapi_schema`) and with it the documentation
    routes, which the service itself does not have: they would answer without a token.
    """
    types = load_task_types() if types is None else types
    tokens = TokensFile(settings.tokens)
    index = RunIndex(settings.db)
    resources = ResourceStore(settings.db)
    environments = environments_for(
        settings.store,
        backend,
        settings.cluster,
        python=settings.python,
        simrun_wheel=settings.simrun_wheel,
        build_constraints=settings.build_constraints,
    )
    supervisor = Supervisor(
        settings.store, backend, types, index, resources, environments=environments
    )
    service = Service(
        settings=settings,
        backend=backend,
        types=types,
        tokens=tokens,
        index=index,
        resources=resources,
        supervisor=supervisor,
        instance=instance,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        settings.store.mkdir(parents=True, exist_ok=True)
        # A file of the index that cannot be used is moved aside and rebuilt from the logs.
        await asyncio.to_thread(set_aside_if_unusable, settings.db, (INDEX_SCHEMA, *LEARNED))
        await index.open()
        try:
            await resources.open()
        except BaseException:
            await index.close()
            raise
        watching_tokens = asyncio.create_task(tokens.watch())
        try:
            await supervisor.start()
            yield
        finally:
            watching_tokens.cancel()
            await supervisor.close()
            if isinstance(environments, ClusterEnvironments):
                await environments.close()
            await resources.close()
            await index.close()

    handlers: list[Any] = list(ROUTES)
    if settings.web is not None:
        if not settings.web.is_dir():
            raise SettingsError(f"web: {settings.web} is no directory (null serves no /ui/)")
        handlers.append(
            create_static_files_router(
                path="/ui",
                directories=[settings.web],
                html_mode=True,
                # Revalidated on every load: a new installation's index.html names new assets.
                cache_control=CacheControlHeader(no_cache=True),
                before_request=_into_the_app,
            )
        )
    app = Litestar(
        route_handlers=handlers,
        state=State({"service": service, "edits": edit_sessions(settings)}),
        lifespan=[lifespan],
        middleware=[
            BodyReadMiddleware,
            ActivityMiddleware,
            DefineMiddleware(TokenAuthentication, exclude=OPEN_PATHS),
        ],
        exception_handlers={
            ValidationException: _validation_refusal,
            RequestEntityTooLarge: _too_large,
            WorkflowRefused: workflow_refusal,
        },
        # Checked on the Content-Length before any byte is read, and on the bytes received
        # of a chunked body. A route of uploads sets its own `request_max_body_size`
        # (`max_upload_bytes`); `close_unread_body` ends the connection of every refusal.
        request_max_body_size=settings.max_body_bytes,
        before_send=[close_unread_body],
        request_class=BodyRequest,
        openapi_config=OPENAPI if openapi else None,
    )
    # Around Litestar's own handler (as its CORS middleware is), so that no answer, a 404
    # included, goes to a foreign host or may be framed.
    app.asgi_handler = BrowserDefence(app.asgi_handler, settings.hosts)
    return app


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of the service, with the schemas of the ended run states and the
    final task states (`state_schemas`, which no route's shape refers to). The app is created
    on the local backend in a temporary directory; the routes depend on neither, so the
    document is the same on every machine."""
    from simrun_api.backends.local import LocalBackend

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_tokens(root / "tokens.yaml", {})
        settings = ServiceSettings(
            store=root / "store", db=root / "db.sqlite", tokens=root / "tokens.yaml", owner="-"
        )
        backend = LocalBackend(settings.store, root / "scratch", cores=1, memory_gb=1.0)
        app = create_app(settings, backend, types={}, openapi=True)
        # As JSON: a default of bytes (`Scan.patch`) is written as msgspec writes it, base64.
        document: dict[str, Any] = msgspec.json.decode(
            msgspec.json.encode(app.openapi_schema.to_schema())
        )
        document["components"]["schemas"].update(state_schemas())
        return document


def backend_from_settings(settings: ServiceSettings) -> Backend:
    """The backend of the settings: the factory `backend` names (`module:callable`, or a name
    of `BACKENDS`: `local`, `argo`; the local backend by default) called with the settings and
    the backend's own block of them (`backend_settings`; its defaults for settings not read
    from a file). SettingsError says what is wrong with `backend` or its block."""
    try:
        factory = factory_of(settings.backend)
        declared = declared_settings(factory)
    except ValueError as error:
        raise SettingsError(str(error)) from None
    block = settings.backend_settings
    if declared is not None and block is None:
        try:
            block = decode_block(*declared, None)
        except msgspec.ValidationError as error:
            raise SettingsError(str(error)) from None
    if declared is not None and not isinstance(block, declared[1]):
        raise SettingsError(
            f"backend {settings.backend!r}: its settings {declared[0]!r} are no "
            f"{declared[1].__name__} but {block!r}"
        )
    return factory(settings, block)


def stop_on_signals() -> None:
    """Let SIGTERM and SIGINT end the process again, as they do by default. Called once the
    server returned: no graceful stop is left to wait for, and whatever a failed start left
    behind (a thread that is never joined) must not keep the process from ending."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def serve_from_config(port: int = 8000, host: str = "127.0.0.1") -> None:
    """Run the service of the settings in the YAML file `SIMRUN_CONFIG` names until SIGINT or
    SIGTERM; it cancels its live runs when it stops.

    Raises SettingsError (a ValueError) when `SIMRUN_CONFIG` is not set, or its file, its
    tokens or its backend cannot be used; the message names the file and the setting.
    StoreLocked when another service holds the store or the index (it names its pid and host).
    """
    adopt_service_allocator()
    path = os.environ.get(ENV_CONFIG)
    if not path:
        raise SettingsError(f"{ENV_CONFIG} is not set: it names the YAML file of the settings")
    settings = load_settings(Path(path))
    # Before anything of the store is touched; held until the process ends.
    store_lock = lock_store(settings.store)
    try:
        index_lock = lock_index(settings.db)
    except BaseException:
        store_lock.release()
        raise
    try:
        backend = backend_from_settings(settings)
        app = create_app(settings, backend)
    except ValueError as error:
        index_lock.release()
        store_lock.release()
        raise SettingsError(f"settings file {path}: {error}") from None
    config = server_config(app, settings, host=host, port=port, log_level="info")
    redact_access_log()  # after uvicorn.Config, which configures the loggers
    server = uvicorn.Server(config)
    # uvicorn raises the signal that stopped it again once it is done; handled, it ends here.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda number, frame: None)
    try:
        server.run()
    finally:
        stop_on_signals()
        index_lock.release()
        store_lock.release()
