"""The supervisor: starts an actor per live run, restarts a crashed one, and finds records.

At start it kills what an earlier service left running, folds every run's log into the index
and starts an actor for each run that has not ended.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path

import msgspec

from simrun_api.actor import RunActor
from simrun_api.backends.base import Backend
from simrun_api.changes import ChangeSignal
from simrun_api.index import RunIndex
from simrun_api.resources import ResourceStore
from simrun_core import events as ev
from simrun_core.fold import RunRecord, fold
from simrun_core.plugins import TaskType
from simrun_core.resources import observation_from_report, resource_key
from simrun_core.states import TaskState
from simrun_core.store import (
    LogCorrupt,
    LogWriter,
    RunPaths,
    is_run_id,
    iter_log,
    read_record_cache,
    run_ids,
    write_atomic,
)
from simrun_core.views import run_item

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
SETTLE_S = 10.0
REMOVED_PREFIX = ".removed-"


class UnknownRun(KeyError):
    """No run of that id is in the store."""


class RunLive(Exception):
    """The run has not ended (or its actor does not stop); it cannot be removed."""


class Supervisor:
    """Owns the actors of the live runs of one store.

    `changed` is notified after every change of a run: an event of its actor (once the index
    has it), a submission, a removal; the service-wide event stream waits on it.
    """

    def __init__(
        self,
        store: Path,
        backend: Backend,
        types: dict[str, TaskType],
        index: RunIndex,
        resources: ResourceStore,
    ) -> None:
        self.store = store
        self.backend = backend
        self.types = types
        self.index = index
        self.resources = resources
        self.actors: dict[str, RunActor] = {}
        self.changed = ChangeSignal()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing = False

    async def start(self) -> None:
        """Kill orphans, rebuild the index from the logs and resume the live runs."""
        killed = self.backend.kill_orphans()
        if killed:
            log.warning("killed %d process groups an earlier service left running", killed)
        self._clear_removed()
        items = []
        live = []
        for run_id in run_ids(self.store):
            try:
                record = self.load(run_id)
            except (LogCorrupt, ValueError) as error:
                log.error("run %s cannot be folded: %s", run_id, error)
                continue
            items.append(run_item(record))
            if not record.ended:
                live.append(run_id)
        await self.index.rebuild(items)
        for run_id in live:
            self._launch(run_id)

    def paths(self, run_id: str) -> RunPaths:
        """The paths of a run; UnknownRun for an id that names no run."""
        paths = RunPaths(self.store, run_id)
        if not is_run_id(run_id) or not paths.events.exists():
            raise UnknownRun(run_id)
        return paths

    def load(self, run_id: str, at: int | None = None) -> RunRecord:
        """The record of a run (at event `at`): the live fold, the cache of an ended run, or
        a fold of its log."""
        paths = self.paths(run_id)
        actor = self.actors.get(run_id)
        if at is None:
            if actor is not None and actor.fold.record is not None:
                return actor.record
            cached = read_record_cache(paths)
            if cached is not None and cached.ended:
                return cached
            return fold(event for _, event in iter_log(paths.events))
        events = []
        for _, event in iter_log(paths.events):
            if event.seq > at:
                break
            events.append(event)
        return fold(events)

    async def submit(self, submitted: ev.Submitted, settings: dict[str, dict]) -> RunRecord:
        """Write a new run (its task settings and its `submitted` event, durably) and start its
        actor; returns the record in the state `submitting`."""
        paths = RunPaths(self.store, submitted.run)
        paths.dir.mkdir(parents=True, exist_ok=False)
        provenance = msgspec.json.encode(submitted.sources)
        for task_id, task_settings in settings.items():
            paths.task_dir(task_id).mkdir(parents=True)
            write_atomic(paths.settings(task_id), msgspec.json.encode(task_settings))
            write_atomic(paths.provenance(task_id), provenance)
        writer = LogWriter(paths.events)
        try:
            writer.append(msgspec.structs.replace(submitted, seq=1))
        finally:
            writer.close()
        record = fold([msgspec.structs.replace(submitted, seq=1)])
        await self.index.put(run_item(record))
        self._launch(submitted.run)
        self.changed.notify()
        return record

    async def detach(self, run_id: str) -> Path:
        """Take an ended run out of the store at once (a rename to a hidden directory) and out
        of the index; returns the directory, which `purge` removes. A service that stops in
        between removes it at its next start.

        UnknownRun for no such run; RunLive when it has not ended or its actor does not stop
        within `SETTLE_S`.
        """
        paths = self.paths(run_id)
        task = self._tasks.get(run_id)
        if task is not None:
            actor = self.actors.get(run_id)
            if actor is None or not actor.record.ended:
                raise RunLive(run_id)
            # The actor of an ended run only writes its record cache before it stops.
            done, _ = await asyncio.wait([task], timeout=SETTLE_S)
            if not done:
                raise RunLive(run_id)
        elif not self.load(run_id).ended:
            raise RunLive(run_id)
        removed = paths.dir.with_name(f"{REMOVED_PREFIX}{run_id}")
        try:
            paths.dir.rename(removed)
        except FileNotFoundError:
            raise UnknownRun(run_id) from None
        await self.index.remove(run_id)
        self.changed.notify()
        return removed

    async def purge(self, directories: list[Path]) -> None:
        """Remove the directories of detached runs."""
        for directory in directories:
            await asyncio.to_thread(shutil.rmtree, directory, ignore_errors=True)

    def _clear_removed(self) -> None:
        """Remove the files of runs whose removal a stopped service did not finish."""
        for path in (self.store / "runs").glob(f"{REMOVED_PREFIX}*"):
            shutil.rmtree(path, ignore_errors=True)

    def _launch(self, run_id: str) -> None:
        actor = self._new_actor(run_id)
        self._tasks[run_id] = asyncio.create_task(self._supervise(run_id, actor), name=run_id)

    def _new_actor(self, run_id: str) -> RunActor:
        actor = RunActor(
            RunPaths(self.store, run_id),
            self.backend,
            self.types,
            self._changed,
            self._task_final,
        )
        actor.open()
        self.actors[run_id] = actor
        return actor

    async def _supervise(self, run_id: str, actor: RunActor) -> None:
        """Run an actor to its run's end; restart it with backoff when it crashes."""
        failures = 0
        try:
            while True:
                try:
                    await actor.run()
                    return
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("the actor of run %s crashed; restarting it", run_id)
                    delay = RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)]
                    failures += 1
                    await asyncio.sleep(delay)
                    actor = self._new_actor(run_id)
        finally:
            self.actors.pop(run_id, None)
            self._tasks.pop(run_id, None)

    async def _changed(self, record: RunRecord, summary_changed: bool) -> None:
        if summary_changed:
            await self.index.put(run_item(record))
        self.changed.notify()

    async def _task_final(
        self, record: RunRecord, task: str, reports: list[ev.WorkerReport]
    ) -> None:
        """Learn from the reports of a task that is final: an observation per report."""
        spec = record.workflow.task(task)
        task_type = self.types.get(spec.type)
        if task_type is None or task_type.name == "command" or not reports:
            return
        model = record.sources[0].name if record.sources else ""
        resolved = record.resources.get(task)
        base = resolved.memory_base_gb if resolved else task_type.hint.memory_base_gb
        done = record.tasks.get(task) is TaskState.DONE
        try:
            key = resource_key(task_type, spec.settings, model)
            for report in reports:
                oom = report.oom_kills > 0
                observation = observation_from_report(
                    key,
                    report,
                    base,
                    oom=oom,
                    run=record.id,
                    task=task,
                    succeeded=done and not oom and not report.failed,
                )
                await self.resources.record(observation)
        except Exception:
            log.exception("run %s: the reports of task %s were not learned", record.id, task)

    def live_runs(self) -> int:
        """The runs whose actors are live."""
        return len(self.actors)

    async def close(self) -> None:
        """Cancel every live run, wait for its end, and close the backend."""
        self._closing = True
        cancels = []
        for actor in list(self.actors.values()):
            if not actor.record.ended:
                cancels.append(asyncio.ensure_future(actor.cancel("the service stopping")))
        for cancel in cancels:
            try:
                await cancel
            except Exception:
                log.debug("a run ended before its cancel", exc_info=True)
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()))
        await self.backend.close()
