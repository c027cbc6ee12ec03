"""The local backend: the pods of a run as processes on this machine.

A split task is one coordinator (`simrun-worker`, role base, which merges itself) with the
machine's cores; a plugin command runs through `simrun-exec`; a `command` task runs its args.
A task starts when the decider says so (it is `ready` at the submission, or `start_task` is called:
every task it reads from is done) and its cores are free. Every process has
its own process group, its output in `tasks/<task>/logs/<worker>-<attempt>.log` and, while it
runs, a pid file beside it, so a service that starts after one that died kills what it left.
Processes start without holding the event loop (`children`), and a harness task takes up one of
the warm spares the backend keeps for any run (`spares`), its run's first task included.

A run with snapshots (submitted with `--snapshot`) gets a venv of its own in `<envs>/<run>/`
(`local_env`) before its first process starts: its snapshots installed editable there, never
into the environment of the service (made at its submission already when a task's type is one
only its snapshots have, `simrun_api.snapshot_types`: then taken as it is). Its harness
processes (and its spare) run with the venv's python, every process finds the venv's programs
first on `PATH` and the model's shadow tree first on `PYTHONPATH`. The venv is removed when
the run's DAG ends, and by `recover` for a run that ended (or is gone) while a service was
killed. A venv that cannot be created fails the run with the installer's error
(`RunSubmission.environment_failed`, else as a failed first pod).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import msgspec

from simrun_api.backends import containers, local_env
from simrun_api.backends.base import (
    Capabilities,
    ReservationRefused,
    RunSubmission,
    workflow_name,
)
from simrun_api.backends.children import Process, spawn
from simrun_api.backends.cores import CorePool, Grant
from simrun_api.backends.local_gpus import local_gpus
from simrun_api.backends.spares import ForkServer, Spare
from simrun_api.settings import ServiceSettings, scratch_of
from simrun_core import exits
from simrun_core.argv import TemplateError, expand_argv
from simrun_core.events import TERMINAL_EVENTS, WorkerReport
from simrun_core.gpus import CUDA_VISIBLE_DEVICES
from simrun_core.launch import (
    EDITABLE,
    Launch,
    editable_snapshots,
    harness_entry,
    launch_for,
    main_worker,
)
from simrun_core.messages import PodChanged
from simrun_core.planner import Node, TaskPlan
from simrun_core.plugins import TaskType
from simrun_core.spare_order import SpareOrder
from simrun_core.store import LogCorrupt, RunPaths, iter_log, task_log_files
from simrun_core.wire import PodUsage, ServerUsage
from simrun_core.workflow import TaskSpec

log = logging.getLogger(__name__)

KILL_TIMEOUT_S = 30.0
"""The seconds `<engine> kill` of a container may take."""


def machine_memory_gb() -> float:
    """The memory of this machine in GiB."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3


def exit_code(returncode: int) -> int:
    """A shell-style exit code: 128 + the signal for a process killed by one."""
    return 128 - returncode if returncode < 0 else returncode


@dataclasses.dataclass
class _Run:
    submission: RunSubmission
    order: int
    report: Callable[[PodChanged], None]
    cancelled: bool = False
    processes: dict[tuple[str, str, int], Process] = dataclasses.field(default_factory=dict)
    requests: dict[tuple[str, str, int], tuple[int, float, int]] = dataclasses.field(
        default_factory=dict
    )
    """The cores, GiB and GPUs of each attempt running now."""
    tasks: dict[str, asyncio.Task[None]] = dataclasses.field(default_factory=dict)
    starts: dict[str, asyncio.Event] = dataclasses.field(default_factory=dict)
    """Set when a task not done at the submission may start (`ready`, or `start_task`)."""
    waiting: set[str] = dataclasses.field(default_factory=set)
    dag: asyncio.Task[None] | None = None
    harness_left: set[str] = dataclasses.field(default_factory=set)
    spare: Spare | None = None
    retries: dict[tuple[str, str, int], asyncio.Future[bool]] = dataclasses.field(
        default_factory=dict
    )
    python: str = sys.executable
    """The python of the run's harness processes: the service's, or the venv's of the run."""
    environment: Path | None = None
    """The directory of the run's venv (`local_env`), for a run with snapshots."""
    snapshots: list[str] = dataclasses.field(default_factory=list)
    containers: dict[tuple[str, str, int], tuple[str, str]] = dataclasses.field(
        default_factory=dict
    )
    """The container (engine, name) of each attempt of a `command` task run in its image."""


