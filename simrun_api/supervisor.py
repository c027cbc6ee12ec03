"""The supervisor: starts an actor per live run, restarts a crashed one, and finds records.

At start it kills what an earlier service left running, removes the partial snapshots a killed
upload or assembly left (`simrun_api.snapshots`), folds every run's log into the index (with
the snapshots its sources refer to) and starts an actor for each run it writes that has not
ended (or ended still holding a reserved node, which its actor releases). A log has one writer,
which its `submitted` event names (`ev.Writer`): the service's runs are written by their actors;
a run another writer owns (`simrun export`, for cwltool or Toil) is folded and listed like any
other log and never appended to: no actor, and a cancel of it is refused (`NotWritten`).

A run whose log does not fold (a corrupt line in the middle, a gap, no `submitted`) stays in
the index, as the prefix that folds has it (or a minimal item), in the state `failed` unless
that prefix ended, with a message naming the file and the line; no actor is started for it.
Reading it (`load`: `GET /runs/{run}`, `/progress`, `/wait`; `/history` reads the log itself)
raises LogCorrupt or FoldError naming the file and the line, which the routes answer with 500
and that detail; every other run is served as before. The cache `run.json` of an ended run is
used only while it is not older than the log, so a log changed after it is read again.

The health of the store: an append of an actor or of a submission that fails with an OSError
sets `store_error` (the service then refuses submissions with 507, `StoreUnwritable`); the next
append that succeeds, or a probe write before a submission, clears it. The index is a
projection: a write of it that fails is logged and done again later, it never fails a run.
`SIMRUN_FAULTS` (`simrun_core.faults`) is read by `start` and taken out of the environment, so
the processes of runs do not inherit it; they get `SIMRUN_RUN_FAULTS` as theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import anyio
import msgspec

from simrun_api.actor import RunActor, RunEnded, StoreUnwritable
from simrun_api.backends.base import Backend
from simrun_api.changes import ChangeSignal
from simrun_api.environments import Environments, OwnEnvironment
from simrun_api.harness_watch import HarnessWatch
from simrun_api.index import RunIndex
from simrun_api.learning import learn_from_log, learn_from_task
from simrun_api.projection import IndexProjection
from simrun_api.resources import ResourceStore
from simrun_api.run_feed import RunFeed
from simrun_api.snapshots import Snapshots, snapshot_refs
from simrun_core import events as ev
from simrun_core import faults
from simrun_core.fold import FoldError, RunFold, RunRecord
from simrun_core.plugins import TaskType
from simrun_core.snapshot_types import types_of_run
from simrun_core.states import RunState
from simrun_core.store import (
    LogCorrupt,
    RunPaths,
    fold_log,
    is_run_id,
    iter_blocks,
    iter_log,
    read_record_cache,
    removed_runs,
    run_ids,
    write_atomic,
)
from simrun_core.views import run_item
from simrun_core.wire import RunItem
from simrun_core.workflow import Priority

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
SETTLE_S = 10.0
PROBE = ".write-probe"


class UnknownRun(KeyError):
    """No run of that id is in the store."""


class RunLive(Exception):
    """The run has not ended (or its actor does not stop); it cannot be removed."""


class NotWritten(Exception):
    """The run's log has a writer other than the service (`ev.Writer`): the service reads it
    and changes nothing of the run."""

    def __init__(self, run_id: str, writer: ev.Writer) -> None:
        super().__init__(
            f"run {run_id!r} is not this service's: its log is written by {writer} (simrun "
            "export, for another engine's runner, which runs and stops it); the service only "
            "lists it"
        )
        self.writer = writer


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
        environments: Environments | None = None,
    ) -> None:
        self.store = store
        self.environments = environments or OwnEnvironment()
        self.backend = backend
        self.types = types
        self.index = index
        self.resources = resources
        self.actors: dict[str, RunActor] = {}
        self.changed = ChangeSignal()
        self.store_error: str | None = None
        self.corrupt: dict[str, str] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing = False
        self.harness_watch = HarnessWatch()  # one task looks at every live run's harness logs
        # The appends of every run's log take turns in one thread: many threads appending (and
        # taking the GIL for their python between the writes and fsyncs) made each system call
        # of the loop wait for it; at 1,000 live runs GET p99 ~80-120 ms, with turns ~19 ms.
        self.appends = anyio.CapacityLimiter(1)
        self.projection = IndexProjection(index, self.changed, self.live_item)
        self.snapshots = Snapshots(store, self.projection)

    async def start(self) -> None:
        """Read `SIMRUN_FAULTS`, kill orphans, remove partial snapshots, rebuild the index
        (and the snapshots of the runs) from the logs, learn the resources again from them when
        the learned ones are gone, and resume the live runs; a run whose log does not fold is
        indexed with a message and not resumed."""
        faults.install_from_env()
        os.environ.pop(faults.ENV, None)
        for_runs = os.environ.pop(faults.RUNS_ENV, "")
        if for_runs:
            os.environ[faults.ENV] = for_runs
        recovered = await self.backend.recover()
        if recovered:
            log.warning("cleaned up %d things an earlier service left running", recovered)
        self._clear_removed()
        await self.snapshots.start()
        items = []
        live = []
        snapshots: dict[str, list[str]] = {}
        for run_id in run_ids(self.store):
            try:
                record = self.load(run_id)
            except (LogCorrupt, FoldError) as error:
                log.error("run %s is not resumed: its log does not fold: %s", run_id, error)
                self.corrupt[run_id] = str(error)
                items.append(self._unfolded_item(run_id, error))
                snapshots[run_id] = self._submitted_snapshots(run_id)
                continue
            for warning in record.warnings:
                log.warning("run %s: %s", run_id, warning)
            items.append(run_item(record))
            snapshots[run_id] = snapshot_refs(record.sources)
            if record.writer is not ev.Writer.SERVICE:
                continue  # its log has a writer of its own: read, never appended to
            if not record.ended or record.reserved is not None:
                live.append(run_id)  # an ended run still holding its node releases it
        await self.projection.rebuild(items, snapshots)
        if self.resources.created:
            await self._learn_again([item.id for item in items if item.id not in self.corrupt])
        for run_id in live:
            self._launch(run_id)

    async def _learn_again(self, run_ids: list[str]) -> None:
        """Learn the resources again from the logs of the runs, the learned ones being gone
        (a new file of the index and resources): before any actor learns more."""
        tasks = 0
        for run_id in run_ids:
            tasks += await learn_from_log(self.resources, self.types, RunPaths(self.store, run_id))
        if tasks:
            log.warning(
                "the learned resources were not found: learned again from %d tasks of the "
                "logs of %d runs",
                tasks,
                len(run_ids),
            )

    def _unfolded_item(self, run_id: str, error: Exception) -> RunItem:
        """The item of a run whose log does not fold: the prefix that folds, its message the
        error; `failed` unless the prefix ended (the run is not resumed)."""
        paths = RunPaths(self.store, run_id)
        folder = RunFold()
        with contextlib.suppress(LogCorrupt, FoldError, OSError):
            for _, events in iter_blocks(paths.events):
                folder.apply_all(events)
        message = f"its log cannot be read, the run is not resumed: {error}"
        if folder.record is None:
            try:
                created = datetime.strptime(run_id[:15], "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
            except ValueError:
                created = datetime.now(UTC)
            return RunItem(
                id=run_id,
                state=RunState.FAILED,
                workflow="unknown",
                group=None,
                submitted_by="unknown",
                owner="unknown",
                agent=None,
                priority=Priority.STANDARD,
                tasks={},
                created=created,
                finished=None,
                message=message,
                seq=0,
            )
        item = run_item(folder.record)
        state = item.state if item.state.ended else RunState.FAILED
        return msgspec.structs.replace(item, state=state, message=message, progress=None)

    def _submitted_snapshots(self, run_id: str) -> list[str]:
        """The snapshots of the `submitted` event of a log that does not fold, if it has one."""
        with contextlib.suppress(LogCorrupt, FoldError, OSError):
            for _, event in iter_log(RunPaths(self.store, run_id).events):
                return snapshot_refs(event.sources) if isinstance(event, ev.Submitted) else []
        return []

    @property
    def writable(self) -> bool:
        """Whether the store can be written: the last append (or probe) did not fail."""
        return self.store_error is None

    def _on_store(self, error: OSError | None) -> None:
        """Learn from an append whether the store can be written."""
        if error is None:
            if self.store_error is not None:
                log.warning("the store can be written again")
                self.store_error = None
        else:
            if self.store_error is None:
                log.error("the store cannot be written: %s", error)
            self.store_error = str(error)

    def _probe(self) -> None:
        """Write, fsync and remove a small file in the store (OSError when that fails)."""
        path = self.store / PROBE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            faults.write(fd, b"probe\n", path)
            faults.fsync(fd, path)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()

    async def check_writable(self) -> None:
        """StoreUnwritable while the store cannot be written; when a failed append marked it
        so, a probe write decides (and clears the mark when it succeeds)."""
        if self.store_error is None:
            return
        try:
            await asyncio.to_thread(self._probe)
        except OSError as error:
            self._on_store(error)
            raise StoreUnwritable(error) from None
        self._on_store(None)

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
            if run_id not in self.corrupt and _cache_is_current(paths):
                cached = read_record_cache(paths)
                if cached is not None and cached.ended:
                    return cached
            return _fold_log(paths)
        return _fold_log(paths, at)

    def summary(self, run_id: str) -> RunItem:
        """The summary of a run, also of one whose log does not fold: then as the index has it
        (`_unfolded_item`), so such a run can still be judged and removed."""
        try:
            return run_item(self.load(run_id))
        except (LogCorrupt, FoldError) as error:
            self.corrupt[run_id] = str(error)
            return self._unfolded_item(run_id, error)

    async def submit(self, submitted: ev.Submitted, settings: dict[str, dict]) -> RunRecord:
        """Write a new run (its task settings and its `submitted` event, durably) and start its
        actor; returns the record in the state `submitting`.

        The snapshots of its sources count as referred to (`Snapshots`) before its log is
        written, so no removal of other runs takes them meanwhile.

        StoreUnwritable while the store cannot be written (a failed append before, and a probe
        now), or when a write of the run fails; then nothing of the run is left in the store.
        """
        await self.check_writable()
        paths = RunPaths(self.store, submitted.run)
        try:
            paths.dir.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise
        except OSError as error:
            self._on_store(error)
            raise StoreUnwritable(error) from None
        await self.projection.refer(submitted.run, snapshot_refs(submitted.sources))
        first = msgspec.structs.replace(submitted, seq=1)
        try:
            provenance = msgspec.json.encode(submitted.sources)
            files: list[tuple[Path, bytes]] = []
            for task_id, task_settings in settings.items():
                paths.task_dir(task_id).mkdir(parents=True)
                files.append((paths.settings(task_id), msgspec.json.encode(task_settings)))
                files.append((paths.provenance(task_id), provenance))
            # Each file is fsynced: in threads at once, so the disk commits them together; all
            # of them end before a failure removes the run.
            writes = [asyncio.to_thread(write_atomic, *file) for file in files]
            for outcome in await asyncio.gather(*writes, return_exceptions=True):
                if isinstance(outcome, BaseException):
                    raise outcome
            actor = self._actor(submitted.run)
            actor.create(first)
        except OSError as error:
            shutil.rmtree(paths.dir, ignore_errors=True)
            await self.projection.remove(submitted.run)
            self._on_store(error)
            raise StoreUnwritable(error) from None
        self._on_store(None)
        self.actors[submitted.run] = actor
        record = actor.record
        await self.projection.put(run_item(record))
        self._tasks[submitted.run] = asyncio.create_task(
            self._supervise(submitted.run, actor), name=submitted.run
        )
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
            # The actor of an ended run only releases its node and writes its record cache.
            done, _ = await asyncio.wait([task], timeout=SETTLE_S)
            if not done:
                raise RunLive(run_id)
        elif not self.summary(run_id).state.ended:
            raise RunLive(run_id)
        removed = paths.removed
        try:
            paths.dir.rename(removed)
        except FileNotFoundError:
            raise UnknownRun(run_id) from None
        await self.projection.remove(run_id)
        self.corrupt.pop(run_id, None)
        self.changed.notify()
        return removed

    async def purge(self, directories: list[Path]) -> None:
        """Remove the directories of detached runs."""
        for directory in directories:
            await asyncio.to_thread(shutil.rmtree, directory, ignore_errors=True)

    def _clear_removed(self) -> None:
        """Remove the files of runs whose removal a stopped service did not finish."""
        for path in removed_runs(self.store):
            shutil.rmtree(path, ignore_errors=True)

    def _launch(self, run_id: str) -> None:
        try:
            actor: RunActor | None = self._new_actor(run_id)
        except (OSError, LogCorrupt, FoldError) as error:
            log.error("the log of run %s cannot be opened (trying again): %s", run_id, error)
            actor = None
        self._tasks[run_id] = asyncio.create_task(self._supervise(run_id, actor), name=run_id)

    def _actor(self, run_id: str) -> RunActor:
        return RunActor(
            RunPaths(self.store, run_id),
            self.backend,
            self.types,
            self._changed,
            self._task_final,
            self._on_store,
            self.environments,
            self.harness_watch,
            self.appends,
        )

    def _new_actor(self, run_id: str) -> RunActor:
        """The actor of a run whose log exists, the log folded and open."""
        actor = self._actor(run_id)
        actor.open()
        self.actors[run_id] = actor
        return actor

    async def _supervise(self, run_id: str, actor: RunActor | None) -> None:
        """Run an actor to its run's end; restart it with backoff when it crashes (or when its
        log could not be opened); give up on a log that no longer folds."""
        failures = 0
        try:
            while True:
                try:
                    if actor is None:
                        actor = self._new_actor(run_id)
                    await actor.run()
                    return
                except asyncio.CancelledError:
                    raise
                except (LogCorrupt, FoldError) as error:
                    log.error("run %s is not resumed: its log does not fold: %s", run_id, error)
                    self.corrupt[run_id] = str(error)
                    await self.projection.put(self._unfolded_item(run_id, error))
                    return
                except Exception:
                    log.exception("the actor of run %s crashed; restarting it", run_id)
                    delay = RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)]
                    failures += 1
                    self.actors.pop(run_id, None)
                    actor = None
                    await asyncio.sleep(delay)
        finally:
            self.actors.pop(run_id, None)
            self._tasks.pop(run_id, None)

    async def _changed(self, record: RunRecord, summary_changed: bool) -> None:
        if summary_changed or self.projection.pending(record.id):
            await self.projection.put(run_item(record))
        self.changed.notify()

    async def _task_final(
        self, record: RunRecord, task: str, reports: list[ev.WorkerReport]
    ) -> None:
        types = types_of_run(self.types, record)
        await learn_from_task(self.resources, types, record, task, reports)

    # -- what the routes ask -----------------------------------------------------------------

    def live_item(self, run_id: str) -> RunItem | None:
        """The summary of a live run as its actor has it now, None for a run without one."""
        actor = self.actors.get(run_id)
        if actor is None or actor.fold.record is None:
            return None
        return run_item(actor.record)

    def feed(self, run_id: str) -> RunFeed | None:
        """The feed of a live run (`RunFeed`: its appends, for its streams and waiters), None
        when no actor follows it (read its log)."""
        actor = self.actors.get(run_id)
        return actor.feed if actor is not None else None

    async def cancel(self, run_id: str, by: str) -> RunRecord:
        """Cancel a live run; returns once `cancel-requested` is durable.

        UnknownRun for no such run, NotWritten for a run the service does not write, RunEnded
        when it ended (or is ending), StoreUnwritable when the cancel cannot be recorded."""
        self.paths(run_id)
        actor = self.actors.get(run_id)
        if actor is None or actor.fold.record is None or actor.record.ended:
            summary = self.summary(run_id)
            if run_id not in self.corrupt:
                writer = self.load(run_id).writer
                if writer is not ev.Writer.SERVICE:
                    raise NotWritten(run_id, writer)
            raise RunEnded(summary.state)
        return await actor.cancel(by)

    def live_runs(self) -> int:
        """The runs whose actors are live."""
        return len(self.actors)

    async def close(self) -> None:
        """Stop following the runs and close the backend: where the pods of runs outlive the
        service (a cluster) the runs go on, and the next service resumes them; locally, where
        they are the service's processes, every live run is cancelled and waited for."""
        self._closing = True
        if self.backend.capabilities.pods_outlive_service:
            for task in self._tasks.values():
                task.cancel()
            if self._tasks:
                await asyncio.wait(list(self._tasks.values()))
            self.harness_watch.stop()
            await self.projection.close()
            await self.backend.close()
            return
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
        self.harness_watch.stop()
        await self.projection.close()
        await self.backend.close()


def _cache_is_current(paths: RunPaths) -> bool:
    """Whether `run.json` was written after the last change of the log (else the log is
    read again: it may have been changed, or corrupted, since)."""
    try:
        return paths.cache.stat().st_mtime_ns >= paths.events.stat().st_mtime_ns
    except OSError:
        return False


def _fold_log(paths: RunPaths, at: int | None = None) -> RunRecord:
    """The fold of a run's log (up to event `at`); LogCorrupt or FoldError name the file."""
    try:
        record = fold_log(paths.events, at).record
    except FoldError as error:
        raise FoldError(f"{paths.events}: {error}") from None
    if record is None:
        raise FoldError(f"{paths.events}: the log has no 'submitted' event")
    return record
