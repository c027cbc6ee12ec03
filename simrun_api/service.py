"""The service object every route reaches: settings, tokens, types, index, supervisor."""

from __future__ import annotations

import dataclasses
import time

from simrun_api.backends.base import Backend
from simrun_api.index import RunIndex
from simrun_api.resources import ResourceStore
from simrun_api.settings import ServiceSettings
from simrun_api.subscribers import OpenStreams
from simrun_api.supervisor import Supervisor
from simrun_api.tokens_file import TokensFile
from simrun_core.plugins import TaskType
from simrun_core.states import RunState
from simrun_core.wire import RunItem


@dataclasses.dataclass
class Service:
    """What the routes share. `open_requests` and `last_request` tell whether it is idle."""

    settings: ServiceSettings
    backend: Backend
    types: dict[str, TaskType]
    tokens: TokensFile
    index: RunIndex
    resources: ResourceStore
    supervisor: Supervisor
    instance: str | None = None
    streams: OpenStreams = dataclasses.field(default_factory=OpenStreams)
    open_requests: int = 0
    last_request: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def writable(self) -> bool:
        """Whether the store can be written: False after an append failed (a full disk, a
        read-only store) until one succeeds or a probe does; meanwhile submissions get 507."""
        return self.supervisor.writable

    async def runs(
        self,
        group: str | None = None,
        owner: str | None = None,
        agent: str | None = None,
        state: RunState | None = None,
    ) -> list[RunItem]:
        """The runs of the index, newest first, filtered; the runs of an owner include their
        agents'. A live run is as its actor has it now."""
        items = await self.index.list(group, owner, agent, state.value if state else None)
        live = self.supervisor.live_item
        return [live(item.id) or item for item in items]

    def idle_for(self) -> float:
        """Seconds without a request and without a live run; 0 while either exists."""
        if self.open_requests or self.supervisor.live_runs():
            return 0.0
        return time.monotonic() - self.last_request
