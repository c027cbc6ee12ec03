"""The contract against the fake backend, its autopilot playing the scripts; and what a test
scripts by hand with it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from simrun_api.backends.base import Capabilities, RunSubmission, workflow_name
from simrun_api.backends.fake import FakeBackend, FakeError, FakePod, Outcome, fake_backend
from simrun_api.local import local_settings
from simrun_core import events as ev
from simrun_core.fold import fold
from simrun_core.planner import Node, plan_task
from simrun_core.resources import resolve_resources
from simrun_core.store import MERGED_MARKER, RunPaths, read_log
from simrun_core.wire import ServerUsage
from simrun_core.workflow import Priority, SplitMode, TaskSpec, Workflow

from .contract import PLANNED_ON, BackendContract, Reports, Script, task_types


class TestFakeBackend(BackendContract):
    """The fake backend with an autopilot that plays the script of each pod's task."""

    def make_backend(self, store: Path) -> FakeBackend:
        node = Node(name="fake-node", cores=8, memory_gb=32.0, gpus=2)
        return FakeBackend(store, nodes=[node], autopilot=self.autopilot)

    def args(self, script: Script) -> list[str]:
        return ["played-by-the-autopilot"]

    def autopilot(self, pod: FakePod) -> Outcome:
        script = self.scripts[(pod.run_id, pod.task)]
        log = f"attempt={pod.attempt} memory={pod.memory_per_worker_gb}\n"
        return Outcome(exit_code=script.exit_of(pod.attempt), log=log)


# -- a fake scripted by hand --------------------------------------------------------------------

RUN = "20260101-000000-0fa4e0"


def squares(store: Path | None = None, units: int = 2) -> tuple[FakeBackend, RunSubmission]:
    """A fake without autopilot and a run of split tasks `a` and `b` (reading from `a`)."""
    types = task_types()
    tasks = [
        TaskSpec(id="a", type="demo.squares", settings={"n": units}),
        TaskSpec(id="b", type="demo.squares", settings={"n": units}, inputs={"after": "a.squares"}),
    ]
    plans = {}
    for task in tasks:
        task_type = types[task.type]
        settings = task_type.decode_settings(task.settings)
        plans[task.id] = plan_task(
            task,
            task_type,
            resolve_resources(task, task_type, settings),
            PLANNED_ON,
            SplitMode.SINGLE_SERVER,
            Priority.OWNER,
            task_type.units(settings),
        )
    submitted = ev.Submitted(
        seq=1,
        run=RUN,
        workflow=Workflow(name="squares", tasks=tasks),
        submitted_by="u",
        owner="u",
        plans=plans,
    )
    return FakeBackend(store), RunSubmission(fold([submitted]), types, ready=frozenset({"a"}))


