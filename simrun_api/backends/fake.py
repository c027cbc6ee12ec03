"""A backend in memory for tests: its pods change only when the test (or its autopilot) says so.

It speaks `base.Backend` as the local backend does (it does not retry by itself: a failed
attempt waits for `retry`), records every call, and reports each change of a pod in the order
a real backend would, filling in the phases a scripted end skips (a pod that succeeds was
pending and running first). With a store it writes what a real pod writes there: its log
(`tasks/<task>/logs/<worker>-<attempt>.log`), its harness event log
(`tasks/<task>/events/<worker>.<attempt>.jsonl`) and the merge marker of a split task.

Driven by hand, a test scripts each pod: `admit`, `start`, `preempt`, `fail`, `succeed`. Driven
by an autopilot, a function of the pod that returns its `Outcome`, the fake plays every pod
once it would start (the decider started its task: `ready` at the submission or `start_task`, or,
with `Capabilities.runs_dag`, its inputs succeeded; or `retry` asked for it), so a whole run can go
through a real RunActor and Supervisor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import msgspec

from simrun_api.backends.base import (
    Capabilities,
    ReservationRefused,
    RunSubmission,
    workflow_name,
)
from simrun_api.settings import ServiceSettings
from simrun_core import events as ev
from simrun_core import exits
from simrun_core.errors import WorkflowError
from simrun_core.launch import harness_entry, main_worker
from simrun_core.messages import Phase, PodChanged
from simrun_core.planner import Node, TaskPlan
from simrun_core.store import MERGED_MARKER, LogWriter, RunPaths, write_atomic
from simrun_core.wire import PodUsage, ServerUsage
from simrun_core.workflow import TaskSpec

DEFAULT_NODES = (Node(name="fake-node", cores=8, memory_gb=32.0),)


class FakeError(RuntimeError):
    """The test scripted what no real backend does (a pod of a task whose inputs have not
    succeeded, a phase backwards, a new attempt without `retry`, a pod of an ended run), or the
    service did (a run with a reservation submitted before its node was reserved)."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a pod the autopilot plays does once it runs.

    It ends with `exit_code` after `seconds`, or runs until the test ends it or the run is
    cancelled when `exit_code` is None; `oom` is the evidence of a kill for memory (its report
    counts one); `log` its output; `harness` whether it writes the harness files (None: as the
    pods of its type do, every type but `command`); `units` the units a pod of a split task
    does (None: all of them for the coordinator `w0`, none for another worker).
    """

    exit_code: int | None = 0
    oom: bool = False
    seconds: float = 0.0
    log: str = ""
    node: str | None = None
    message: str | None = None
    harness: bool | None = None
    units: Sequence[int] | None = None


@dataclasses.dataclass(eq=False)
class FakePod:
    """One attempt of a worker of a task; `phase` None until it was reported pending."""

    run_id: str
    task: str
    worker: str
    attempt: int
    plan: TaskPlan
    retry_memory: bool = False
    harness: bool = False
    phase: Phase | None = None
    node: str | None = None
    exit_code: int | None = None
    oom: bool = False
    log: str = ""

    @property
    def name(self) -> str:
        """The pod's name as the backends give it: `<worker>-<attempt>`."""
        return f"{self.worker}-{self.attempt}"

    @property
    def live(self) -> bool:
        """Whether it was reported and has not ended."""
        return self.phase in ("pending", "running")

    @property
    def memory_gb(self) -> float:
        """The memory of the pod: its plan's, or the retry memory."""
        shape = self.plan.shape
        return shape.retry_memory_gb if self.retry_memory else shape.memory_gb

    @property
    def memory_per_worker_gb(self) -> float:
        """The memory per process the harness of this attempt gets."""
        shape = self.plan.shape
        return shape.retry_per_worker_gb if self.retry_memory else shape.per_worker_gb


Autopilot = Callable[[FakePod], Outcome | None]
"""The outcome of a pod about to start; None leaves the pod to the test."""