class LocalBackend:
    """Runs the tasks of runs as processes of this machine: no reservations, no images, and a
    failed attempt is started again only on `retry`.

    The machine's GPUs (`gpus`, else `local_gpus`: the service's `CUDA_VISIBLE_DEVICES`, else
    what `nvidia-smi` lists) are handed out like its cores: an attempt asking N waits for N free
    ones and gets them alone, its `CUDA_VISIBLE_DEVICES` naming exactly those; on a machine with
    GPUs an attempt asking none gets `CUDA_VISIBLE_DEVICES` empty, so it sees none (as a pod
    without a GPU request on a cluster). A container (`local_commands: docker`) is given its
    attempt's GPUs alone and numbers them from 0 (`containers.gpu_options`, `gpu_env`).
    """

    name = "local"
    max_pods = 1
    capabilities: Capabilities

    def __init__(
        self,
        store: Path,
        scratch: Path,
        cores: int | None = None,
        memory_gb: float | None = None,
        grace_s: float = 10.0,
        envs: Path | None = None,
        gpus: Sequence[str] | None = None,
    ) -> None:
        self.store = store
        self.scratch = scratch
        self.envs = envs if envs is not None else scratch.parent / "envs"
        self.capabilities = Capabilities(local_commands=True, run_venvs=self.envs)
        self.cores = cores or len(os.sched_getaffinity(0))
        self.memory_gb = memory_gb or machine_memory_gb()
        self.grace_s = grace_s
        self.hostname = socket.gethostname()
        self.pool = CorePool(self.cores, local_gpus() if gpus is None else gpus)
        self.gpus = list(self.pool.gpus)
        self._runs: dict[str, _Run] = {}
        self._order = 0
        self._closed = False
        self._removals: dict[str, asyncio.Future[None]] = {}
        self._warm: ForkServer | None = None

    async def nodes(self) -> list[Node]:
        """This machine, the one node."""
        return [
            Node(
                name=self.hostname, cores=self.cores, memory_gb=self.memory_gb, gpus=len(self.gpus)
            )
        ]

    def has(self, run_id: str) -> bool:
        """Whether a run is live in this backend."""
        return run_id in self._runs

    def live_processes(self) -> int:
        """The processes of runs running now."""
        return sum(len(run.processes) for run in self._runs.values())

    def placements(self) -> list[PodUsage]:
        """The processes of runs running now with the cores, memory and GPUs they were given,
        in the order of their runs' submission."""
        pods = []
        for run_id, run in sorted(self._runs.items(), key=lambda item: item[1].order):
            for (task, worker, attempt), (cores, memory_gb, gpus) in run.requests.items():
                pods.append(
                    PodUsage(
                        run_id=run_id,
                        task_id=task,
                        pod=f"{worker}-{attempt}",
                        phase="running",
                        cores=cores,
                        memory_gb=memory_gb,
                        gpus=gpus,
                    )
                )
        return pods

    async def servers(self) -> list[ServerUsage]:
        """This machine as the one server: its cores, memory and GPUs, and the processes of
        runs."""
        return [
            ServerUsage(
                name=self.hostname,
                cores=self.cores,
                memory_gb=round(self.memory_gb, 3),
                gpus=len(self.gpus),
                reserved_by=None,
                pods=self.placements(),
            )
        ]

    async def submit(self, run: RunSubmission, report: Callable[[PodChanged], None]) -> str:
        """Start the DAG of a run; a run submitted before is kept, and its tasks `ready` now
        start (a restarted actor's resubmission: a `start_task` its crash lost)."""
        record = run.record
        if self._closed:
            raise RuntimeError("the local backend is closed")
        existing = self._runs.get(record.id)
        if existing is not None:
            existing.report = report
            for ready in sorted(run.ready):
                await self.start_task(record.id, ready)
        else:
            self._order += 1
            tasks = record.workflow.order()
            if any(_harness_entry(run.types[task.type]) is not None for task in tasks):
                self._warm_spares()
            state = _Run(submission=run, order=self._order, report=report)
            for task in tasks:
                if task.id not in run.done:
                    state.starts[task.id] = asyncio.Event()
                    if task.id in run.ready:
                        state.starts[task.id].set()
            self._runs[record.id] = state
            state.dag = asyncio.create_task(self._run_dag(state), name=f"dag {record.id}")
        return workflow_name(record.id)

    async def cancel(self, run_id: str) -> None:
        """SIGTERM to every process of a run, SIGKILL after the grace; start nothing more."""
        run = self._runs.get(run_id)
        if run is None:
            # Nothing of it runs here; a venv it left (a service killed meanwhile) goes.
            if (self.envs / run_id).exists():
                await self._remove_environment(run_id, self.envs / run_id)
            return
        run.cancelled = True
        for task_id in list(run.waiting):
            run.tasks[task_id].cancel()
        for process in list(run.processes.values()):
            _signal_group(process.pid, signal.SIGTERM)
        await _kill_containers(run.containers.values(), "TERM")
        if run.processes:
            waits = [asyncio.ensure_future(p.wait()) for p in run.processes.values()]
            await asyncio.wait(waits, timeout=self.grace_s)
            for process in list(run.processes.values()):
                _signal_group(process.pid, signal.SIGKILL)
            await _kill_containers(run.containers.values(), "KILL")
        if run.dag is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await run.dag

    async def close(self) -> None:
        """Refuse new runs, cancel every run and wait for the end of its processes, then end
        the fork server of the spares (which tells the ends of the processes it started)."""
        self._closed = True
        await asyncio.gather(*(self.cancel(run_id) for run_id in list(self._runs)))
        if self._warm is not None:
            await self._warm.close()

    def _warm_spares(self) -> ForkServer | None:
        """The fork server of the warm spares of the service's python, started at the first
        run (or `recover`), and again when it ended; None once the backend is closed."""
        if self._closed:
            return None
        if self._warm is None or not self._warm.alive:
            self.scratch.mkdir(parents=True, exist_ok=True)
            self._warm = ForkServer(self.scratch)
        return self._warm

    async def recover(self) -> int:
        """Kill the process groups a service before left running (their pid files name them)
        and remove the venvs of its runs that ended or are gone (a live run keeps its venv for
        its resumption); the number of groups killed and venvs removed."""
        killed = self._kill_orphans()
        self._warm_spares()  # ready for the first task of the first run
        return killed + await asyncio.to_thread(self._remove_stale_environments)

    async def logs(self, run_id: str, task: str) -> dict[str, str]:
        """The output of each process of a task so far, by pod name (`<worker>-<attempt>`), in
        the order of their attempts: the files `tasks/<task>/logs/<worker>-<attempt>.log`."""
        return await asyncio.to_thread(_read_logs, RunPaths(self.store, run_id).logs(task))

    def _kill_orphans(self) -> int:
        """Kill the process groups a service before left running; remove their pid files."""
        killed = 0
        for pid_file in task_log_files(self.store, "*.pid"):
            try:
                info = json.loads(pid_file.read_text())
                pgid, run_id = int(info["pid"]), str(info["run"])
            except (OSError, ValueError, KeyError):
                pid_file.unlink(missing_ok=True)
                continue
            if run_id in self._runs:
                continue
            members = _group_members(pgid, run_id)
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            killed += bool(members)
            pid_file.unlink(missing_ok=True)
        return killed

    def _remove_stale_environments(self) -> int:
        """Remove the venvs of runs that are not live here and ended (or are gone)."""
        try:
            entries = [entry for entry in self.envs.iterdir() if entry.is_dir()]
        except OSError:
            return 0
        removed = 0
        for entry in entries:
            if entry.name in self._runs or not self._ended(entry.name):
                continue
            try:
                local_env.remove(entry)
            except OSError as error:
                log.warning("the venv %s of an ended run is not removed: %s", entry, error)
                continue
            removed += 1
        return removed

    def _ended(self, run_id: str) -> bool:
        """Whether a run's log has its terminal event, or the run is gone."""
        events = RunPaths(self.store, run_id).events
        if not events.exists():
            return True
        try:
            return any(isinstance(event, TERMINAL_EVENTS) for _, event in iter_log(events))
        except (OSError, LogCorrupt):
            return False

    async def _prepare_environment(self, run: _Run) -> bool:
        """Create the venv of a run with snapshots (or take the complete one it has), in a
        thread; whether the run's tasks may start. A cancel meanwhile kills the installer; a
        failure fails the run (`_environment_failed`)."""
        record = run.submission.record
        run.snapshots = list(editable_snapshots(record, self.store))
        if not run.snapshots:
            return True
        directory = run.environment = self.envs / record.id
        pending = self._removals.get(record.id)
        if pending is not None:
            with contextlib.suppress(Exception):
                await pending
        log_path = RunPaths(self.store, record.id).environment_log
        try:
            if await asyncio.to_thread(local_env.is_ready, directory, run.snapshots):
                python = local_env.python_of(directory)
            else:
                python = await asyncio.to_thread(
                    local_env.create, directory, run.snapshots, log_path, lambda: run.cancelled
                )
        except local_env.RunEnvironmentError as error:
            if not run.cancelled:
                self._environment_failed(run, str(error))
            return False
        run.python = str(python)
        return not run.cancelled

    def _environment_failed(self, run: _Run, reason: str) -> None:
        """Fail a run whose venv cannot be created: through the submission's
        `environment_failed` when the actor gave one, else as the failure (a configuration
        error, exit 4) of the first attempt of the first task to run, which fails the run."""
        submission = run.submission
        if submission.environment_failed is not None:
            submission.environment_failed(reason)
            return
        message = f"the environment of the run cannot be created: {reason}"
        record = submission.record
        done = set(submission.done)
        for task in record.workflow.order():
            if task.id in done:
                continue
            worker = main_worker(record.plans[task.id])
            attempt = submission.next_attempts.get((task.id, worker), 0)
            run.report(
                PodChanged(
                    task=task.id,
                    worker=worker,
                    attempt=attempt,
                    phase="failed",
                    exit_code=exits.CONFIGURATION,
                    message=message,
                )
            )
            return

    async def _remove_environment(self, run_id: str, directory: Path) -> None:
        """Remove a run's venv in a thread, once: a removal asked again while one runs waits for
        it, and so does a new venv of the run (`_removals`)."""
        removal = self._removals.get(run_id)
        if removal is None:
            removal = asyncio.ensure_future(asyncio.to_thread(local_env.remove, directory))
            self._removals[run_id] = removal
            removal.add_done_callback(lambda done: self._removals.pop(run_id, None))
        try:
            await asyncio.shield(removal)
        except OSError as error:
            log.warning("run %s: its venv %s is not removed: %s", run_id, directory, error)

    async def _run_dag(self, run: _Run) -> None:
        record = run.submission.record
        done = set(run.submission.done)
        for task in record.workflow.order():
            if task.id in done:
                continue
            if _harness_entry(run.submission.types[task.type]) is not None:
                run.harness_left.add(task.id)
        try:
            if not await self._prepare_environment(run):
                return
            self._prepare_spare(run, RunPaths(self.store, record.id))
            async with asyncio.TaskGroup() as group:
                for task in record.workflow.order():
                    if task.id in done:
                        continue
                    run.tasks[task.id] = group.create_task(self._run_task(run, task), name=task.id)
        finally:
            self._runs.pop(record.id, None)
            if run.spare is not None:
                await run.spare.discard()
            if run.environment is not None:
                await self._remove_environment(record.id, run.environment)

    async def _run_task(self, run: _Run, task: TaskSpec) -> None:
        """The attempts of a task, once it may start; a cancel of the run ends the wait."""
        try:
            run.waiting.add(task.id)
            try:
                await run.starts[task.id].wait()
            finally:
                run.waiting.discard(task.id)
            await self._attempts(run, task)
        except asyncio.CancelledError:
            pass

    async def start_task(self, run_id: str, task: str) -> None:
        """Let a task of the run start (its cores permitting); idempotent."""
        run = self._runs.get(run_id)
        if run is not None and not run.cancelled and task in run.starts:
            run.starts[task].set()

    async def _attempts(self, run: _Run, task: TaskSpec) -> None:
        """Run the attempts of a task's worker: after a failure, the next one only once the
        run's actor asks for it (`retry`); a run cancelled meanwhile ends the wait."""
        record = run.submission.record
        task_type = run.submission.types[record.workflow.task(task.id).type]
        plan = record.plans[task.id]
        worker = main_worker(plan)
        attempt = run.submission.next_attempts.get((task.id, worker), 0)
        retry_memory = (task.id, worker) in run.submission.retry_memory
        while not run.cancelled:
            run.report(PodChanged(task=task.id, worker=worker, attempt=attempt, phase="pending"))
            run.waiting.add(task.id)
            try:
                grant = await self.pool.acquire(run.order, plan.shape.cores, plan.shape.gpus)
            except asyncio.CancelledError:
                run.report(_not_started(task.id, worker, attempt))
                raise
            finally:
                run.waiting.discard(task.id)
            try:
                if run.cancelled:
                    run.report(_not_started(task.id, worker, attempt))
                    return
                code, detail = await self._run_process(
                    run, task, task_type, plan, worker, attempt, grant, retry_memory
                )
            finally:
                self.pool.release(grant)
            if code == 0:
                run.report(
                    PodChanged(
                        task=task.id, worker=worker, attempt=attempt, phase="succeeded", exit_code=0
                    )
                )
                return
            oom = code == exits.KILLED and _oom_evidence(
                RunPaths(self.store, record.id), task.id, worker, attempt
            )
            run.report(
                PodChanged(
                    task=task.id,
                    worker=worker,
                    attempt=attempt,
                    phase="failed",
                    exit_code=code,
                    oom=oom,
                    message=detail,
                )
            )
            if run.cancelled:
                return  # a cancelled run starts no attempt: no retry to wait for
            key = (task.id, worker, attempt)
            decision = run.retries[key] = asyncio.get_running_loop().create_future()
            run.waiting.add(task.id)
            try:
                retry_memory = await decision
            finally:
                run.waiting.discard(task.id)
                run.retries.pop(key, None)
            attempt += 1

    async def reserve(self, node: str, run_id: str) -> None:
        """Refused: there is nothing to reserve locally (the submission refuses `reserve`)."""
        raise ReservationRefused("there is nothing to reserve locally")

    async def release(self, node: str, run_id: str) -> None:
        """Nothing to release locally."""

    async def retry(
        self, run_id: str, task: str, worker: str, attempt: int, retry_memory: bool
    ) -> None:
        """Start `attempt` of a worker whose attempt before failed (the wait of `_attempts`)."""
        run = self._runs.get(run_id)
        if run is None or run.cancelled:
            return
        decision = run.retries.get((task, worker, attempt - 1))
        if decision is not None and not decision.done():
            decision.set_result(retry_memory)

    async def _run_process(
        self,
        run: _Run,
        task: TaskSpec,
        task_type: TaskType,
        plan: TaskPlan,
        worker: str,
        attempt: int,
        grant: Grant,
        retry_memory: bool,
    ) -> tuple[int, str]:
        """Run one attempt with the cores and GPUs granted: its exit code and where to look
        (its log), or why it did not start."""
        cores = grant.cores
        record = run.submission.record
        paths = RunPaths(self.store, record.id)
        logs = paths.logs(task.id)
        logs.mkdir(parents=True, exist_ok=True)
        paths.out(task.id).mkdir(parents=True, exist_ok=True)
        scratch = self.scratch / record.id / task.id / f"{worker}-{attempt}"
        scratch.mkdir(parents=True, exist_ok=True)
        launch = launch_for(
            record,
            task.id,
            worker,
            attempt,
            task_type=task_type,
            store=self.store,
            scratch=scratch,
            node=self.hostname,
            cores=cores,
            grace_s=self.grace_s,
            memory_source="process",
            # this machine's memory sizes the pool, nothing kills above it (spec 06)
            memory_enforced=False,
            retry_memory=retry_memory,
        )
        gpus = list(grant.gpus) if self.gpus else None
        try:
            argv = self._argv(run, launch, task, task_type, paths, gpus)
        except (TemplateError, ValueError) as error:
            return exits.CONFIGURATION, f"task {task.id!r}: {error}"
        env = self._env(run, launch)
        if gpus is not None:
            env[CUDA_VISIBLE_DEVICES] = ",".join(gpus)
        log_path = logs / f"{worker}-{attempt}.log"
        pid_path = logs / f"{worker}-{attempt}.pid"
        cwd = paths.task_dir(task.id)
        process: Process | None = None
        entry = _harness_entry(task_type)
        if entry is not None:
            process = await self._hand_off(run, SpareOrder(entry, env, str(cwd), str(log_path)))
        if process is None:
            with open(log_path, "ab") as output:
                try:
                    process = spawn(
                        argv,
                        cwd=cwd,
                        env=env,
                        stdout=output,
                        hold_sigterm=task_type.name != "command",
                    )
                except Exception as error:  # any failure to start ends the attempt, not the run
                    run.containers.pop((task.id, worker, attempt), None)
                    return exits.CONFIGURATION, _not_startable(task.id, argv, error)
        key = (task.id, worker, attempt)
        run.processes[key] = process
        memory_gb = plan.shape.retry_memory_gb if retry_memory else plan.shape.memory_gb
        run.requests[key] = (cores, memory_gb, len(grant.gpus))
        # At once: a service killed before this leaves a process the next one cannot find.
        pid_path.write_text(json.dumps({"pid": process.pid, "run": record.id}))
        run.harness_left.discard(task.id)
        self._prepare_spare(run, paths)
        if run.cancelled:
            _signal_group(process.pid, signal.SIGTERM)
        run.report(
            PodChanged(
                task=task.id,
                worker=worker,
                attempt=attempt,
                phase="running",
                pid=process.pid,
                node=self.hostname,
                gpus=gpus,
            )
        )
        returncode: int | None = None
        try:
            returncode = await process.wait()
        finally:
            # The group may outlive its leader (a pool child): end it with the leader.
            _signal_group(process.pid, signal.SIGKILL)
            container = run.containers.pop(key, None)
            if container is not None and (run.cancelled or returncode is None or returncode < 0):
                await _kill_containers([container], "KILL")  # its client went, it may not have
            run.processes.pop(key, None)
            run.requests.pop(key, None)
            pid_path.unlink(missing_ok=True)
        return exit_code(returncode), f"log {log_path.name}"

    async def _hand_off(self, run: _Run, order: SpareOrder) -> Process | None:
        """The harness of an order in a spare: a warm one of the service's python (its fork
        server), else the run's own (a run with a venv); None without one (start it anew)."""
        if run.python == sys.executable:
            server = self._warm_spares()
            return await server.hand_off(order) if server is not None else None
        spare, run.spare = run.spare, None
        return await spare.hand_off(order) if spare is not None else None

    def _prepare_spare(self, run: _Run, paths: RunPaths) -> None:
        """Start a spare harness for a run with a python of its own while it has harness tasks
        left to start (the fork server keeps the spares of the others)."""
        if run.python == sys.executable:
            return
        if run.spare is None and run.harness_left and not (run.cancelled or self._closed):
            run.spare = Spare.start(paths.run_id, paths.dir, python=run.python)

    def _argv(
        self,
        run: _Run,
        launch: Launch,
        task: TaskSpec,
        task_type: TaskType,
        paths: RunPaths,
        gpus: list[str] | None,
    ) -> list[str]:
        """The argv of an attempt: its harness module (with the run's python), or the argv of
        a `command` task (in its image with the attempt's `gpus`, for a run with
        `local_commands: docker`)."""
        if launch.entry is not None:
            return [run.python, "-m", f"simrun_harness.{launch.entry}"]
        if task_type.name == "command":
            settings = msgspec.convert(task.settings, task_type.settings)
            args = settings.args  # type: ignore[attr-defined]
            inputs = {port: str(self.store / path) for port, path in launch.inputs.items()}
            argv = expand_argv(args, str(paths.settings(task.id)), str(paths.out(task.id)), inputs)
            if run.submission.record.local_commands != "docker":
                return argv
            image = settings.image  # type: ignore[attr-defined]
            return self._container_argv(run, launch, image, argv, paths, gpus)
        raise ValueError(f"type {task_type.name!r} is neither split nor has a command")

    def _container_argv(
        self,
        run: _Run,
        launch: Launch,
        image: str,
        argv: list[str],
        paths: RunPaths,
        gpus: list[str] | None,
    ) -> list[str]:
        """The argv of a `command` task of a run with `local_commands: docker`: its argv in
        its image (`containers`), the store and the attempt's scratch mounted at their paths,
        the attempt's `gpus` given to the container (None: this machine has none); ValueError
        when neither docker nor podman is installed (any more)."""
        engine = containers.container_engine()
        if engine is None:
            raise ValueError(containers.no_engine_message())
        name = containers.container_name(paths.run_id, launch.task, launch.worker, launch.attempt)
        run.containers[(launch.task, launch.worker, launch.attempt)] = (engine, name)
        return containers.container_argv(
            engine,
            name=name,
            image=image,
            args=argv,
            store=self.store.absolute(),
            scratch=Path(launch.scratch).absolute(),
            workdir=paths.task_dir(launch.task),
            env=launch.to_env(),
            gpus=gpus,
        )

    def _env(self, run: _Run, launch: Launch) -> dict[str, str]:
        """The environment of an attempt: the service's with the launch's variables, the root
        of the run's model first on PYTHONPATH and, for a run with a venv, the venv activated
        (its programs first on PATH)."""
        env = dict(os.environ)
        env.pop(EDITABLE, None)  # the venv has the snapshots: the harness installs nothing
        env |= launch.to_env()
        model = self._import_root(run)
        if model:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [model, env.get("PYTHONPATH")]))
        if run.environment is not None:
            programs = str(local_env.bin_of(run.environment))
            env["PATH"] = os.pathsep.join(filter(None, [programs, env.get("PATH", os.defpath)]))
            env["VIRTUAL_ENV"] = str(run.environment / local_env.VENV)
            env.pop("PYTHONHOME", None)
        return env

    def _import_root(self, run: _Run) -> str | None:
        """The root of the run's model, which its tasks import from first (spec 31): the shadow
        tree of its snapshot in the run's venv, else its recorded working tree."""
        record = run.submission.record
        if not record.sources:
            return None
        model = record.sources[0]
        if model.snapshot:
            if run.environment is not None and run.snapshots:
                return str(local_env.sources_of(run.environment, run.snapshots)[0])
            return str(self.store / model.snapshot)
        return model.path or None


