"""The start of a task through a real actor: the decider's `StartTask` reaches the backend even
when the actor that decided it crashed before carrying it out (the supervisor restarts it, the
backend still following the run); the pods of a run whose actor restarted in the same service go
on and are taken over, not failed."""

from __future__ import annotations

import anyio
import pytest
from submitted_runs import write_submitted_run

from simrun_api.actor import RunActor
from simrun_api.backends.fake import FakeBackend, Outcome
from simrun_core.plugins import load_task_types
from simrun_core.states import RunState, TaskState
from simrun_core.store import RunPaths, read_log
from simrun_core.workflow import TaskSpec

RUN_ID = "20260101-000000-57a575"


def chained_run(store) -> RunPaths:
    """A submitted run of two split tasks of one unit each, `b` reading from `a`."""
    tasks = [
        TaskSpec(id="a", type="demo.squares", settings={"n": 1}),
        TaskSpec(id="b", type="demo.squares", settings={"n": 1}, inputs={"after": "a.squares"}),
    ]
    return write_submitted_run(store, RUN_ID, "chain", tasks)


class Crash(Exception):
    """What crashes the first actor."""


async def _nothing(*args) -> None:
    return None


def test_a_task_whose_start_an_actor_crash_lost_is_started_by_the_restarted_actor(tmp_path):
    """The first actor appends `a` done, then crashes as it publishes the change (before it
    carries out `StartTask(b)`); the restarted actor's resubmission starts `b` and the run
    succeeds."""
    paths = chained_run(tmp_path / "store")
    backend = FakeBackend(tmp_path / "store", autopilot=lambda pod: Outcome())

    async def crash_once_a_is_done(record, summary_changed: bool) -> None:
        if record.tasks["a"] is TaskState.DONE:
            raise Crash("the actor crashed after it appended the end of a")

    async def scenario() -> RunActor:
        first = RunActor(paths, backend, load_task_types(), crash_once_a_is_done, _nothing)
        first.open()
        with anyio.fail_after(20), pytest.raises(Crash):
            await first.run()
        assert first.record.tasks == {"a": TaskState.DONE, "b": TaskState.WAITING}
        assert backend.has(RUN_ID), "the backend still follows the run"
        again = RunActor(paths, backend, load_task_types(), _nothing, _nothing)
        again.open()
        with anyio.fail_after(20):
            await again.run()
        return again

    actor = anyio.run(scenario)
    assert actor.record.state is RunState.SUCCEEDED, actor.record.message
    assert [c for c in backend.calls if c[0] == "submit"] == [("submit", RUN_ID)] * 2
    assert sum(1 for pod in backend.pods if pod.task == "b") == 1, "b started once"
    assert not backend.has(RUN_ID)


def test_an_actor_restarted_in_the_same_service_takes_over_the_pods_that_run(tmp_path):
    """The first actor crashes while `a` runs; the backend still runs its pod, so the restarted
    actor takes it over (no `pod-failed`, no second attempt) and the run succeeds when it ends."""
    paths = chained_run(tmp_path / "store")
    backend = FakeBackend(
        tmp_path / "store", autopilot=lambda pod: None if pod.task == "a" else Outcome()
    )

    async def crash_once_a_runs(record, summary_changed: bool) -> None:
        if record.tasks["a"] is TaskState.RUNNING:
            raise Crash("the actor crashed while a ran")

    async def scenario() -> RunActor:
        first = RunActor(paths, backend, load_task_types(), crash_once_a_runs, _nothing)
        first.open()
        async with anyio.create_task_group() as group:
            group.start_soon(_expect_crash, first)
            with anyio.fail_after(20):
                while not [c for c in backend.calls if c[0] == "submit"]:
                    await anyio.sleep(0.01)
            backend.start(RUN_ID, "a")
        again = RunActor(paths, backend, load_task_types(), _nothing, _nothing)
        again.open()
        async with anyio.create_task_group() as group:
            group.start_soon(again.run)
            with anyio.fail_after(20):
                while len([c for c in backend.calls if c[0] == "submit"]) < 2:
                    await anyio.sleep(0.01)
            backend.succeed(RUN_ID, "a")
        return again

    actor = anyio.run(scenario)
    assert actor.record.state is RunState.SUCCEEDED, actor.record.message
    events = [type(e).__name__ for e in read_log(paths.events)]
    assert "PodFailed" not in events, events
    assert [(p.task, p.attempt) for p in backend.pods] == [("a", 0), ("b", 0)]


async def _expect_crash(actor: RunActor) -> None:
    with anyio.fail_after(20), pytest.raises(Crash):
        await actor.run()