def scripted(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a scenario of a fake driven by hand."""
    asyncio.run(scenario())


def phases(backend: FakeBackend) -> list[tuple[str, str, int, str]]:
    """Every change the fake reported: (task, worker, attempt, phase)."""
    return [(c.task, c.worker, c.attempt, c.phase) for _, c in backend.changes]


def test_each_scripted_step_reports_what_a_real_pod_would_in_order(tmp_path: Path) -> None:
    async def scenario() -> None:
        fake, submission = squares(tmp_path)
        reports = Reports()
        assert await fake.submit(submission, reports) == workflow_name(RUN)
        assert reports.changes == [], "a submitted run changes only when the test says so"
        fake.admit(RUN, "a")
        fake.start(RUN, "a", node="fake-node")
        fake.succeed(RUN, "a")
        await fake.start_task(RUN, "b")  # as the decider asks once `a` is done
        fake.succeed(RUN, "b")  # pending and running first
        assert phases(fake) == [
            ("a", "w0", 0, "pending"),
            ("a", "w0", 0, "running"),
            ("a", "w0", 0, "succeeded"),
            ("b", "w0", 0, "pending"),
            ("b", "w0", 0, "running"),
            ("b", "w0", 0, "succeeded"),
        ]
        assert [c for _, c in fake.changes] == reports.changes
        assert not fake.has(RUN), "every task succeeded: the run ended"
        assert fake.calls == [("submit", RUN), ("start_task", RUN, "b")]

    scripted(scenario)


def test_a_pod_writes_its_harness_log_the_merge_marker_and_its_log(tmp_path: Path) -> None:
    async def scenario() -> None:
        fake, submission = squares(tmp_path)
        await fake.submit(submission, Reports())
        pod = fake.start(RUN, "a")
        fake.add_log(pod, "squaring\n")
        fake.succeed(RUN, "a", log="done\n")
        paths = RunPaths(tmp_path, RUN)
        events = read_log(paths.worker_events("a") / "w0.0.jsonl")
        assert [type(e).__name__ for e in events] == [
            "UnitStarted",
            "UnitStarted",
            "UnitsDone",
            "Merged",
            "WorkerReport",
        ]
        batch, report = events[2], events[-1]
        assert isinstance(batch, ev.UnitsDone) and list(ev.done_units(batch)) == [
            (0, 0.0),
            (1, 0.0),
        ]
        assert isinstance(report, ev.WorkerReport)
        assert (report.attempt, report.units_done, report.exit_code) == (0, 2, 0)
        assert (paths.out("a") / MERGED_MARKER).exists()
        assert (paths.logs("a") / "w0-0.log").read_text() == "squaring\ndone\n"
        assert await fake.logs(RUN, "a") == {"w0-0": "squaring\ndone\n"}

    scripted(scenario)


def test_a_kill_for_memory_has_its_evidence_and_waits_for_a_retry(tmp_path: Path) -> None:
    async def scenario() -> None:
        fake, submission = squares(tmp_path)
        reports = Reports()
        await fake.submit(submission, reports)
        fake.fail(RUN, "a", oom=True)
        end = reports.end("a", 0)
        assert end is not None and (end.exit_code, end.oom) == (137, True)
        [report] = read_log(RunPaths(tmp_path, RUN).worker_events("a") / "w0.0.jsonl")
        assert isinstance(report, ev.WorkerReport) and report.oom_kills == 1
        with pytest.raises(FakeError, match="only on `retry`"):
            fake.start(RUN, "a")
        await fake.retry(RUN, "a", "w0", 1, True)
        pod = fake.succeed(RUN, "a")
        assert (pod.attempt, pod.retry_memory) == (1, True)
        assert pod.memory_gb == submission.record.plans["a"].shape.retry_memory_gb
        assert ("retry", RUN, "a", "w0", 1, True) in fake.calls

    scripted(scenario)


def test_a_preempted_pod_is_stopped_from_outside_without_evidence() -> None:
    async def scenario() -> None:
        fake, submission = squares()
        reports = Reports()
        await fake.submit(submission, reports)
        fake.start(RUN, "a")
        fake.preempt(RUN, "a")
        end = reports.end("a", 0)
        assert end is not None and (end.exit_code, end.oom, end.message) == (
            143,
            False,
            "preempted",
        )

    scripted(scenario)


def test_what_no_backend_does_is_refused() -> None:
    async def scenario() -> None:
        fake, submission = squares()
        with pytest.raises(FakeError, match="no run"):
            fake.start(RUN, "a")
        await fake.submit(submission, Reports())
        with pytest.raises(FakeError, match="task 'b' was not started"):
            fake.start(RUN, "b")
        fake.start(RUN, "a")
        with pytest.raises(FakeError, match="running already"):
            fake.admit(RUN, "a")
        await fake.cancel(RUN)
        with pytest.raises(FakeError, match="cancelled"):
            fake.start(RUN, "a")

    scripted(scenario)


def test_a_fake_that_runs_the_dag_starts_a_task_once_its_input_succeeded() -> None:
    async def scenario() -> None:
        fake, submission = squares()
        fake.capabilities = Capabilities(runs_dag=True)
        await fake.submit(submission, Reports())
        with pytest.raises(FakeError, match="input 'a' has not succeeded"):
            fake.start(RUN, "b")
        fake.succeed(RUN, "a")
        assert fake.start(RUN, "b").phase == "running"

    scripted(scenario)


def test_cancel_ends_pending_and_running_pods_and_a_resubmit_keeps_the_run() -> None:
    async def scenario() -> None:
        fake, submission = squares()
        first, second = Reports(), Reports()
        await fake.submit(submission, first)
        fake.start(RUN, "a")
        fake.admit(RUN, "a", worker="w1")
        await fake.submit(submission, second)
        assert [run for run, _ in fake.submissions] == [submission, submission]
        await fake.cancel(RUN)
        assert [(c.worker, c.phase, c.exit_code) for c in second.changes] == [
            ("w0", "failed", 143),
            ("w1", "failed", None),
        ]
        assert fake.live_pods() == [] and not fake.has(RUN)

    scripted(scenario)


def test_the_autopilot_leaves_a_pod_to_the_test_and_recover_finds_orphans(
    tmp_path: Path,
) -> None:
    def autopilot(pod: FakePod) -> Outcome | None:
        return None if pod.task == "b" else Outcome(exit_code=0)

    async def scenario() -> None:
        _, submission = squares(tmp_path)
        fake = FakeBackend(tmp_path, autopilot=autopilot, orphans=2)
        assert await fake.recover() == 2 and await fake.recover() == 0
        reports = Reports()
        await fake.submit(submission, reports)
        await reports.ended("a", 0)
        await fake.start_task(RUN, "b")
        assert reports.of("b") == [], "the autopilot left b to the test"
        fake.succeed(RUN, "b")
        assert (RunPaths(tmp_path, RUN).out("b") / MERGED_MARKER).exists()
        assert not fake.has(RUN)

    scripted(scenario)


def test_nodes_servers_and_capabilities_are_as_configured() -> None:
    async def scenario() -> None:
        node = Node(name="n1", cores=2, memory_gb=4.0)
        fake = FakeBackend(nodes=[node], capabilities=Capabilities(reservations=True))
        assert await fake.nodes() == [node]
        [server] = await fake.servers()
        assert (server.name, server.cores, server.pods) == ("n1", 2, [])
        assert fake.capabilities.reservations and not fake.capabilities.images
        given = [ServerUsage(name="s", cores=1, memory_gb=1, gpus=0, reserved_by=None, pods=[])]
        assert await FakeBackend(servers=given).servers() == given

    scripted(scenario)


def test_the_fake_of_service_settings_lets_every_pod_succeed(tmp_path: Path) -> None:
    async def scenario() -> None:
        _, submission = squares()
        fake = fake_backend(local_settings(tmp_path))
        reports = Reports()
        await fake.submit(submission, reports)
        await reports.ended("a", 0)
        await fake.start_task(RUN, "b")
        await reports.ended("b", 0)
        assert fake.store is not None
        assert (RunPaths(fake.store, RUN).out("b") / MERGED_MARKER).exists()
        await fake.close()
        with pytest.raises(RuntimeError, match="closed"):
            await fake.submit(submission, reports)

    scripted(scenario)