async def _kill_containers(found: Iterable[tuple[str, str]], signal_name: str) -> None:
    """Send a signal to containers (engine, name) with `<engine> kill`, waiting for each; a
    container that is gone already (or an engine that fails) is let be."""
    for engine, name in list(found):
        try:
            killer = await asyncio.create_subprocess_exec(
                *containers.kill_argv(engine, name, signal_name),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await asyncio.wait_for(killer.wait(), timeout=KILL_TIMEOUT_S)
        except (OSError, TimeoutError):
            log.warning("the container %s was not sent SIG%s with %s", name, signal_name, engine)


def _harness_entry(task_type: TaskType) -> str | None:
    """The harness module the tasks of a type run in (`simrun_core.launch.harness_entry`)."""
    return harness_entry(task_type)


def _not_startable(task: str, argv: list[str], error: Exception) -> str:
    """Why the process of an attempt did not start: the OS's reason for an OSError (a missing
    program, no permission), else the error (an empty argv, a NUL in an argument)."""
    if not argv:
        return f"task {task!r}: cannot start a process: its argv is empty"
    if isinstance(error, OSError):
        reason = error.strerror or str(error)
    else:
        reason = f"{type(error).__name__}: {error}"
    return f"task {task!r}: cannot start {argv[0]!r}: {reason}"


def _not_started(task: str, worker: str, attempt: int) -> PodChanged:
    """The end of an attempt its run's cancel came to while it waited for cores."""
    return PodChanged(
        task=task,
        worker=worker,
        attempt=attempt,
        phase="failed",
        message="cancelled before it started",
    )


def _oom_evidence(paths: RunPaths, task: str, worker: str, attempt: int) -> bool:
    """Whether the harness reported kills for memory in the attempt's event log."""
    log_path = paths.worker_log(task, worker, attempt)
    try:
        return any(
            isinstance(event, WorkerReport) and event.oom_kills > 0
            for _, event in iter_log(log_path)
        )
    except (OSError, LogCorrupt):
        return False


def _read_logs(logs: Path) -> dict[str, str]:
    """The pod logs of a task's log directory by pod name, each worker's attempts in order."""

    def attempt_order(path: Path) -> tuple[str, int]:
        worker, _, attempt = path.stem.rpartition("-")
        return worker, int(attempt) if attempt.isdigit() else -1

    texts = {}
    for path in sorted(logs.glob("*.log"), key=attempt_order):
        with contextlib.suppress(OSError):
            texts[path.stem] = path.read_text(errors="replace")
    return texts


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_members(pgid: int, run_id: str) -> list[int]:
    """The processes of a process group that carry `SIMRUN_RUN=<run_id>` in their environment."""
    marker = f"SIMRUN_RUN={run_id}".encode()
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid:
                continue
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                members.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return members


def local_backend(settings: ServiceSettings, block: None = None) -> LocalBackend:
    """The local backend of service settings: on their store and their scratch (it has no
    settings block of its own)."""
    return LocalBackend(settings.store, scratch_of(settings), envs=settings.db.parent / "envs")
