"""A run exported for another engine (`simrun export`, run by cwltool or Toil) in a service's
store is listed by the service, never followed: nothing of it is submitted to the backend."""

from __future__ import annotations

from pathlib import Path

import msgspec
from supervised import supervise
from test_recovery import two_squares_run

from simrun_api.backends.fake import FakeBackend
from simrun_api.supervisor import Supervisor
from simrun_core import events as ev
from simrun_core.cwl import BACKEND as CWL_BACKEND
from simrun_core.states import RunState
from simrun_core.store import LogWriter, read_log


def test_a_run_exported_for_another_engine_is_listed_and_not_followed(tmp_path: Path) -> None:
    store = tmp_path / "store"
    paths = two_squares_run(store)
    [submitted] = read_log(paths.events)
    paths.events.unlink()
    writer = LogWriter(paths.events)
    writer.append(msgspec.structs.replace(submitted, backend=CWL_BACKEND))
    writer.close()
    backend = FakeBackend(store)
    seen: list[RunState] = []

    def listed(supervisor: Supervisor) -> bool:
        seen.append(supervisor.summary(paths.run_id).state)
        return not supervisor.actors

    supervise(store, backend, listed)
    assert seen and set(seen) == {RunState.SUBMITTING}
    assert not any(call[0] == "submit" for call in backend.calls)
    assert [type(e) for e in read_log(paths.events)] == [ev.Submitted], "nothing was appended"
