"""The logs of a final task are kept in the store: written there by local processes, fetched
from the backend where its pods keep them (a cluster's, whose pods go away)."""

from __future__ import annotations

import anyio
import msgspec
import pytest
from test_recovery import two_squares_run

from simrun_api.actor import RunActor
from simrun_api.backends.base import Capabilities
from simrun_api.backends.fake import FakeBackend, Outcome
from simrun_core.plugins import load_task_types
from simrun_core.states import RunState


async def _nothing(*args) -> None:
    return None


@pytest.mark.parametrize("in_store", [True, False])
def test_the_logs_of_a_final_task_are_in_the_store(tmp_path, in_store):
    store = tmp_path / "store"
    paths = two_squares_run(store)
    backend = FakeBackend(
        store,
        autopilot=lambda pod: Outcome(log=f"{pod.task} says hello\n"),
        capabilities=Capabilities(pod_logs_in_store=in_store),
    )

    async def scenario() -> RunActor:
        actor = RunActor(paths, backend, load_task_types(), _nothing, _nothing)
        actor.open()
        with anyio.fail_after(20):
            await actor.run()
        return actor

    if not in_store:  # the pods of this backend write no log file into the store
        backend.add_log = lambda pod, text: setattr(pod, "log", pod.log + text)  # type: ignore[method-assign]
    actor = anyio.run(scenario)
    assert actor.record.state is RunState.SUCCEEDED, actor.record.message
    for task in ("a", "b"):
        logs = paths.logs(task)
        assert (logs / "w0-0.log").read_text() == f"{task} says hello\n"
        assert msgspec.json.decode((logs / "index.json").read_bytes()) == ["w0-0"]
    assert (("logs", paths.run_id, "a") in backend.calls) is not in_store
