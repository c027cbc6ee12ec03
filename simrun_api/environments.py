"""How the environment of a run is made ready before its submission: resolved from the run's
snapshots, then its image made sure of in the registry (spec 28, 42).

The decider asks (`ResolveEnvironment`, `BuildImage`), the run's actor does it in the background
through the one `Environments` of the service, so that two runs of the same new environment
build its image once. `OwnEnvironment` is the default: every run runs in the service's own
environment (the local backend; a backend without images), so nothing is built. A backend that
builds images (the Argo backend) gets `simrun_api.cluster_environments.ClusterEnvironments`.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from simrun_core.fold import RunRecord


class EnvironmentRefused(Exception):
    """The environment of a run cannot be resolved or its image not built; the message says
    why (the run fails with it)."""


class Resolved(NamedTuple):
    """A resolved environment: the image it needs (None: the service's own) and the hash of its
    lock (None without one)."""

    image: str | None
    lock_sha256: str | None = None


class Made(NamedTuple):
    """An image in the registry: built in `seconds`, or found there (`cached`)."""

    seconds: float | None
    cached: bool = False


class Environments(Protocol):
    """Resolves the environments of runs and makes sure of their images."""

    async def resolve(self, record: RunRecord) -> Resolved:
        """The environment of a run from its snapshots; EnvironmentRefused when it has none
        that can be resolved."""
        ...

    async def build(self, image: str) -> Made:
        """Make sure the registry has `image` (built once however many runs ask at once);
        EnvironmentRefused when it cannot be built."""
        ...


class OwnEnvironment:
    """Every run runs in the service's own environment: nothing to resolve or build."""

    async def resolve(self, record: RunRecord) -> Resolved:
        return Resolved(image=None)

    async def build(self, image: str) -> Made:
        raise EnvironmentRefused(f"this service builds no images (asked for {image})")
