"""A coordinator that succeeded before its merge marker is seen (a store on NFS): the actor
looks for the marker within the backend's grace, then the task is done, or failed."""

from __future__ import annotations

import anyio
from test_recovery import RUN_ID, two_squares_run

from simrun_api.actor import RunActor
from simrun_api.backends.base import Capabilities
from simrun_api.backends.fake import FakeBackend, Outcome
from simrun_core.plugins import load_task_types
from simrun_core.states import RunState, TaskState
from simrun_core.store import MERGED_MARKER


async def _nothing(*args) -> None:
    return None


def run_until_ended(paths, backend: FakeBackend, during=None) -> RunActor:
    async def scenario() -> RunActor:
        actor = RunActor(paths, backend, load_task_types(), _nothing, _nothing)
        actor.open()
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(actor.run)
                if during is not None:
                    await during(actor)
        return actor

    return anyio.run(scenario)


def silent_coordinator(pod) -> Outcome:
    """`a`'s coordinator ends without writing any harness file (no `merged`, no marker)."""
    return Outcome(harness=False) if pod.task == "a" else Outcome()


def test_a_marker_written_late_is_found_within_the_grace(tmp_path):
    store = tmp_path / "store"
    paths = two_squares_run(store)
    backend = FakeBackend(
        store,
        autopilot=silent_coordinator,
        capabilities=Capabilities(merge_marker_grace_s=10.0),
    )

    async def write_the_marker_late(actor: RunActor) -> None:
        while "a" not in actor.record.pods or actor.record.pods["a"]["w0"].state != "succeeded":
            await anyio.sleep(0.01)
        assert actor.record.tasks["a"] is not TaskState.DONE  # waiting for the marker
        await anyio.sleep(0.2)
        paths.out("a").mkdir(parents=True, exist_ok=True)
        (paths.out("a") / MERGED_MARKER).write_text("")

    actor = run_until_ended(paths, backend, write_the_marker_late)
    assert actor.record.state is RunState.SUCCEEDED, actor.record.message
    assert actor.record.tasks == {"a": TaskState.DONE, "b": TaskState.DONE}


def test_no_marker_within_the_grace_fails_the_task(tmp_path):
    store = tmp_path / "store"
    paths = two_squares_run(store)
    backend = FakeBackend(
        store,
        autopilot=silent_coordinator,
        capabilities=Capabilities(merge_marker_grace_s=0.3),
    )
    actor = run_until_ended(paths, backend)
    assert actor.record.state is RunState.FAILED
    assert actor.record.tasks["a"] is TaskState.FAILED
    assert actor.record.message == (
        "task 'a' failed: the coordinator succeeded without merging the units"
    )
    assert actor.record.id == RUN_ID
