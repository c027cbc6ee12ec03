"""The contract every backend keeps: one suite, subclassed per backend.

Like eventsourcing's recorder suite: `BackendContract` holds the tests; a subclass names the
backend (`make_backend`) and how its pods play a `Script` (`args`: the argv of a `command`
task, or an autopilot that reads `scripts`). Every pod of a script first writes one line,
`attempt=<n> memory=<GiB per process>`, into its log, so a test sees which attempt ran and the
memory it was given. Waits are on reported changes, with a timeout; "nothing started" is
checked after a probe run on the same backend ended (`barrier`), never after a sleep.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import pytest

from simrun_api.backends.base import Backend, ReservationRefused, RunSubmission, workflow_name
from simrun_core import events as ev
from simrun_core.fold import RunRecord, fold
from simrun_core.messages import Phase, PodChanged
from simrun_core.planner import Node, plan_task
from simrun_core.plugins import TaskType, load_task_types
from simrun_core.resources import resolve_resources
from simrun_core.wire import ServerUsage
from simrun_core.workflow import Priority, SplitMode, TaskSpec, Workflow

TIMEOUT_S = 10.0
PLANNED_ON = [Node(name="contract-node", cores=4, memory_gb=16.0, gpus=2)]
"""The nodes the contract's runs are planned on (what a task's plan says, not where it runs)."""
_TYPES: dict[str, TaskType] = {}


@dataclasses.dataclass(frozen=True)
class Script:
    """What the pods of a task do, by attempt (the last entry repeats): exit with the code, or
    run until stopped (None)."""

    exits: tuple[int | None, ...] = (0,)

    def exit_of(self, attempt: int) -> int | None:
        """The exit code of an attempt, None for one that runs until stopped."""
        return self.exits[min(attempt, len(self.exits) - 1)]


SUCCEED = Script((0,))
HANG = Script((None,))


@dataclasses.dataclass(frozen=True)
class Task:
    """A `command` task of a contract run, playing `script`, reading from `after`, its pod
    asking `gpus` GPUs."""

    id: str
    script: Script = SUCCEED
    after: str | None = None
    gpus: int = 0


class Reports:
    """The pod changes reported to one `submit` callback, and waits on them."""

    def __init__(self) -> None:
        self.changes: list[PodChanged] = []
        self._arrived = asyncio.Event()

    def __call__(self, change: PodChanged) -> None:
        self.changes.append(change)
        self._arrived.set()

    def of(self, task: str, attempt: int | None = None) -> list[PodChanged]:
        """The changes of a task's pods (of one attempt)."""
        return [
            change
            for change in self.changes
            if change.task == task and (attempt is None or change.attempt == attempt)
        ]

    def phases(self, task: str, attempt: int) -> list[Phase]:
        """The phases of an attempt in the order reported, a repeat of the last one dropped."""
        phases: list[Phase] = []
        for change in self.of(task, attempt):
            if not phases or phases[-1] != change.phase:
                phases.append(change.phase)
        return phases

    def end(self, task: str, attempt: int) -> PodChanged | None:
        """The change that ended an attempt, None while it has not ended."""
        ends = [c for c in self.of(task, attempt) if c.phase in ("succeeded", "failed")]
        return ends[-1] if ends else None

    def first(self, task: str, phase: Phase | None = None) -> int:
        """The index of the first change of a task (in a phase) among all changes."""
        for index, change in enumerate(self.changes):
            if change.task == task and (phase is None or change.phase == phase):
                return index
        raise AssertionError(f"no change of task {task!r} {phase or ''}: {self.changes}")

    async def until(self, ready: Callable[[], object], what: str) -> None:
        """Wait until `ready()` holds after a change; AssertionError after `TIMEOUT_S`."""
        try:
            async with asyncio.timeout(TIMEOUT_S):
                while not ready():
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            raise AssertionError(f"no {what} within {TIMEOUT_S} s: {self.changes}") from None

    async def ended(self, task: str, attempt: int) -> PodChanged:
        """Wait for the end of an attempt; that end."""
        await self.until(lambda: self.end(task, attempt), f"end of {task} attempt {attempt}")
        change = self.end(task, attempt)
        assert change is not None
        return change

    async def running(self, task: str, attempt: int) -> None:
        """Wait until an attempt was reported running."""
        await self.until(
            lambda: "running" in self.phases(task, attempt), f"{task} attempt {attempt} running"
        )