@dataclasses.dataclass(eq=False)
class FakeRun:
    """A run the fake took: its submission, the callback of its last `submit`, its pods."""

    submission: RunSubmission
    report: Callable[[PodChanged], None]
    order: int
    succeeded: set[str]
    started: set[str] = dataclasses.field(default_factory=set)
    """The tasks the decider started (`ready` at the submission, `start`)."""
    pods: dict[tuple[str, str], FakePod] = dataclasses.field(default_factory=dict)
    """The latest attempt of each (task, worker)."""
    cancelled: bool = False
    live: bool = True
    plays: set[asyncio.Task[None]] = dataclasses.field(default_factory=set)

    @property
    def id(self) -> str:
        """The run's id."""
        return self.submission.record.id


class FakeBackend:
    """A backend in memory, advanced by the test or by an autopilot (see the module).

    Recorded: `submissions` (each submission with its report callback), `calls` (`("submit",
    run)`, `("start_task", run, task)`, `("retry", run, task, worker, attempt, retry_memory)`,
    `("cancel", run)`, `("recover",)`, `("logs", run, task)`, `("close",)`, `("reserve", node,
    run)`, `("release", node, run)`), `changes` (every pod change reported, with its run id)
    and `pods` (every attempt of every run). `recover` returns `orphans`.
    """

    def __init__(
        self,
        store: Path | None = None,
        *,
        nodes: Iterable[Node] | None = None,
        servers: Iterable[ServerUsage] | None = None,
        autopilot: Autopilot | None = None,
        capabilities: Capabilities | None = None,
        name: str = "fake",
        max_pods: int = 1,
        orphans: int = 0,
    ) -> None:
        self.store = store
        self.node_list = list(nodes) if nodes is not None else list(DEFAULT_NODES)
        self.server_list = list(servers) if servers is not None else None
        self.autopilot = autopilot
        self.capabilities = capabilities or Capabilities()
        self.name = name
        self.max_pods = max_pods
        self.orphans = orphans
        self.runs: dict[str, FakeRun] = {}
        self.submissions: list[tuple[RunSubmission, Callable[[PodChanged], None]]] = []
        self.calls: list[tuple[object, ...]] = []
        self.changes: list[tuple[str, PodChanged]] = []
        self.pods: list[FakePod] = []
        self.release_failures = 0
        """How many calls of `release` still fail (as a cluster that cannot be reached)."""
        self.closed = False
        self._order = 0

    # -- the protocol ---------------------------------------------------------------------------

    async def nodes(self) -> list[Node]:
        """The nodes it was given."""
        return list(self.node_list)

    async def servers(self) -> list[ServerUsage]:
        """The servers it was given, else one per node with the running pods on it."""
        if self.server_list is not None:
            return list(self.server_list)
        running = [pod for pod in self.live_pods() if pod.phase == "running"]
        return [
            ServerUsage(
                name=node.name,
                cores=node.cores,
                memory_gb=node.memory_gb,
                gpus=node.gpus,
                reserved_by=node.reserved_by,
                pods=[_usage(pod) for pod in running if pod.node == node.name],
            )
            for node in self.node_list
        ]

    async def recover(self) -> int:
        """Record the call; the `orphans` it was given (once)."""
        self.calls.append(("recover",))
        found, self.orphans = self.orphans, 0
        return found

    async def submit(self, run: RunSubmission, report: Callable[[PodChanged], None]) -> str:
        """Take a run (a live one is kept: only its callback changes); with an autopilot the
        pods of the tasks whose inputs are done start."""
        record = run.record
        if self.closed:
            raise RuntimeError("the fake backend is closed")
        self.calls.append(("submit", record.id))
        if record.reserve is not None and self.capabilities.reservations:
            held = {n.name for n in self.node_list if n.reserved_by == record.id}
            if record.reserve not in held:
                raise FakeError(f"run {record.id} submitted before {record.reserve!r} was reserved")
        self.submissions.append((run, report))
        existing = self.runs.get(record.id)
        if existing is not None and existing.live:
            existing.report = report
            existing.started |= run.ready  # a `start_task` a restarted actor's crash lost
            self._start_ready(existing)
        else:
            self._order += 1
            state = FakeRun(
                run, report, self._order, succeeded=set(run.done), started=set(run.ready)
            )
            self.runs[record.id] = state
            self._start_ready(state)
            self._check_end(state)
        return workflow_name(record.id)

    async def reserve(self, node: str, run_id: str) -> None:
        """Mark a node of `nodes` reserved for a run; ReservationRefused without
        `capabilities.reservations`, for an unknown node or one another run holds."""
        self.calls.append(("reserve", node, run_id))
        if not self.capabilities.reservations:
            raise ReservationRefused(f"the {self.name} backend has no reservations")
        index = next((i for i, n in enumerate(self.node_list) if n.name == node), None)
        if index is None:
            raise ReservationRefused(f"node {node!r} does not exist")
        holder = self.node_list[index].reserved_by
        if holder not in (None, run_id):
            raise ReservationRefused(f"node {node!r} is reserved for run {holder}")
        self.node_list[index] = msgspec.structs.replace(self.node_list[index], reserved_by=run_id)

    async def release(self, node: str, run_id: str) -> None:
        """Free a node the run holds (another run's reservation, or an unknown node, is left);
        fails while `release_failures` says so."""
        self.calls.append(("release", node, run_id))
        if self.release_failures > 0:
            self.release_failures -= 1
            raise ConnectionError("the fake cluster cannot be reached")
        for i, known in enumerate(self.node_list):
            if known.name == node and known.reserved_by == run_id:
                self.node_list[i] = msgspec.structs.replace(known, reserved_by=None)

    async def start_task(self, run_id: str, task: str) -> None:
        """Let a task of the run start (played by the autopilot, else left to the test);
        idempotent, nothing for a run that ended."""
        self.calls.append(("start_task", run_id, task))
        run = self.runs.get(run_id)
        if run is None or not run.live:
            return
        run.started.add(task)
        self._start_ready(run)

    async def retry(
        self, run_id: str, task: str, worker: str, attempt: int, retry_memory: bool
    ) -> None:
        """Create `attempt` of a worker whose attempt before failed (played by the autopilot,
        else left to the test); a no-op for any other attempt or a run that ended."""
        self.calls.append(("retry", run_id, task, worker, attempt, retry_memory))
        run = self.runs.get(run_id)
        if run is None or not run.live:
            return
        before = run.pods.get((task, worker))
        if before is None or before.attempt != attempt - 1 or before.phase != "failed":
            return
        self._schedule(run, self._new_pod(run, task, worker, attempt, retry_memory))

    async def cancel(self, run_id: str) -> None:
        """End every live pod of a run (a running one as stopped on SIGTERM) and start none."""
        self.calls.append(("cancel", run_id))
        run = self.runs.get(run_id)
        if run is None or not run.live:
            return
        run.cancelled = True
        run.live = False
        plays = list(run.plays)
        for play in plays:
            play.cancel()
        await asyncio.gather(*plays, return_exceptions=True)
        for pod in list(run.pods.values()):
            if pod.phase == "running":
                self._end(run, pod, exits.TERMINATED, message="cancelled")
            elif pod.phase == "pending":
                self._end(run, pod, None, message="cancelled before it started", started=False)

    def has(self, run_id: str) -> bool:
        """Whether the run is live here: taken, not cancelled, a task not yet succeeded."""
        run = self.runs.get(run_id)
        return run is not None and run.live

    async def logs(self, run_id: str, task: str) -> dict[str, str]:
        """The output of each pod of a task it ran, by pod name, each worker's in order."""
        self.calls.append(("logs", run_id, task))
        pods = [p for p in self.pods if p.run_id == run_id and p.task == task and p.phase]
        return {pod.name: pod.log for pod in sorted(pods, key=lambda p: (p.worker, p.attempt))}

    async def close(self) -> None:
        """Refuse new runs and cancel every live one, unless its pods outlive the service
        (`capabilities.pods_outlive_service`, as a cluster's do)."""
        self.calls.append(("close",))
        self.closed = True
        if self.capabilities.pods_outlive_service:
            return
        for run_id in [run.id for run in self.runs.values() if run.live]:
            await self.cancel(run_id)

    # -- what a test scripts --------------------------------------------------------------------

    def admit(self, run_id: str, task: str, worker: str | None = None) -> FakePod:
        """Report a pod pending (admitted to its cores and memory, not yet running)."""
        run, pod = self._pod_to_script(run_id, task, worker)
        self._check_not_ended(pod)
        if pod.phase is not None:
            raise FakeError(f"task {task!r}: pod {pod.name} is {pod.phase} already")
        self._report(run, pod, "pending")
        return pod

    def start(
        self, run_id: str, task: str, worker: str | None = None, node: str | None = None
    ) -> FakePod:
        """Report a pod running on `node` (the first node by default), pending first."""
        run, pod = self._pod_to_script(run_id, task, worker)
        self._check_not_ended(pod)
        if pod.phase is None:
            self._report(run, pod, "pending")
        if pod.phase != "pending":
            raise FakeError(f"task {task!r}: pod {pod.name} is {pod.phase} already")
        self._running(run, pod, node)
        return pod

    def preempt(
        self, run_id: str, task: str, worker: str | None = None, exit_code: int = exits.TERMINATED
    ) -> FakePod:
        """End a pending or running pod as an eviction does: stopped on SIGTERM, no evidence of
        a kill for memory; it starts again only on `retry`."""
        run, pod = self._pod_to_script(run_id, task, worker)
        if not pod.live:
            raise FakeError(f"task {task!r}: pod {pod.name} is not pending or running")
        self._end(run, pod, exit_code, message="preempted", started=pod.phase == "running")
        return pod

    def fail(
        self,
        run_id: str,
        task: str,
        exit_code: int | None = None,
        *,
        oom: bool = False,
        worker: str | None = None,
        message: str | None = None,
        log: str = "",
    ) -> FakePod:
        """End a pod with an error: `exit_code` (by default 137 with `oom`, else 3), `oom` the
        evidence of a kill for memory (its harness report counts one)."""
        code = exit_code if exit_code is not None else exits.KILLED if oom else exits.FAILED
        if code == 0:
            raise FakeError("a pod that fails has an exit code other than 0")
        run, pod = self._pod_to_script(run_id, task, worker)
        self._check_not_ended(pod)
        self._end(run, pod, code, oom=oom, message=message, log=log)
        return pod

    def succeed(
        self,
        run_id: str,
        task: str,
        worker: str | None = None,
        *,
        log: str = "",
        units: Sequence[int] | None = None,
    ) -> FakePod:
        """End a pod with exit code 0; the coordinator of its task ends the task, and with an
        autopilot the tasks that read from it start."""
        run, pod = self._pod_to_script(run_id, task, worker)
        self._check_not_ended(pod)
        self._end(run, pod, exits.DONE, log=log, units=units)
        return pod

    def add_log(self, pod: FakePod, text: str) -> None:
        """Append output to the log of a pod (and its file, with a store)."""
        pod.log += text
        if self.store is not None:
            path = RunPaths(self.store, pod.run_id).logs(pod.task) / f"{pod.name}.log"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as file:
                file.write(text)

    def write_harness(self, pod: FakePod, *events: ev.Event) -> None:
        """Append events to the harness event log of a pod, as its harness does."""
        if self.store is None:
            raise FakeError("a fake backend without a store writes no harness log")
        paths = RunPaths(self.store, pod.run_id)
        writer = LogWriter(paths.worker_log(pod.task, pod.worker, pod.attempt))
        try:
            writer.append(*events)
        finally:
            writer.close()

    def live_pods(self) -> list[FakePod]:
        """The pending and running pods of the live runs, in the order of their runs."""
        runs = sorted((run for run in self.runs.values() if run.live), key=lambda r: r.order)
        return [pod for run in runs for pod in run.pods.values() if pod.live]

    def pod(self, run_id: str, task: str, worker: str | None = None) -> FakePod | None:
        """The latest attempt of a worker of a task (its coordinator by default)."""
        run = self.runs.get(run_id)
        if run is None:
            return None
        return run.pods.get((task, worker or main_worker(run.submission.record.plans[task])))

    # -- inside ---------------------------------------------------------------------------------

    def _pod_to_script(self, run_id: str, task: str, worker: str | None) -> tuple[FakeRun, FakePod]:
        run = self.runs.get(run_id)
        if run is None:
            raise FakeError(f"no run {run_id!r} was submitted")
        if not run.live:
            raise FakeError(f"run {run_id}: it was cancelled or has ended")
        record = run.submission.record
        try:
            record.workflow.task(task)
        except WorkflowError as error:
            raise FakeError(str(error)) from None
        worker = worker or main_worker(record.plans[task])
        pod = run.pods.get((task, worker))
        if pod is None:
            self._check_ready(run, task)
            key = (task, worker)
            attempt = run.submission.next_attempts.get(key, 0)
            pod = self._new_pod(run, task, worker, attempt, key in run.submission.retry_memory)
        return run, pod

    def _check_ready(self, run: FakeRun, task: str) -> None:
        """FakeError for a task no backend starts: done, not started by the decider, or (where
        the backend runs the DAG) an input not yet succeeded."""
        if task in run.succeeded:
            raise FakeError(f"task {task!r} is done: none of its pods starts again")
        if not self.capabilities.runs_dag:
            if task not in run.started:
                raise FakeError(f"task {task!r} was not started (`ready` or `start_task`)")
            return
        for dependency in run.submission.record.workflow.task(task).dependencies():
            if dependency not in run.succeeded:
                raise FakeError(f"task {task!r}: its input {dependency!r} has not succeeded")

    def _may_start(self, run: FakeRun, task: TaskSpec) -> bool:
        """Whether a task not done may start: the decider started it, or, where the backend
        runs the DAG, its inputs succeeded."""
        if not self.capabilities.runs_dag:
            return task.id in run.started
        return all(dependency in run.succeeded for dependency in task.dependencies())

    @staticmethod
    def _check_not_ended(pod: FakePod) -> None:
        if pod.phase in ("succeeded", "failed"):
            raise FakeError(
                f"task {pod.task!r}: pod {pod.name} {pod.phase}; "
                "a next attempt starts only on `retry`"
            )

    def _new_pod(
        self, run: FakeRun, task: str, worker: str, attempt: int, retry_memory: bool
    ) -> FakePod:
        record = run.submission.record
        task_type = run.submission.types[record.workflow.task(task).type]
        pod = FakePod(
            run_id=run.id,
            task=task,
            worker=worker,
            attempt=attempt,
            plan=record.plans[task],
            retry_memory=retry_memory,
            harness=harness_entry(task_type) is not None,
        )
        run.pods[(task, worker)] = pod
        self.pods.append(pod)
        return pod

    def _start_ready(self, run: FakeRun) -> None:
        """With an autopilot: start the coordinator of every task that may start."""
        if self.autopilot is None or not run.live:
            return
        record = run.submission.record
        for task in record.workflow.order():
            worker = main_worker(record.plans[task.id])
            ready = self._may_start(run, task)
            if task.id in run.succeeded or (task.id, worker) in run.pods or not ready:
                continue
            key = (task.id, worker)
            attempt = run.submission.next_attempts.get(key, 0)
            pod = self._new_pod(run, task.id, worker, attempt, key in run.submission.retry_memory)
            self._schedule(run, pod)

    def _schedule(self, run: FakeRun, pod: FakePod) -> None:
        if self.autopilot is None:
            return
        outcome = self.autopilot(pod)
        if outcome is None:
            return
        play = asyncio.get_running_loop().create_task(self._play(run, pod, outcome))
        run.plays.add(play)
        play.add_done_callback(run.plays.discard)

    async def _play(self, run: FakeRun, pod: FakePod, outcome: Outcome) -> None:
        """Pending, running, then the outcome's end, one step per turn of the loop; a step the
        test took meanwhile (or a cancel) ends the play."""

        def untouched(phase: Phase | None) -> bool:
            current = run.pods.get((pod.task, pod.worker))
            return run.live and current is pod and pod.phase == phase

        await asyncio.sleep(0)
        if not untouched(None):
            return
        self._report(run, pod, "pending")
        await asyncio.sleep(0)
        if not untouched("pending"):
            return
        self._running(run, pod, outcome.node)
        if outcome.exit_code is None:
            if outcome.log:
                self.add_log(pod, outcome.log)
            return
        await asyncio.sleep(outcome.seconds)
        if not untouched("running"):
            return
        self._end(
            run,
            pod,
            outcome.exit_code,
            oom=outcome.oom,
            message=outcome.message,
            log=outcome.log,
            units=outcome.units,
            harness=outcome.harness,
        )

    def _report(
        self,
        run: FakeRun,
        pod: FakePod,
        phase: Phase,
        *,
        exit_code: int | None = None,
        node: str | None = None,
        oom: bool = False,
        message: str | None = None,
    ) -> None:
        pod.phase = phase
        change = PodChanged(
            task=pod.task,
            worker=pod.worker,
            attempt=pod.attempt,
            phase=phase,
            exit_code=exit_code,
            node=node,
            oom=oom,
            message=message,
        )
        self.changes.append((run.id, change))
        run.report(change)

    def _running(self, run: FakeRun, pod: FakePod, node: str | None) -> None:
        pod.node = node or (self.node_list[0].name if self.node_list else DEFAULT_NODES[0].name)
        self._report(run, pod, "running", node=pod.node)

    def _end(
        self,
        run: FakeRun,
        pod: FakePod,
        code: int | None,
        *,
        oom: bool = False,
        message: str | None = None,
        log: str = "",
        units: Sequence[int] | None = None,
        harness: bool | None = None,
        started: bool = True,
    ) -> None:
        """End a pod: the phases it skipped, its files (as its process writes them before it
        exits), then its end; a coordinator that succeeded ends its task."""
        if pod.phase is None:
            self._report(run, pod, "pending")
        if pod.phase == "pending" and started:
            self._running(run, pod, None)
        if log or pod.phase == "running":
            self.add_log(pod, log)
        if pod.phase == "running" and (pod.harness if harness is None else harness):
            self._write_harness_files(pod, code, oom, units)
        pod.exit_code, pod.oom = code, oom
        if code == exits.DONE:
            self._report(run, pod, "succeeded", exit_code=code)
        else:
            detail = message or f"log {pod.name}.log"
            self._report(run, pod, "failed", exit_code=code, oom=oom, message=detail)
        if code == exits.DONE and pod.worker == main_worker(pod.plan):
            run.succeeded.add(pod.task)
            self._start_ready(run)
            self._check_end(run)

    def _write_harness_files(
        self, pod: FakePod, code: int | None, oom: bool, units: Sequence[int] | None
    ) -> None:
        """What the harness of the pod writes: its units, the merge (marker, then `merged`) of
        a coordinator that merges, and its report."""
        if self.store is None:
            return
        plan = pod.plan
        coordinator = pod.worker == main_worker(plan)
        events: list[ev.Event] = []
        done: Sequence[int] = ()
        if code == exits.DONE and plan.units is not None:
            done = units if units is not None else range(plan.units) if coordinator else ()
            events += [
                ev.UnitStarted(task=pod.task, index=index, worker=pod.worker) for index in done
            ]
            if done:  # as the harness writes them: one batch of what completed together
                batch = [(index, 0.0) for index in done]
                events.append(ev.units_done_event(pod.task, pod.worker, batch))
            if coordinator and plan.coordinator_merges:
                out = RunPaths(self.store, pod.run_id).out(pod.task)
                out.mkdir(parents=True, exist_ok=True)
                marker = {"task": pod.task, "worker": pod.worker, "units": plan.units}
                write_atomic(out / MERGED_MARKER, json.dumps(marker).encode() + b"\n")
                events.append(ev.Merged(task=pod.task, worker=pod.worker))
        events.append(
            ev.WorkerReport(
                task=pod.task,
                worker=pod.worker,
                attempt=pod.attempt,
                node=pod.node,
                units_done=len(done),
                per_worker_gb=pod.memory_per_worker_gb,
                oom_kills=int(oom),
                failed=code != exits.DONE,
                exit_code=code,
            )
        )
        self.write_harness(pod, *events)

    def _check_end(self, run: FakeRun) -> None:
        if all(task.id in run.succeeded for task in run.submission.record.workflow.tasks):
            run.live = False


def _usage(pod: FakePod) -> PodUsage:
    return PodUsage(
        run_id=pod.run_id,
        task_id=pod.task,
        pod=pod.name,
        phase=pod.phase or "pending",
        cores=pod.plan.shape.cores,
        memory_gb=pod.memory_gb,
        gpus=pod.plan.shape.gpus,
    )


def fake_backend(settings: ServiceSettings, block: None = None) -> FakeBackend:
    """A fake over the settings' store whose every pod succeeds, for a service under test:
    `backend = "simrun_api.backends.fake:fake_backend"` in its settings."""
    return FakeBackend(settings.store, autopilot=lambda pod: Outcome())
