"""The settings of the service, read from the YAML file that `SIMRUN_CONFIG` names."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, TypeGuard

import msgspec
import yaml

from simrun_api.backends.registry import declared_settings, factory_of
from simrun_api.browsers import LOOPBACK_HOSTS, host_problems
from simrun_core.cluster import ClusterConfig

WEB_APP = Path(__file__).with_name("ui")
"""The built web app of the installation: `web/` of the repository built into the package."""


def installed_web() -> Path | None:
    """The web app of the installation (`WEB_APP`), None when it was not built into it."""
    return WEB_APP if (WEB_APP / "index.html").is_file() else None


class ServiceSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The settings of the service: where the store, index and tokens are, and its timings.

    `scratch` is the local scratch of the local backend (`scratch` beside `db` by default);
    `backend` is `local`, `argo` or `module:callable` (`simrun_api.backends.registry`), the
    local backend by default; a backend's own settings are the block under the key it declares
    (`BackendFactory.settings_key`), decoded by `load_settings` into `backend_settings`;
    `web` the directory of the built web app served at `/ui/` without a token: the one of the
    installation by default (`installed_web`), None (`web: null`) for no `/ui/`.
    `max_body_bytes` is the largest JSON body a route takes (larger: 413, refused before it is
    read whole); `max_upload_bytes` the largest body of an upload of a snapshot (2 GiB; larger:
    413, refused as soon as it passes it). An upload is spooled to the temporary directory of
    the service (`TMPDIR`, else `/tmp`) before it is checked, so that directory must hold this
    much for every concurrent upload. The sizes the members of its tar declare count against
    `max_upload_bytes` too, before anything is written (a small compressed or sparse tar may
    expand to far more). A file list (of `missing` or an upload's scan) has at most
    `max_snapshot_files` files (and makes at most as many directories), each path within the
    store's file system's limits (`NAME_MAX`, `PATH_MAX`) and 256 directories deep.

    The edit sessions of `simrun edit` (`simrun_api.edits`): a session's record (what its
    command read from disk: the workflow, the trees and snapshots of its sources) is at most
    `max_edit_session_bytes` (larger: 413); an identity has at most
    `max_edit_sessions_per_identity` sessions (opening one more removes its oldest that is
    closed or whose command is gone; 429 when every one is connected); a session closed, or
    not seen, for `edit_session_max_age_s` is removed.

    The limits on what clients may hold (`simrun_api.server`, `simrun_api.streams`):
    `max_connections` connections open at once (beyond them a request is answered 503; the
    process' open-file limit is raised to its hard limit at start, and the cap lowered to fit
    it); `header_timeout_s` for a request's headers to arrive whole, from the connection's
    start or the previous response's end (then the connection is closed); a request's body
    must arrive at `body_min_rate` bytes a second, checked over each `body_timeout_s` the
    service waits for it (else 408, the connection closed); `keep_alive_s` an
    idle keep-alive connection is kept; `max_streams_per_identity` event streams
    (`/runs/{run}/events`, `/events`) open at once per identity (beyond them: 429);
    `stream_queue_bytes` of messages a stream holds for a client that has not taken them (a
    client further behind is closed, and its reconnect with `Last-Event-ID` resumes from the
    log, so nothing is lost).

    `hosts` are the names the service is served under: a request with another `Host` is
    refused (421), so that a page of another site cannot reach it by DNS rebinding. The loopback
    names by default; on a cluster the names its clients use (`*` takes any name).
    """

    store: Path
    db: Path
    tokens: Path
    owner: str
    cluster: ClusterConfig = msgspec.field(default_factory=ClusterConfig)
    scratch: Path | None = None
    poll_s: float = 5.0
    events_poll_s: float = 0.5
    events_max_s: float = 300.0
    default_image: str | None = None
    simrun_wheel: Path | None = None
    python: str = "3.14"
    build_constraints: Path | None = None
    backend: str | None = None
    web: Path | None = msgspec.field(default_factory=installed_web)
    max_upload_bytes: int = 2 * 1024**3
    max_body_bytes: int = 8 * 1024**2
    max_snapshot_files: Annotated[int, msgspec.Meta(ge=1)] = 500_000
    max_edit_session_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 1024**2
    max_edit_sessions_per_identity: Annotated[int, msgspec.Meta(ge=1)] = 20
    edit_session_max_age_s: Annotated[float, msgspec.Meta(gt=0)] = 7 * 24 * 3600.0
    max_connections: Annotated[int, msgspec.Meta(ge=1)] = 4096
    header_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 10.0
    body_timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 20.0
    body_min_rate: Annotated[int, msgspec.Meta(ge=1)] = 500
    keep_alive_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    max_streams_per_identity: Annotated[int, msgspec.Meta(ge=1)] = 64
    stream_queue_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 128 * 1024
    hosts: list[str] = msgspec.field(default_factory=lambda: list(LOOPBACK_HOSTS))
    backend_settings: Any = None
    """The block of the chosen backend's own settings, its `settings_type` (None for a backend
    that declares none); not a key of the file: `load_settings` decodes the backend's key."""