async def eventually(ready: Callable[[], object], what: str) -> None:
    """Poll a condition no change reports (e.g. `has()` after the last one) until it holds."""
    deadline = time.monotonic() + TIMEOUT_S
    while not ready():
        assert time.monotonic() < deadline, f"not {what} within {TIMEOUT_S} s"
        await asyncio.sleep(0.01)


def task_types() -> dict[str, TaskType]:
    """The task types of the entry points, loaded once."""
    if not _TYPES:
        _TYPES.update(load_task_types())
    return _TYPES


class BackendContract(abc.ABC):
    """The tests every backend passes; a subclass per backend implements the hooks."""

    @abc.abstractmethod
    def make_backend(self, store: Path) -> Backend:
        """A new backend over `store` (called again by `restart`)."""

    @abc.abstractmethod
    def args(self, script: Script) -> list[str]:
        """The argv of a `command` task whose pods play `script` (see the module)."""

    def restart(self, backend: Backend, store: Path) -> Backend:
        """A new instance over the same store, as a service started after one that died; the
        pods of the old one are left as they are."""
        return self.make_backend(store)

    async def workflows_of(self, backend: Backend, run_id: str) -> int | None:
        """How many workflows the cluster holds for a run, None where there is no cluster (a
        subclass on one overrides it)."""
        return None

    async def memory_of(self, backend: Backend, run_id: str, task: str, pod: str) -> float:
        """The GiB per process an attempt got: what its pod wrote into its log."""
        log = (await backend.logs(run_id, task))[pod]
        fields = dict(part.split("=", 1) for part in log.split() if "=" in part)
        return float(fields["memory"])

    # -- the frame of a test ------------------------------------------------------------------

    def phases(self, backend: Backend, end: Phase) -> list[Phase]:
        """The phases of an attempt that ran to `end`: `admitted` between pending and running
        for a backend whose pods are admitted (`Capabilities.admits_pods`, Kueue)."""
        admitted: list[Phase] = ["admitted"] if backend.capabilities.admits_pods else []
        return ["pending", *admitted, "running", end]

    def retried_exit(self, backend: Backend) -> int:
        """An exit code that fails an attempt and gets it retried: any for a backend that starts
        attempts on `retry`; 143 (stopped) where the backend retries by its own policy (Argo's
        `retryStrategy`: a code above 128), which fails a 3 for good."""
        return 143 if backend.capabilities.retries_pods else 3

    def setup_method(self) -> None:
        self.scripts: dict[tuple[str, str], Script] = {}
        self._run_ids = itertools.count(1)
        self._backends: list[Backend] = []

    def play(self, tmp_path: Path, scenario: Callable[[Backend], Awaitable[None]]) -> None:
        """Run a scenario on a new backend (recovered first, as a service does), then close
        every backend it made."""
        self.store = tmp_path / "store"
        self.store.mkdir(exist_ok=True)

        async def main() -> None:
            backend = self.make_backend(self.store)
            self._backends.append(backend)
            try:
                assert isinstance(await backend.recover(), int)
                async with asyncio.timeout(3 * TIMEOUT_S):
                    await scenario(backend)
            finally:
                async with asyncio.timeout(TIMEOUT_S):
                    for made in reversed(self._backends):
                        await made.close()

        asyncio.run(main())

    def restarted(self, backend: Backend) -> Backend:
        """`restart`, closed at the end of the test."""
        again = self.restart(backend, self.store)
        self._backends.append(again)
        return again

    def run_id(self) -> str:
        """A new run id."""
        return f"20260101-000000-{next(self._run_ids):06x}"

    def submission(
        self,
        run_id: str,
        *tasks: Task,
        done: Iterable[str] = (),
        next_attempts: dict[tuple[str, str], int] | None = None,
        retry_memory: Iterable[tuple[str, str]] = (),
    ) -> RunSubmission:
        """A submission of a run of `command` tasks, its record folded from a `submitted`
        with the planner's plans (as the service records it), ready to start what the decider
        starts at a submission: the tasks not done whose input is."""
        done = frozenset(done)
        return RunSubmission(
            self.record(run_id, *tasks),
            task_types(),
            done=done,
            ready=frozenset(
                t.id for t in tasks if t.id not in done and (t.after is None or t.after in done)
            ),
            next_attempts=next_attempts or {},
            retry_memory=frozenset(retry_memory),
        )

    def record(self, run_id: str, *tasks: Task) -> RunRecord:
        """The record of a run of `command` tasks; their scripts go to `scripts`."""
        command = task_types()["command"]
        specs = []
        for task in tasks:
            self.scripts[(run_id, task.id)] = task.script
            settings = {"image": "none", "args": self.args(task.script), "cores": 1, "memory_gb": 1}
            if task.gpus:
                settings["gpus"] = task.gpus
            inputs = {"data": f"{task.after}.out"} if task.after else {}
            specs.append(TaskSpec(id=task.id, type="command", settings=settings, inputs=inputs))
        plans = {}
        for spec in specs:
            decoded = command.decode_settings(spec.settings)
            resources = resolve_resources(spec, command, decoded)
            plans[spec.id] = plan_task(
                spec, command, resources, PLANNED_ON, SplitMode.FASTEST, Priority.OWNER, None
            )
        submitted = ev.Submitted(
            seq=1,
            run=run_id,
            workflow=Workflow(name="contract", tasks=specs),
            submitted_by="contract",
            owner="contract",
            plans=plans,
        )
        return fold([submitted])

    async def started_after(
        self, backend: Backend, run_id: str, reports: Reports, task: str, after: str
    ) -> None:
        """What the run's actor does when the decider found `after` done: start `task`."""
        await reports.until(lambda: reports.end(after, 0), f"end of {after}")
        await backend.start_task(run_id, task)

    async def barrier(self, backend: Backend) -> None:
        """Run a probe run to its end: whatever the backend was about to start for another
        run has been reported by then."""
        reports = Reports()
        await backend.submit(self.submission(self.run_id(), Task("probe")), reports)
        await reports.ended("probe", 0)

    # -- the contract -------------------------------------------------------------------------

    def test_the_workflow_name_is_the_run_s_deterministic_name(self, tmp_path: Path) -> None:
        async def scenario(backend: Backend) -> None:
            first, second = self.run_id(), self.run_id()
            reports = Reports()
            assert await backend.submit(self.submission(first, Task("t")), reports) == (
                workflow_name(first)
            )
            assert await backend.submit(self.submission(second, Task("t")), Reports()) == (
                workflow_name(second)
            )
            assert workflow_name(first) != workflow_name(second)
            assert (await reports.ended("t", 0)).phase == "succeeded"

        self.play(tmp_path, scenario)

    def test_a_resubmit_keeps_the_run_and_starts_nothing_twice(self, tmp_path: Path) -> None:
        async def scenario(backend: Backend) -> None:
            run_id = self.run_id()
            submission = self.submission(run_id, Task("t", HANG))
            first, second = Reports(), Reports()
            name = await backend.submit(submission, first)
            await first.running("t", 0)
            assert await backend.submit(submission, second) == name
            assert backend.has(run_id)
            await self.barrier(backend)
            await backend.cancel(run_id)
            changes = first.changes + second.changes
            assert [(c.attempt, c.phase) for c in changes] == [
                (0, phase) for phase in self.phases(backend, "failed")
            ], "one attempt, started once"
            assert second.end("t", 0) is not None, "the end goes to the last submit's callback"

        self.play(tmp_path, scenario)

    def test_a_resubmit_after_a_restart_starts_nothing_twice(self, tmp_path: Path) -> None:
        async def scenario(backend: Backend) -> None:
            run_id = self.run_id()
            tasks = (Task("a"), Task("b", Script((None, 0)), after="a"))
            old = Reports()
            await backend.submit(self.submission(run_id, *tasks), old)
            await self.started_after(backend, run_id, old, "b", "a")
            await old.running("b", 0)
            before_restart = list(old.changes)
            again = self.restarted(backend)
            assert isinstance(await again.recover(), int)
            reports = Reports()
            if backend.capabilities.pods_outlive_service:
                await self.taken_over(again, run_id, tasks, before_restart, reports)
                return
            # What the run's actor resubmits: `a` done, the attempt of `b` the service lost.
            resumed = self.submission(run_id, *tasks, done={"a"}, next_attempts={("b", "b"): 1})
            assert await again.submit(resumed, reports) == workflow_name(run_id)
            assert (await reports.ended("b", 1)).phase == "succeeded"
            assert reports.of("a") == [], "a task done before the restart does not start again"
            starts = [
                (c.task, c.attempt)
                for c in before_restart + reports.changes
                if c.phase == "running"
            ]
            assert sorted(starts) == [("a", 0), ("b", 0), ("b", 1)]
            await eventually(lambda: not again.has(run_id), "the run ended")

        self.play(tmp_path, scenario)

    async def taken_over(
        self,
        again: Backend,
        run_id: str,
        tasks: tuple[Task, ...],
        before_restart: list[PodChanged],
        reports: Reports,
    ) -> None:
        """Where the pods outlive the service: the resubmit takes the run over, no second
        workflow, the attempt of `b` that went on running is followed (same attempt) and its
        end goes to the new callback."""
        resumed = self.submission(run_id, *tasks, done={"a"})
        assert await again.submit(resumed, reports) == workflow_name(run_id)
        assert await self.workflows_of(again, run_id) in (None, 1), "no second workflow"
        await reports.running("b", 0)
        assert again.has(run_id)
        await again.cancel(run_id)
        assert reports.phases("b", 0)[-1] == "failed"
        assert reports.of("a") == [], "a task done before the restart is not told again"
        assert {c.attempt for c in reports.of("b")} == {0}, "the same attempt, taken over"
        starts = {
            (c.task, c.attempt) for c in before_restart + reports.changes if c.phase == "running"
        }
        assert starts == {("a", 0), ("b", 0)}
        assert await self.workflows_of(again, run_id) in (None, 1)

    def test_the_phases_of_an_attempt_come_in_order(self, tmp_path: Path) -> None:
        async def scenario(backend: Backend) -> None:
            run_id = self.run_id()
            reports = Reports()
            code = self.retried_exit(backend)
            await backend.submit(self.submission(run_id, Task("t", Script((code, 0)))), reports)
            failed = await reports.ended("t", 0)
            assert reports.phases("t", 0) == self.phases(backend, "failed")
            assert (failed.exit_code, failed.oom) == (code, False)
            [running] = [c for c in reports.of("t", 0) if c.phase == "running"]
            assert running.node in {node.name for node in await backend.nodes()}
            await backend.retry(run_id, "t", "t", 1, False)
            succeeded = await reports.ended("t", 1)
            assert reports.phases("t", 1) == self.phases(backend, "succeeded")
            assert succeeded.exit_code == 0
            await eventually(lambda: not backend.has(run_id), "the run ended")

        self.play(tmp_path, scenario)

    def test_a_task_starts_only_when_the_decider_starts_it(self, tmp_path: Path) -> None:
        """A task not `ready` at the submission starts on `start_task` alone, once, never by
        the backend's own look at its inputs; a backend that `runs_dag` starts it once its
        input succeeded, and never after an input that failed."""

        async def scenario(backend: Backend) -> None:
            run_id = self.run_id()
            tasks = (
                Task("a"),
                Task("b", after="a"),
                Task("c", Script((3,))),
                Task("d", after="c"),
            )
            reports = Reports()
            await backend.submit(self.submission(run_id, *tasks), reports)
            await reports.ended("a", 0)
            await reports.ended("c", 0)
            if not backend.capabilities.runs_dag:
                await self.barrier(backend)
                assert reports.of("b") == [], "b is not started by the backend itself"
                await backend.start_task(run_id, "b")
                await backend.start_task(run_id, "b")
            await reports.ended("b", 0)
            assert reports.first("a", "succeeded") < reports.first("b")
            await self.barrier(backend)
            assert [c.attempt for c in reports.of("b") if c.phase == "running"] == [0]
            assert reports.of("d") == [], "d reads from c, which failed and was not retried"
            await backend.cancel(run_id)
            await backend.start_task(run_id, "d")
            await self.barrier(backend)
            assert reports.of("d") == [], "nothing starts after a cancel"

        self.play(tmp_path, scenario)

    def test_a_resubmit_starts_the_tasks_it_names_ready(self, tmp_path: Path) -> None:
        """A run's actor that crashed after it appended the end of `a` never carried out its
        `start_task` of `b`; the restarted actor resubmits the run, which the backend still
        follows, with `b` ready: `b` starts then, once."""

        async def scenario(backend: Backend) -> None:
            run_id = self.run_id()
            tasks = (Task("a"), Task("b", after="a"))
            first, second = Reports(), Reports()
            await backend.submit(self.submission(run_id, *tasks), first)
            await first.ended("a", 0)
            resumed = self.submission(run_id, *tasks, done={"a"}, next_attempts={("a", "a"): 1})
            assert resumed.ready == {"b"}
            await backend.submit(resumed, second)
            if backend.capabilities.runs_dag:
                # `b` starts on its own once `a` is done: it may have ended (and been reported
                # to the first callback) before the resubmission.
                await eventually(
                    lambda: first.end("b", 0) or second.end("b", 0), "the end of b attempt 0"
                )
            else:
                await second.ended("b", 0)
            await self.barrier(backend)
            changes = first.changes + second.changes
            assert [c.attempt for c in changes if c.task == "b" and c.phase == "running"] == [0]
            await eventually(lambda: not backend.has(run_id), "the run ended")

        self.play(tmp_path, scenario)

    def test_cancel_ends_every_pod_and_starts_none(self, tmp_path: Path) -> None:
        async def scenario(backend: Backend) -> None:
            run_id = self.run_id()
            tasks = (Task("a", HANG), Task("b", HANG), Task("c", after="a"))
            reports = Reports()
            await backend.submit(self.submission(run_id, *tasks), reports)
            await reports.running("a", 0)
            await reports.running("b", 0)
            await backend.cancel(run_id)
            assert reports.phases("a", 0)[-1] == "failed", "cancel returns once its pods ended"
            assert reports.phases("b", 0)[-1] == "failed"
            assert not backend.has(run_id)
            reported = len(reports.changes)
            await backend.retry(run_id, "a", "a", 1, False)
            await backend.cancel(run_id)  # again: nothing to do
            await self.barrier(backend)
            assert reports.changes[reported:] == [], "nothing starts after a cancel"
            assert reports.of("c") == []

        self.play(tmp_path, scenario)

    def test_a_failed_pod_is_retried_as_the_next_attempt_only_when_asked(
        self, tmp_path: Path
    ) -> None:
        async def scenario(backend: Backend) -> None:
            if backend.capabilities.retries_pods:
                await self.retried_by_the_backend(backend)
                return
            run_id = self.run_id()
            submission = self.submission(run_id, Task("t", Script((3, 3, 0))))
            shape = submission.record.plans["t"].shape
            assert shape.retry_per_worker_gb != shape.per_worker_gb
            reports = Reports()
            await backend.submit(submission, reports)
            await reports.ended("t", 0)
            await self.barrier(backend)
            assert reports.of("t", 1) == [] and backend.has(run_id), "no retry without `retry`"
            await backend.retry(run_id, "t", "t", 1, False)
            assert (await reports.ended("t", 1)).exit_code == 3
            assert await self.memory_of(backend, run_id, "t", "t-1") == shape.per_worker_gb
            await backend.retry(run_id, "t", "t", 2, True)
            assert (await reports.ended("t", 2)).phase == "succeeded"
            assert await self.memory_of(backend, run_id, "t", "t-2") == shape.retry_per_worker_gb
            assert sorted({c.attempt for c in reports.changes}) == [0, 1, 2]

        self.play(tmp_path, scenario)

    async def retried_by_the_backend(self, backend: Backend) -> None:
        """Where the backend retries its pods by its own policy: an attempt stopped (143) is
        retried as the next attempt with the first memory, one killed (137) with the retry
        memory, without `retry`; an exit 3 is not retried."""
        run_id = self.run_id()
        submission = self.submission(run_id, Task("t", Script((143, 137, 3, 0))))
        shape = submission.record.plans["t"].shape
        assert shape.retry_per_worker_gb != shape.per_worker_gb
        reports = Reports()
        await backend.submit(submission, reports)
        assert (await reports.ended("t", 0)).exit_code == 143
        assert (await reports.ended("t", 1)).exit_code == 137
        assert (await reports.ended("t", 2)).exit_code == 3
        await eventually(lambda: not backend.has(run_id), "the run ended")
        await self.barrier(backend)
        assert reports.of("t", 3) == [], "an exit 3 is not retried"
        assert sorted({c.attempt for c in reports.changes}) == [0, 1, 2]
        for attempt in (0, 1, 2):
            assert reports.phases("t", attempt) == self.phases(backend, "failed")
        memories = [await self.memory_of(backend, run_id, "t", f"t-{n}") for n in (0, 1, 2)]
        assert memories == [shape.per_worker_gb, shape.per_worker_gb, shape.retry_per_worker_gb]

    def test_the_next_attempts_of_a_submission_are_honoured(self, tmp_path: Path) -> None:
        async def scenario(backend: Backend) -> None:
            run_id = self.run_id()
            submission = self.submission(
                run_id,
                Task("t"),
                Task("u"),
                next_attempts={("t", "t"): 2},
                retry_memory={("t", "t")},
            )
            shape = submission.record.plans["t"].shape
            reports = Reports()
            await backend.submit(submission, reports)
            # Also where the backend numbers the attempts itself (Argo's `{{retries}}` from 0):
            # a new Workflow starts each worker at its next attempt (`SIMRUN_FIRST_ATTEMPTS`)
            await reports.ended("t", 2)
            await reports.ended("u", 0)
            assert {c.attempt for c in reports.of("t")} == {2}, "a resumed worker goes on"
            assert {c.attempt for c in reports.of("u")} == {0}
            assert await self.memory_of(backend, run_id, "t", "t-2") == shape.retry_per_worker_gb
            assert await self.memory_of(backend, run_id, "u", "u-0") == shape.per_worker_gb

        self.play(tmp_path, scenario)

    def test_nodes_and_servers_have_their_shape(self, tmp_path: Path) -> None:
        async def scenario(backend: Backend) -> None:
            nodes = await backend.nodes()
            assert nodes and all(isinstance(node, Node) for node in nodes)
            assert all(node.name and node.cores > 0 and node.memory_gb > 0 for node in nodes)
            servers = await backend.servers()
            assert servers and all(isinstance(server, ServerUsage) for server in servers)
            assert all(server.name and server.cores > 0 for server in servers)
            run_id = self.run_id()
            submission = self.submission(run_id, Task("t", HANG))
            shape = submission.record.plans["t"].shape
            reports = Reports()
            await backend.submit(submission, reports)
            await reports.running("t", 0)
            [running] = [c for c in reports.of("t", 0) if c.phase == "running"]
            listed = [
                (server.name, pod)
                for server in await backend.servers()
                for pod in server.pods
                if pod.run_id == run_id
            ]
            assert [(name, pod.task_id, pod.pod, pod.phase) for name, pod in listed] == [
                (running.node, "t", "t-0", "running")
            ]
            assert (listed[0][1].cores, listed[0][1].memory_gb) == (shape.cores, shape.memory_gb)
            await backend.cancel(run_id)
            pods = [pod for server in await backend.servers() for pod in server.pods]
            assert [pod for pod in pods if pod.run_id == run_id] == []

        self.play(tmp_path, scenario)

    def test_a_pod_asking_gpus_shows_them_in_servers(self, tmp_path: Path) -> None:
        async def scenario(backend: Backend) -> None:
            if not any(node.gpus for node in await backend.nodes()):
                pytest.skip(f"no node of the {backend.name} backend has GPUs")
            run_id = self.run_id()
            reports = Reports()
            tasks = (Task("gpu", HANG, gpus=1), Task("cpu", HANG))
            await backend.submit(self.submission(run_id, *tasks), reports)
            await reports.running("gpu", 0)
            await reports.running("cpu", 0)
            servers = await backend.servers()
            asked = {
                pod.task_id: pod.gpus
                for server in servers
                for pod in server.pods
                if pod.run_id == run_id
            }
            assert asked == {"gpu": 1, "cpu": 0}
            for server in servers:
                assert sum(pod.gpus for pod in server.pods) <= server.gpus, server
            await backend.cancel(run_id)

        self.play(tmp_path, scenario)

    def test_the_logs_of_a_task_are_those_of_its_pods_by_name(self, tmp_path: Path) -> None:
        async def scenario(backend: Backend) -> None:
            run_id = self.run_id()
            reports = Reports()
            tasks = (Task("t", Script((self.retried_exit(backend), 0))), Task("u"))
            await backend.submit(self.submission(run_id, *tasks), reports)
            await reports.ended("t", 0)
            await backend.retry(run_id, "t", "t", 1, False)
            await reports.ended("t", 1)
            await reports.ended("u", 0)
            logs = await backend.logs(run_id, "t")
            assert list(logs) == ["t-0", "t-1"]
            assert "attempt=0 " in logs["t-0"] and "attempt=1 " in logs["t-1"]
            assert list(await backend.logs(run_id, "u")) == ["u-0"]
            assert await backend.logs(run_id, "nothing") == {}

        self.play(tmp_path, scenario)

    def test_a_node_is_reserved_for_one_run_at_a_time(self, tmp_path: Path) -> None:
        async def holder(backend: Backend, name: str) -> tuple[str | None, str | None]:
            node = next(node for node in await backend.nodes() if node.name == name)
            server = next(server for server in await backend.servers() if server.name == name)
            return node.reserved_by, server.reserved_by

        async def scenario(backend: Backend) -> None:
            first, second = self.run_id(), self.run_id()
            if not backend.capabilities.reservations:
                with pytest.raises(ReservationRefused):
                    await backend.reserve("contract-node", first)
                return
            name = (await backend.nodes())[0].name
            await backend.reserve(name, first)
            await backend.reserve(name, first)
            assert await holder(backend, name) == (first, first)
            with pytest.raises(ReservationRefused, match=first):
                await backend.reserve(name, second)
            with pytest.raises(ReservationRefused, match="no-such-node"):
                await backend.reserve("no-such-node", first)
            await backend.release(name, second)
            assert await holder(backend, name) == (first, first), "only its own is released"
            await backend.release(name, first)
            assert await holder(backend, name) == (None, None)
            await backend.release(name, first)
            await backend.release("no-such-node", first)

        self.play(tmp_path, scenario)
