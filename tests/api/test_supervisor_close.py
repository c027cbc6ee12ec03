"""Stopping the service: locally its runs are cancelled (their pods are its processes); where
the pods outlive the service (a cluster), the runs go on and the next service resumes them."""

from __future__ import annotations

import anyio
import pytest
from test_recovery import two_squares_run

from simrun_api.backends.base import Capabilities
from simrun_api.backends.fake import FakeBackend, Outcome
from simrun_api.index import RunIndex
from simrun_api.resources import ResourceStore
from simrun_api.supervisor import Supervisor
from simrun_core.errors import WorkflowError
from simrun_core.plugins import load_task_types
from simrun_core.store import read_log


@pytest.mark.parametrize("outlive", [False, True])
def test_a_stopped_service_cancels_its_runs_only_where_their_pods_die_with_it(tmp_path, outlive):
    store = tmp_path / "store"
    paths = two_squares_run(store)
    backend = FakeBackend(
        store,
        autopilot=lambda pod: Outcome(exit_code=None),  # every pod runs until stopped
        capabilities=Capabilities(pods_outlive_service=outlive),
    )

    async def serve_then_stop() -> None:
        index, resources = RunIndex(tmp_path / "db.sqlite"), ResourceStore(tmp_path / "db.sqlite")
        await index.open()
        await resources.open()
        supervisor = Supervisor(store, backend, load_task_types(), index, resources)
        await supervisor.start()
        with anyio.fail_after(10):
            while len(backend.live_pods()) < 2:
                await anyio.sleep(0.01)
        await supervisor.close()
        await resources.close()
        await index.close()

    anyio.run(serve_then_stop)
    kinds = [event.__struct_config__.tag for event in read_log(paths.events)]
    if outlive:
        assert "cancel-requested" not in kinds and kinds[-1] != "cancelled"
        assert ("cancel", paths.run_id) not in backend.calls
    else:
        assert kinds[-1] == "cancelled"


class RefusingBackend(FakeBackend):
    """A backend whose manifests of the run cannot be built."""

    async def submit(self, run, report) -> str:
        raise WorkflowError("task 'a': settings.args[0]: no image to run it in")


def test_a_run_its_backend_refuses_ends_failed_instead_of_crashing_its_actor(tmp_path):
    store = tmp_path / "store"
    paths = two_squares_run(store)

    async def serve() -> None:
        index, resources = RunIndex(tmp_path / "db.sqlite"), ResourceStore(tmp_path / "db.sqlite")
        await index.open()
        await resources.open()
        supervisor = Supervisor(store, RefusingBackend(store), load_task_types(), index, resources)
        await supervisor.start()
        with anyio.fail_after(10):
            while not supervisor.summary(paths.run_id).state.ended:
                await anyio.sleep(0.01)
        await supervisor.close()
        await resources.close()
        await index.close()

    anyio.run(serve)
    last = read_log(paths.events)[-1]
    assert last.__struct_config__.tag == "failed"
    assert last.message == (
        "the run could not be submitted: task 'a': settings.args[0]: no image to run it in"
    )
