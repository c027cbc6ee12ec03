"""The settings of the service, read from the YAML file that `SIMRUN_CONFIG` names."""

from __future__ import annotations

from pathlib import Path

import msgspec
import yaml


class ServiceSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The settings of the service: where the store, index and tokens are, and its timings."""

    store: Path
    db: Path
    tokens: Path
    owner: str
    scratch: Path | None = None
    poll_s: float = 5.0
    events_poll_s: float = 0.5
    events_max_s: float = 300.0
    default_image: str | None = None
    backend: str | None = None
    web: Path | None = None
    max_upload_bytes: int = 2 * 1024**3
    grace_s: float = 60.0


class SettingsError(ValueError):
    """A settings file that cannot be used; the message names the file and the field."""


def load_settings(path: Path) -> ServiceSettings:
    """Read the settings from a YAML file; relative paths are relative to the file."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SettingsError(f"settings file {path}: {error}") from None
    try:
        settings = msgspec.convert(data, ServiceSettings, strict=False)
    except msgspec.ValidationError as error:
        raise SettingsError(f"settings file {path}: {error}") from None
    base = path.parent
    return msgspec.structs.replace(
        settings,
        store=base / settings.store,
        db=base / settings.db,
        tokens=base / settings.tokens,
        scratch=base / settings.scratch if settings.scratch else None,
    )
