"""The backends a settings file names (`backend:`), and the settings block each declares.

`backend` is a short name of `BACKENDS` or a `module:callable`: a `BackendFactory`, called
with the service's settings and its own block of them (`simrun_api.app.backend_from_settings`).
A factory that has settings of its own declares them (`settings_key`, `settings_type`), so a
new backend is one module and no edit of the service's settings (`simrun_api.settings`).
"""

from __future__ import annotations

import importlib
from typing import cast

import msgspec

from simrun_api.backends.base import BackendFactory

DEFAULT_BACKEND = "simrun_api.backends.local:local_backend"
BACKENDS = {
    "local": DEFAULT_BACKEND,
    "argo": "simrun_api.backends.argo:argo_backend",
    "slurm": "simrun_api.backends.slurm:slurm_backend",
}
"""The backends a settings file names by a short name (`backend: argo`)."""


def factory_of(backend: str | None) -> BackendFactory:
    """The factory `backend` names (the local backend's for None). ValueError naming the
    backend when it is no `module:callable`, its module cannot be imported or lacks it."""
    spec = BACKENDS.get(backend or "local", backend or DEFAULT_BACKEND)
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"backend {spec!r}: expected module:callable")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except ImportError as error:
        raise ValueError(f"backend {spec!r}: {error}") from None
    except AttributeError:
        raise ValueError(f"backend {spec!r}: {module_name} has no {attribute!r}") from None
    if not callable(factory):
        raise ValueError(f"backend {spec!r}: {attribute!r} is not callable")
    return cast(BackendFactory, factory)


def declared_settings(factory: object) -> tuple[str, type[msgspec.Struct]] | None:
    """The settings block a factory declares (`settings_key`, `settings_type`), None when it
    declares none. ValueError for one half of a declaration, or a type that is no struct."""
    key = getattr(factory, "settings_key", None)
    struct = getattr(factory, "settings_type", None)
    if key is None and struct is None:
        return None
    name = getattr(factory, "__qualname__", repr(factory))
    if not isinstance(key, str) or not key:
        raise ValueError(f"backend {name}: settings_type without a settings_key (a string)")
    if not (isinstance(struct, type) and issubclass(struct, msgspec.Struct)):
        raise ValueError(f"backend {name}: the settings_type of {key!r} is no msgspec.Struct")
    return key, struct
