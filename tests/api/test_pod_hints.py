"""The actor's hints to a backend that polls (`Capabilities.pod_hints`): each coordinator's
merge, once, as soon as its `merged` event is in the run's log; a harness log of a pod whose
start is not reported yet (left unread meanwhile); nothing to a backend without them."""

from __future__ import annotations

import dataclasses

import anyio
from test_merge_marker import run_until_ended
from test_recovery import RUN_ID, harness_log, two_squares_run

from simrun_api.actor import RunActor
from simrun_api.backends.base import Capabilities
from simrun_api.backends.fake import FakeBackend, Outcome
from simrun_api.harness_watch import HarnessWatch
from simrun_core import events as ev
from simrun_core.plugins import load_task_types
from simrun_core.states import RunState


@dataclasses.dataclass
class RecordedHints:
    """A `PodHints` that records the merges it was told."""

    merges: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    starts: list[str] = dataclasses.field(default_factory=list)

    def merged(self, run_id: str, task: str) -> None:
        self.merges.append((run_id, task))

    def started(self, run_id: str) -> None:
        self.starts.append(run_id)


def played(pod) -> Outcome:
    return Outcome()


def test_each_merge_is_hinted_once_when_it_is_in_the_log(tmp_path):
    store = tmp_path / "store"
    paths = two_squares_run(store)
    hints = RecordedHints()
    backend = FakeBackend(store, autopilot=played, capabilities=Capabilities(pod_hints=hints))
    actor = run_until_ended(paths, backend)
    assert actor.record.state is RunState.SUCCEEDED, actor.record.message
    assert hints.merges == [(RUN_ID, "a"), (RUN_ID, "b")]
    assert set(actor.record.merged) == {"a", "b"}


def test_a_backend_without_hints_runs_as_before(tmp_path):
    store = tmp_path / "store"
    actor = run_until_ended(two_squares_run(store), FakeBackend(store, autopilot=played))
    assert actor.record.state is RunState.SUCCEEDED, actor.record.message


def test_a_log_of_a_pod_not_reported_to_start_is_hinted(tmp_path):
    store = tmp_path / "store"
    paths = two_squares_run(store)
    hints = RecordedHints()
    backend = FakeBackend(store, capabilities=Capabilities(pod_hints=hints))  # pods stay put

    async def _nothing(*args) -> None:
        return None

    async def scenario() -> RunActor:
        watch = HarnessWatch(tick_s=0.01, slices=1)
        actor = RunActor(paths, backend, load_task_types(), _nothing, _nothing, watch=watch)
        actor.open()
        try:
            with anyio.fail_after(20):
                async with anyio.create_task_group() as group:
                    group.start_soon(actor.run)
                    while not backend.submissions:
                        await anyio.sleep(0.01)
                    harness_log(paths, "a", "w0", 0, ev.UnitStarted(task="a", index=0, worker="w0"))
                    while not hints.starts:
                        await anyio.sleep(0.01)
                    await actor.cancel("u")
        finally:
            watch.stop()
        return actor

    actor = anyio.run(scenario)
    assert hints.starts[0] == RUN_ID
    assert hints.merges == []
    assert actor.record.state is RunState.CANCELLED