NOT_A_KEY = "backend_settings"
"""The field of `ServiceSettings` that a settings file does not set."""


class SettingsError(ValueError):
    """A settings file that cannot be used; the message names the file and the field."""


def unknown_settings(
    struct: type[msgspec.Struct], data: dict[str, Any], prefix: str = ""
) -> list[str]:
    """The keys of `data` (and of its nested settings structs) that are no field, sorted."""
    fields = {field.encode_name: field for field in msgspec.structs.fields(struct)}
    unknown = []
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            unknown.append(f"{prefix}{key}")
        elif _is_struct(field.type) and isinstance(value, dict):
            unknown += unknown_settings(field.type, value, f"{prefix}{key}.")
    return sorted(unknown)


def _is_struct(type_: object) -> TypeGuard[type[msgspec.Struct]]:
    return isinstance(type_, type) and issubclass(type_, msgspec.Struct)


def load_settings(path: Path) -> ServiceSettings:
    """Read the settings from a YAML file; relative paths are relative to the file.

    The block under the key the chosen backend declares (`simrun_api.backends.registry`) is
    decoded with the backend's struct into `backend_settings`; every other key must be a
    setting of the service. SettingsError names the file and every key that is unknown, or
    what is wrong: the backend, a missing or invalid field.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SettingsError(f"settings file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise SettingsError(f"settings file {path}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"settings file {path}: expected a mapping of setting to value")
    backend = data.get("backend")
    try:
        declared = declared_settings(factory_of(backend if isinstance(backend, str) else None))
    except ValueError as error:
        raise SettingsError(f"settings file {path}: {error}") from None
    key = declared[0] if declared is not None else None
    if key is not None and key in _setting_names():
        raise SettingsError(
            f"settings file {path}: backend {backend!r} declares the key {key!r}, a setting of "
            "the service"
        )
    own = {name: value for name, value in data.items() if name != key}
    unknown = unknown_settings(ServiceSettings, own)
    if NOT_A_KEY in own:
        unknown = sorted([*unknown, NOT_A_KEY])
    block = data.get(key) if key is not None else None
    if declared is not None and isinstance(block, dict):
        unknown = sorted([*unknown, *unknown_settings(declared[1], block, f"{key}.")])
    if unknown:
        raise SettingsError(f"settings file {path}: unknown settings: {', '.join(unknown)}")
    problems = []
    try:
        settings = msgspec.convert(own, ServiceSettings, strict=False, dec_hook=_decode)
    except msgspec.ValidationError as error:
        problems.append(str(error))
    else:
        problems.extend(host_problems(settings.hosts))
    backend_settings = None
    if declared is not None:
        try:
            backend_settings = decode_block(*declared, block, base=path.parent)
        except msgspec.ValidationError as error:
            problems.append(str(error))
    if problems:
        raise SettingsError(f"settings file {path}: {'; '.join(problems)}")
    base = path.parent

    def relative(value: Path | None) -> Path | None:
        return None if value is None else base / value

    return msgspec.structs.replace(
        settings,
        store=base / settings.store,
        db=base / settings.db,
        tokens=base / settings.tokens,
        scratch=relative(settings.scratch),
        simrun_wheel=relative(settings.simrun_wheel),
        build_constraints=relative(settings.build_constraints),
        web=relative(settings.web),
        backend_settings=backend_settings,
    )


def decode_block(
    key: str, struct: type[msgspec.Struct], block: Any, base: Path | None = None
) -> msgspec.Struct:
    """A backend's block of settings (None or absent: every default) as its struct; a path in
    it relative to `base` (the settings file's directory). msgspec.ValidationError names the
    field below the key (`$.slurm.grace_s`)."""
    keyed = msgspec.defstruct("BackendBlock", [("block", struct, msgspec.field(name=key))])
    decoded: msgspec.Struct = msgspec.convert(
        {key: {} if block is None else block}, keyed, strict=False, dec_hook=_decode
    ).block  # type: ignore[attr-defined]
    if base is None:
        return decoded
    paths = {
        field.name: base / value
        for field in msgspec.structs.fields(decoded)
        if isinstance(value := getattr(decoded, field.name), Path)
    }
    return msgspec.structs.replace(decoded, **paths) if paths else decoded


def _setting_names() -> set[str]:
    return {field.encode_name for field in msgspec.structs.fields(ServiceSettings)}


def _decode(type_: type, value: Any) -> Any:
    if type_ is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError


def scratch_of(settings: ServiceSettings) -> Path:
    """The local scratch: the setting, else `scratch` beside the database (a local volume)."""
    return settings.scratch if settings.scratch is not None else settings.db.parent / "scratch"
