"""A backend defined in this module alone: what adding a backend to simrun takes.

`ThirdBackend` runs each task of a run as one process of this machine, its main worker (the
coordinator of a split task, which merges itself; the argv of a `command` task), with the
launch contract of the harness (`simrun_core.launch.launch_for`) and its output in the run's
`tasks/<task>/logs/<worker>-<attempt>.log`. A task starts when the decider says so (`ready` at
the submission, or `start_task`); a failed attempt is started again only on `retry`, as the
decider asks.

Its settings are a block of its own, `third:` of the service's settings file, which
`third_backend` declares (`settings_key`, `settings_type`); nothing of `simrun_api` names it. A
settings file chooses it with `backend: third_backend:third_backend` and this directory on
`PYTHONPATH`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from simrun_api.backends.base import Capabilities, ReservationRefused, RunSubmission
from simrun_api.settings import ServiceSettings
from simrun_core.argv import expand_argv
from simrun_core.launch import harness_entry, launch_for, main_worker
from simrun_core.messages import PodChanged
from simrun_core.naming import workflow_name
from simrun_core.planner import Node
from simrun_core.store import RunPaths
from simrun_core.wire import PodUsage, ServerUsage
from simrun_core.workflow import TaskSpec


class ThirdSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `third:` block: the one node the processes run on (its name, cores and memory),
    the seconds a process has after SIGTERM, and its scratch (relative to the settings file)."""

    node: str = "third-node"
    cores: int = 4
    memory_gb: float = 8.0
    grace_s: float = 5.0
    scratch: Path = Path("third-scratch")


@dataclasses.dataclass
class _Run:
    submission: RunSubmission
    report: Callable[[PodChanged], None]
    cancelled: bool = False
    processes: dict[tuple[str, int], asyncio.subprocess.Process] = dataclasses.field(
        default_factory=dict
    )
    running: dict[tuple[str, str, int], float] = dataclasses.field(default_factory=dict)
    retries: dict[tuple[str, int], asyncio.Future[bool]] = dataclasses.field(default_factory=dict)
    starts: dict[str, asyncio.Event] = dataclasses.field(default_factory=dict)
    """Set when a task may start (`ready`, `start_task`)."""
    waiting: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)
    """The tasks that wait for their start or for a `retry`: a cancel ends their wait."""
    dag: asyncio.Task[None] | None = None


