"""A real Supervisor over a store on a given backend, for tests of whole runs without HTTP."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from simrun_api.backends.base import Backend
from simrun_api.environments import Environments
from simrun_api.index import RunIndex
from simrun_api.resources import ResourceStore
from simrun_api.supervisor import Supervisor
from simrun_core.plugins import load_task_types

Until = Callable[[Supervisor], bool | Awaitable[bool]]


def supervise(
    store: Path,
    backend: Backend,
    until: Until,
    *,
    environments: Environments | None = None,
    timeout_s: float = 20.0,
) -> None:
    """Start a Supervisor over `store` (its index beside it), wait until `until(supervisor)`
    holds (checked every 0.01 s, at most `timeout_s`), then close it."""

    async def main() -> None:
        db = store.parent / "db.sqlite"
        index, resources = RunIndex(db), ResourceStore(db)
        await index.open()
        await resources.open()
        supervisor = Supervisor(
            store, backend, load_task_types(), index, resources, environments=environments
        )
        await supervisor.start()
        try:
            with anyio.fail_after(timeout_s):
                while True:
                    done = until(supervisor)
                    if inspect.isawaitable(done):
                        done = await done
                    if done:
                        break
                    await anyio.sleep(0.01)
        finally:
            await supervisor.close()
            await resources.close()
            await index.close()

    anyio.run(main)
