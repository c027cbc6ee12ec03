"""The service object every route reaches: settings, tokens, types, index, supervisor."""

from __future__ import annotations

import dataclasses
import time

from simrun_api.backends.base import Backend
from simrun_api.index import RunIndex
from simrun_api.resources import ResourceStore
from simrun_api.settings import ServiceSettings
from simrun_api.supervisor import Supervisor
from simrun_core.plugins import TaskType
from simrun_core.wire import Identity


@dataclasses.dataclass
class Service:
    """What the routes share. `open_requests` and `last_request` tell whether it is idle."""

    settings: ServiceSettings
    backend: Backend
    types: dict[str, TaskType]
    tokens: dict[str, Identity]
    index: RunIndex
    resources: ResourceStore
    supervisor: Supervisor
    instance: str | None = None
    open_requests: int = 0
    last_request: float = dataclasses.field(default_factory=time.monotonic)
    writable: bool = True

    def idle_for(self) -> float:
        """Seconds without a request and without a live run; 0 while either exists."""
        if self.open_requests or self.supervisor.live_runs():
            return 0.0
        return time.monotonic() - self.last_request
