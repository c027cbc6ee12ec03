"""The protocol of a backend: it runs the pods of a run and reports every change of them.

A backend reports facts as `PodChanged` messages (a pod is pending, runs, ended with an exit
code and evidence of a kill for memory) and, where its workflows outlive the service, a
`WorkflowGone` (the run's workflow deleted under it); what follows from them (a retry, the
state of a task, the start of a task whose inputs are done, the end of the run) is decided by
`simrun_core.decider` and carried out by the run's actor, which submits the run with the tasks
to start at once (`RunSubmission.ready`), calls `start_task` for a task the decider starts later,
`retry` for an attempt it wants and `cancel` to stop a run. A backend that retries its pods
itself (Argo's `retryStrategy`) declares it in `Capabilities.retries_pods`, one whose engine
starts a task once its inputs succeeded (Argo's DAG) in `Capabilities.runs_dag`: their policy
is the decider's, written into their manifests.

A backend is one module: its class, which keeps this protocol and declares what it can do
beyond it (`Capabilities`), and its factory, the callable a settings file names (`backend:`,
`simrun_api.backends.registry`), which may declare a settings block of its own
(`BackendFactory.settings_key`, `.settings_type`). Every backend passes the contract suite of
`tests/backends/contract.py` (`BackendContract`, subclassed per backend).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from simrun_core.fold import RunRecord
from simrun_core.messages import BackendReport, PodChanged
from simrun_core.naming import workflow_name
from simrun_core.planner import POD_START_S, Node
from simrun_core.plugins import TaskType
from simrun_core.wire import ServerUsage

if TYPE_CHECKING:
    from simrun_api.settings import ServiceSettings


class ReservationRefused(Exception):
    """A node cannot be reserved for a run, for good: it does not exist, or another run holds
    it. A backend that cannot be reached raises anything else (the actor tries again)."""


@dataclasses.dataclass(frozen=True)
class RunSubmission:
    """What a backend needs to run a run: its record, the task types, and what is done already:
    the tasks done, those to start now, the next attempt of each (task, worker) and the (task,
    worker) pairs killed for memory (their next attempts get the retry memory)."""

    record: RunRecord
    types: dict[str, TaskType]
    done: frozenset[str] = frozenset()
    ready: frozenset[str] = frozenset()
    """The tasks to start at once (every task they read from is done); the others wait for
    `Backend.start_task` (unless `Capabilities.runs_dag`)."""
    next_attempts: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    retry_memory: frozenset[tuple[str, str]] = frozenset()
    environment_failed: Callable[[str], None] | None = None
    """Called (in the event loop's thread) by a backend that took the run but cannot make its
    environment, with why: the local backend when the venv of the run's snapshots cannot be
    created; nothing of the run runs then. The actor sends it on as `EnvironmentFailed`
    (`environment_failed=lambda reason: self.send(msg.EnvironmentFailed(reason=reason))`);
    without it the backend reports the first attempt of the first task to run failed with the
    reason (a configuration error, exit 4), which fails the run too."""


class ImageBuilds(Protocol):
    """What looks up and builds the images of environments in the registry of a cluster."""

    async def has_image(self, ref: str) -> bool:
        """Whether the registry has the image."""
        ...

    async def build_image(self, context: os.PathLike[str] | str, ref: str) -> None:
        """Build the image of a flat build context and push it as `ref`."""
        ...


class PodHints(Protocol):
    """What learns from the actor, through the harness logs, that a run's pod changed before
    the backend reported it: a backend that learns its pods' changes by polling looks now.
    Hints only: one may come late, twice, or never, and the backend's own look decides."""

    def started(self, run_id: str) -> None:
        """A pod of the run writes its harness log, and its start is not reported yet."""
        ...

    def merged(self, run_id: str, task: str) -> None:
        """The coordinator of the run's task merged (its `merged` event is in the run's log):
        its pod, whose end is the task's, ends within moments."""
        ...


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond running pods: reserve nodes for a run, run the images of
    environments, retry failed pods by itself (else it starts an attempt on `retry`), and how
    long the merge marker of a coordinator that succeeded may take to be seen by the service
    (0 where the pods write the service's own file system; on NFS a pod's file may come
    later)."""

    reservations: bool = False
    images: bool = False
    retries_pods: bool = False
    runs_dag: bool = False
    """The backend's engine starts a task once the tasks it reads from succeeded (Argo's DAG:
    the decider's rule written into the workflow); without it a task starts only when the run
    is submitted with it `ready` or `start_task` is called for it."""
    merge_marker_grace_s: float = 0.0
    pods_outlive_service: bool = False
    """The pods of runs go on without the service (a cluster's): stopping the service stops
    following its runs instead of cancelling them."""
    admits_pods: bool = False
    """The pods of runs wait for admission (Kueue): an attempt is reported `admitted` between
    `pending` and `running`."""
    pod_logs_in_store: bool = True
    """The pods write their output into the store themselves (`tasks/<task>/logs/<pod>.log`,
    local processes); else the logs of a final task are fetched (`logs`) and kept there."""
    local_commands: bool = False
    """The backend runs the `command` tasks as their run says (`local_commands`: `direct` as
    processes, `docker` in their images with docker or podman); a backend without it runs
    every task in its image and refuses a run that asks for either."""
    image_builds: ImageBuilds | None = None
    """What builds the images of environments (`images`): with it, and a registry of the
    cluster, the service resolves the environment of a run from its snapshots and has its
    image built (`simrun_api.cluster_environments`); without it every run runs in the default
    image."""
    run_venvs: Path | None = None
    """Where the backend makes the venv of a run with snapshots, `<run_venvs>/<run>/`
    (`simrun_api.backends.local_env`), and runs the run's processes in it: the service makes
    it at the submission and asks it about the task types of the snapshots that the service
    does not know (`simrun_api.snapshot_types`). None where the pods run in images."""
    pod_start_s: float = POD_START_S
    """About the seconds from a pod's creation to its first unit on this backend: the planner
    adds a pod to a split task only while every pod keeps at least this much work
    (`simrun_core.planner.plan_task`). Kubernetes' pod start by default; a Slurm job starts in
    about a second."""
    pod_hints: PodHints | None = None
    """What the actor tells when the harness logs show a pod started or a coordinator merged
    before the backend reported it, so a backend that polls looks at once instead of at its
    next interval (`PodHints`). None where changes come by themselves (processes, a watch)."""


class Backend(Protocol):
    """Runs the pods of runs and reports their changes through the callback given to `submit`."""

    name: str
    max_pods: int
    capabilities: Capabilities

    async def nodes(self) -> list[Node]:
        """The nodes the planner plans on."""
        ...

    async def servers(self) -> list[ServerUsage]:
        """The servers with the cores and memory the pods of runs may have, and those pods."""
        ...

    async def recover(self) -> int:
        """Clean up after an earlier service that died (locally: kill the processes it left
        running); the number of things cleaned up. Called once, before any `submit`."""
        ...

    async def submit(self, run: RunSubmission, report: Callable[[BackendReport], None]) -> str:
        """Start (or take over) the run; its deterministic workflow name (`workflow_name`).
        A run submitted before (by this or an earlier service) is taken as submitted, not
        started twice; its `ready` tasks start as with `start_task` (a restarted actor's
        resubmission carries a start its crash lost). `report` takes the facts: a pod changed
        (`PodChanged`), the run's workflow went from under it (`WorkflowGone`, where workflows
        outlive the service)."""
        ...

    async def reserve(self, node: str, run_id: str) -> None:
        """Reserve a node for a run, so other runs' pods leave it and stay off (idempotent for
        the run holding it); ReservationRefused for an unknown node, one another run holds,
        and always without `Capabilities.reservations`."""
        ...

    async def release(self, node: str, run_id: str) -> None:
        """Release a run's reservation of a node; nothing of another run's, and nothing for a
        node that is gone; a no-op without `Capabilities.reservations`."""
        ...

    async def start_task(self, run_id: str, task: str) -> None:
        """Start the pods of a task of the run (the next attempt of each worker the submission
        names): the decider found every task it reads from done. Idempotent; a no-op for a
        task started already, a cancelled run, and a backend that `runs_dag`. A pod that
        cannot be made is reported failed, naming why."""
        ...

    async def retry(
        self, run_id: str, task: str, worker: str, attempt: int, retry_memory: bool
    ) -> None:
        """Start `attempt` of a worker whose previous attempt failed (with the retry memory
        when asked); a no-op for a backend that retries its pods itself, or a cancelled run."""
        ...

    async def cancel(self, run_id: str) -> None:
        """End every pod of a run and start none any more; returns once they are gone."""
        ...

    def has(self, run_id: str) -> bool:
        """Whether the backend runs the run."""
        ...

    async def logs(self, run_id: str, task: str) -> dict[str, str]:
        """The output of each pod of a task so far, by pod name (`<worker>-<attempt>`)."""
        ...

    async def close(self) -> None:
        """Stop: cancel every run and wait for its pods, or, where the pods outlive the service
        (`Capabilities.pods_outlive_service`), leave them running and stop following them."""
        ...


class BackendFactory(Protocol):
    """The callable a settings file names (`backend:`): it makes the backend of the service's
    settings and of its own block of them. It may declare that block with two attributes,
    `settings_key` (the top-level key of the settings file, e.g. `slurm`) and `settings_type`
    (a `msgspec.Struct` with `forbid_unknown_fields=True`); `load_settings` then decodes the
    block under that key (absent: all defaults) and the factory gets it as `block`, else
    None."""

    def __call__(self, settings: ServiceSettings, block: Any, /) -> Backend: ...


__all__ = [
    "Backend",
    "BackendFactory",
    "Capabilities",
    "ImageBuilds",
    "PodChanged",
    "PodHints",
    "ReservationRefused",
    "RunSubmission",
    "workflow_name",
]
