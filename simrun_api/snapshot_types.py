"""The task types a local submission's snapshots have and the service does not: asked of the
run's own environment, never imported into the service.

At `POST /runs` (and `POST /estimate`) of a service whose backend runs a run with snapshots in
a venv of its own (`Capabilities.run_venvs`: the local backend), a submission with snapshots
(`--snapshot`) whose tasks have a type the service does not know gets the venv of its run made
first, `<run_venvs>/<run>/` as the backend makes it (`local_env.create`, with the run id the
submission assigns): the probe (`simrun_harness.types_probe`) runs with its python, as a
harness of the run would, and answers what the plugin is (`simrun_core.snapshot_types`). The
service checks and plans those tasks with a `ProbedTaskType` of each answer, and the
`submitted` event records the answers (`Submitted.snapshot_types`), so the run's actor, the
backend, the learning of resources and a service started again have the types from the log
(`types_of_run`). The backend then finds the venv complete (its `ready` file) and runs the
run in it; it removes it at the end of the run as always. A submission that is refused, and
every estimate, removes the venv it made; the installer's output is kept in the run's
`environment.log` once the run is recorded.

On the cluster nothing of this happens (spec 09): a backend whose pods run in images (Argo)
plans with the service's types only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from pathlib import Path

import msgspec

from simrun_api.backends import local_env
from simrun_api.backends.base import Backend
from simrun_core.errors import Problem
from simrun_core.launch import snapshot_paths
from simrun_core.plugins import TaskType
from simrun_core.snapshot_types import ProbeAnswer, ProbedType, ProbeTask, recorded, task_type_of
from simrun_core.store import RunPaths
from simrun_core.store_layout import ENVIRONMENT_LOG
from simrun_core.wire import SubmitRequest

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SnapshotTypes:
    """What a submission's snapshots taught: the types they have (`probed`), the problems of
    the tasks whose type could not be asked about, and the venv made for it (None without)."""

    probed: dict[str, ProbedType] = dataclasses.field(default_factory=dict)
    problems: list[Problem] = dataclasses.field(default_factory=list)
    environment: Path | None = None

    def types(self, service_types: dict[str, TaskType]) -> dict[str, TaskType]:
        """The types to check the submission with: the service's, and those of the snapshots
        (a type the service has is the service's)."""
        if not self.probed:
            return service_types
        return {**{name: task_type_of(p) for name, p in self.probed.items()}, **service_types}

    def recorded(self) -> dict[str, ProbedType]:
        """The types as the `submitted` event records them."""
        return recorded(self.probed)

    def without_duplicates(self, problems: list[Problem]) -> list[Problem]:
        """The problems of the probe, then `problems` but those of the type of a task the probe
        has one for already (its type is unknown for the same reason)."""
        named = {problem.task for problem in self.problems}
        kept = [p for p in problems if not (p.task in named and p.field == "type")]
        return self.problems + kept

    async def discard(self) -> None:
        """Remove the venv made for the submission (refused, or only estimated)."""
        directory, self.environment = self.environment, None
        if directory is not None:
            try:
                await asyncio.to_thread(local_env.remove, directory)
            except OSError as error:
                log.warning(
                    "the venv %s of a refused submission is not removed: %s", directory, error
                )

    async def keep(self, store: Path, run_id: str) -> None:
        """Keep the venv for the run that was recorded, and the installer's output in the
        run's `environment.log` (best effort)."""
        directory, self.environment = self.environment, None
        if directory is not None:
            await asyncio.to_thread(_move_log, directory / ENVIRONMENT_LOG, store, run_id)


async def snapshot_types(
    backend: Backend,
    store: Path,
    types: dict[str, TaskType],
    request: SubmitRequest,
    run_id: str,
) -> SnapshotTypes:
    """The types of the tasks of a submission with snapshots that the service does not have,
    as the run's environment answers about them (see the module), on the store of the service;
    nothing for a backend without `Capabilities.run_venvs`, a submission without snapshots or
    without such tasks. A venv that cannot be made
    or a probe that fails is a problem of each such task (field `type`), and the venv goes."""
    venvs = backend.capabilities.run_venvs
    if venvs is None:
        return SnapshotTypes()
    snapshots = list(snapshot_paths(request.sources, store))
    tasks = [
        ProbeTask(task=task.id, type=task.type, settings=task.settings)
        for task in request.workflow.tasks
        if task.type not in types
    ]
    if not snapshots or not tasks:
        return SnapshotTypes()
    directory = venvs / run_id
    found = SnapshotTypes(environment=directory)
    asking = _Asking(directory, snapshots, bool(request.sources[0].snapshot))
    work = asyncio.ensure_future(asyncio.to_thread(asking.ask, msgspec.json.encode(tasks)))
    try:
        out = await asyncio.shield(work)
        answer = msgspec.json.decode(out, type=ProbeAnswer)
    except asyncio.CancelledError:
        found.environment = None
        asking.abandon()  # the request is gone: the venv goes once the thread is done
        raise
    except (local_env.RunEnvironmentError, msgspec.DecodeError) as error:
        await found.discard()
        found.problems = [_not_asked(task, str(error)) for task in tasks]
        return found
    found.probed = dict(answer.types)
    found.problems = [
        Problem(
            f"the task type {task.type!r} of the snapshots cannot be loaded: "
            f"{answer.errors[task.type]}",
            task=task.task,
            field="type",
        )
        for task in tasks
        if task.type in answer.errors
    ]
    if not found.probed:
        await found.discard()  # nothing to run in it: the submission is refused
    return found


class _Asking:
    """The making of a submission's venv and the probe in it, in a thread; abandoned (the
    request cancelled), the installer is killed and the venv removed once the thread is done."""

    def __init__(self, directory: Path, snapshots: list[str], model_snapshot: bool) -> None:
        self.directory = directory
        self.snapshots = snapshots
        self.model_snapshot = model_snapshot
        self._lock = threading.Lock()
        self._abandoned = False
        self._finished = False

    def ask(self, tasks: bytes) -> bytes:
        """Make the venv and run the probe in it: its answer; RunEnvironmentError."""
        try:
            local_env.create(
                self.directory,
                self.snapshots,
                self.directory / ENVIRONMENT_LOG,
                cancelled=lambda: self._abandoned,
            )
            root = None
            if self.model_snapshot:  # the model's shadow tree, first on PYTHONPATH (spec 31)
                root = local_env.sources_of(self.directory, self.snapshots)[0]
            return local_env.probe_types(self.directory, tasks, root)
        finally:
            with self._lock:
                self._finished = True
                if self._abandoned:
                    _remove(self.directory)

    def abandon(self) -> None:
        """Nobody waits for the answer any more: the venv goes (now, or when `ask` ends)."""
        with self._lock:
            self._abandoned = True
            if self._finished:
                _remove(self.directory)


def _remove(directory: Path) -> None:
    try:
        local_env.remove(directory)
    except OSError as error:
        log.warning("the venv %s of an abandoned submission is not removed: %s", directory, error)


def _not_asked(task: ProbeTask, reason: str) -> Problem:
    message = (
        f"the task type {task.type!r} is none of the service's, and the environment of the "
        f"snapshots cannot be asked about it: {reason}"
    )
    return Problem(message, task=task.task, field="type")


def _move_log(source: Path, store: Path, run_id: str) -> None:
    """Append the installer's output of the venv to the run's `environment.log`."""
    with contextlib.suppress(OSError):
        text = source.read_bytes()
        target = RunPaths(store, run_id).environment_log
        with open(target, "ab") as output:
            output.write(text)
        source.unlink()
