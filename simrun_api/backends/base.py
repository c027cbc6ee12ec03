"""The protocol of a backend: it runs the DAG of a run and reports every change of a pod."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal, Protocol

from simrun_core.fold import RunRecord
from simrun_core.planner import Node
from simrun_core.plugins import TaskType
from simrun_core.wire import ServerUsage

Phase = Literal["pending", "running", "succeeded", "failed"]


@dataclasses.dataclass(frozen=True)
class PodChange:
    """A pod (a local process) of a task changed its phase.

    `failed` with `retry` means the backend retries it as `attempt + 1`; `oom` is the evidence
    that the out of memory killer (or SIGKILL) ended it.
    """

    task: str
    worker: str
    attempt: int
    phase: Phase
    exit_code: int | None = None
    pid: int | None = None
    node: str | None = None
    retry: bool = False
    oom: bool = False
    message: str | None = None


@dataclasses.dataclass(frozen=True)
class RunSubmission:
    """What a backend needs to run a run: its record, the task types, and what is done already:
    the tasks done, the next attempt of each worker and the workers killed for memory."""

    record: RunRecord
    types: dict[str, TaskType]
    done: frozenset[str] = frozenset()
    next_attempts: dict[str, int] = dataclasses.field(default_factory=dict)
    retry_memory: frozenset[str] = frozenset()


class Backend(Protocol):
    """Runs the pods of runs and reports their changes through the callback given to `submit`."""

    name: str
    max_pods: int

    def nodes(self) -> list[Node]:
        """The nodes the planner plans on."""
        ...

    def servers(self) -> list[ServerUsage]:
        """The servers with the cores and memory the pods of runs may have, and those pods."""
        ...

    def kill_orphans(self) -> int:
        """Kill what an earlier service that died left running; the number of groups killed."""
        ...

    async def submit(self, run: RunSubmission, report: Callable[[PodChange], None]) -> str:
        """Start (or take over) the run; its deterministic workflow name."""
        ...

    async def cancel(self, run_id: str) -> None:
        """End every pod of a run and start none any more; returns once they are gone."""
        ...

    def has(self, run_id: str) -> bool:
        """Whether the backend runs the run."""
        ...

    async def close(self) -> None:
        """Cancel every run and wait for its pods."""
        ...


def workflow_name(run_id: str) -> str:
    """The deterministic name of a run's workflow in a backend."""
    return f"simrun-{run_id}"