class ThirdBackend:
    """One node of processes; no reservations, no images, no retries of its own."""

    name = "third"
    max_pods = 1
    capabilities = Capabilities()

    def __init__(self, store: Path, settings: ThirdSettings) -> None:
        self.store = store
        self.settings = settings
        self._runs: dict[str, _Run] = {}

    async def nodes(self) -> list[Node]:
        return [Node(self.settings.node, self.settings.cores, self.settings.memory_gb)]

    async def servers(self) -> list[ServerUsage]:
        pods = [
            PodUsage(
                run_id=run_id,
                task_id=task,
                pod=f"{worker}-{attempt}",
                phase="running",
                cores=run.submission.record.plans[task].shape.cores,
                memory_gb=memory_gb,
            )
            for run_id, run in self._runs.items()
            for (task, worker, attempt), memory_gb in run.running.items()
        ]
        return [
            ServerUsage(
                name=self.settings.node,
                cores=self.settings.cores,
                memory_gb=self.settings.memory_gb,
                gpus=0,
                reserved_by=None,
                pods=pods,
            )
        ]

    async def recover(self) -> int:
        return 0

    async def submit(self, run: RunSubmission, report: Callable[[PodChanged], None]) -> str:
        run_id = run.record.id
        if run_id in self._runs:
            self._runs[run_id].report = report
            for task in run.ready:  # a `start_task` a restarted actor's crash lost
                await self.start_task(run_id, task)
        else:
            state = self._runs[run_id] = _Run(run, report)
            for task in run.record.workflow.tasks:
                state.starts[task.id] = asyncio.Event()
                if task.id in run.ready:
                    state.starts[task.id].set()
            state.dag = asyncio.create_task(self._dag(state))
        return workflow_name(run_id)

    async def reserve(self, node: str, run_id: str) -> None:
        raise ReservationRefused("the third backend reserves no nodes")

    async def release(self, node: str, run_id: str) -> None:
        pass

    async def start_task(self, run_id: str, task: str) -> None:
        run = self._runs.get(run_id)
        if run is not None and task in run.starts:
            run.starts[task].set()

    async def retry(
        self, run_id: str, task: str, worker: str, attempt: int, retry_memory: bool
    ) -> None:
        run = self._runs.get(run_id)
        decision = run.retries.get((task, attempt - 1)) if run is not None else None
        if decision is not None and not decision.done():
            decision.set_result(retry_memory)

    async def cancel(self, run_id: str) -> None:
        run = self._runs.get(run_id)
        if run is None:
            return
        run.cancelled = True
        for waiting in run.waiting:
            waiting.cancel()
        for process in run.processes.values():
            _signal(process, signal.SIGTERM)
        if run.processes:
            waits = [asyncio.ensure_future(p.wait()) for p in run.processes.values()]
            await asyncio.wait(waits, timeout=self.settings.grace_s)
            for process in run.processes.values():
                _signal(process, signal.SIGKILL)
        if run.dag is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await run.dag

    def has(self, run_id: str) -> bool:
        return run_id in self._runs

    async def logs(self, run_id: str, task: str) -> dict[str, str]:
        found = sorted(RunPaths(self.store, run_id).logs(task).glob("*.log"), key=_attempt_order)
        return {path.stem: path.read_text(errors="replace") for path in found}

    async def close(self) -> None:
        await asyncio.gather(*(self.cancel(run_id) for run_id in list(self._runs)))

    # -- a run's DAG ------------------------------------------------------------------------

    async def _dag(self, run: _Run) -> None:
        record = run.submission.record
        try:
            async with asyncio.TaskGroup() as group:
                for task in record.workflow.order():
                    if task.id not in run.submission.done:
                        group.create_task(self._task(run, task))
        finally:
            self._runs.pop(record.id, None)

    async def _task(self, run: _Run, task: TaskSpec) -> None:
        current = asyncio.current_task()
        assert current is not None
        try:
            run.waiting.add(current)
            try:
                await run.starts[task.id].wait()
            finally:
                run.waiting.discard(current)
            worker = main_worker(run.submission.record.plans[task.id])
            attempt = run.submission.next_attempts.get((task.id, worker), 0)
            retry_memory = (task.id, worker) in run.submission.retry_memory
            while not run.cancelled:
                code = await self._attempt(run, task, worker, attempt, retry_memory)
                if code == 0:
                    return
                if run.cancelled:
                    return
                decision = run.retries[(task.id, attempt)] = asyncio.Future()
                run.waiting.add(current)
                try:
                    retry_memory = await decision
                finally:
                    run.waiting.discard(current)
                    run.retries.pop((task.id, attempt), None)
                attempt += 1
        except asyncio.CancelledError:
            pass

    async def _attempt(
        self, run: _Run, task: TaskSpec, worker: str, attempt: int, retry_memory: bool
    ) -> int | None:
        """Run one attempt to its end, reporting its phases; its exit code."""
        record = run.submission.record
        change = functools.partial(PodChanged, task=task.id, worker=worker, attempt=attempt)
        run.report(change(phase="pending"))
        paths = RunPaths(self.store, record.id)
        paths.logs(task.id).mkdir(parents=True, exist_ok=True)
        paths.out(task.id).mkdir(parents=True, exist_ok=True)
        scratch = self.settings.scratch / record.id / task.id / f"{worker}-{attempt}"
        scratch.mkdir(parents=True, exist_ok=True)
        task_type = run.submission.types[task.type]
        plan = record.plans[task.id]
        launch = launch_for(
            record,
            task.id,
            worker,
            attempt,
            task_type=task_type,
            store=self.store,
            scratch=scratch,
            node=self.settings.node,
            cores=plan.shape.cores,
            grace_s=self.settings.grace_s,
            memory_source="process",
            memory_enforced=False,
            retry_memory=retry_memory,
        )
        entry = harness_entry(task_type)
        if entry is not None:
            argv = [sys.executable, "-m", f"simrun_harness.{entry}"]
        else:
            args = msgspec.convert(task.settings, task_type.settings).args  # type: ignore[attr-defined]
            inputs = {port: str(self.store / path) for port, path in launch.inputs.items()}
            argv = expand_argv(args, str(paths.settings(task.id)), str(paths.out(task.id)), inputs)
        with open(paths.logs(task.id) / f"{worker}-{attempt}.log", "ab") as log:
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=paths.task_dir(task.id),
                env={**os.environ, **launch.to_env()},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        if run.cancelled:  # cancelled while it started
            _signal(process, signal.SIGTERM)
        memory_gb = plan.shape.retry_memory_gb if retry_memory else plan.shape.memory_gb
        run.processes[(task.id, attempt)] = process
        run.running[(task.id, worker, attempt)] = memory_gb
        run.report(change(phase="running", node=self.settings.node))
        try:
            returncode = await process.wait()
        finally:
            run.processes.pop((task.id, attempt), None)
            run.running.pop((task.id, worker, attempt), None)
        code = 128 - returncode if returncode < 0 else returncode
        phase = "succeeded" if code == 0 else "failed"
        run.report(change(phase=phase, exit_code=code))
        return code


def _signal(process: asyncio.subprocess.Process, number: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, number)


def _attempt_order(path: Path) -> tuple[str, int]:
    worker, _, attempt = path.stem.rpartition("-")
    return worker, int(attempt)


def third_backend(settings: ServiceSettings, block: ThirdSettings) -> ThirdBackend:
    """The third backend of the service's settings: on their store, with its `third:` block."""
    return ThirdBackend(settings.store, block)


third_backend.settings_key = "third"  # type: ignore[attr-defined]
third_backend.settings_type = ThirdSettings  # type: ignore[attr-defined]
