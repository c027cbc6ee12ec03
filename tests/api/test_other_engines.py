"""A log has one writer, named by its `submitted` event (`ev.Writer`). A run exported for
another engine (`simrun export`, run by cwltool or Toil) is written by the export: a service on
its store folds and lists it like any other log and never appends to it, whatever its backend
says; nothing of it goes to the service's backend and a cancel of it is refused."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from service_helpers import start_configured_service, stop_configured_service
from supervised import supervise
from test_recovery import two_squares_run

from simrun_api.backends.fake import FakeBackend
from simrun_api.supervisor import Supervisor
from simrun_core import events as ev
from simrun_core.states import RunState
from simrun_core.store import LogWriter, read_log

ROOT = Path(__file__).parents[2]
SIMRUN_API = ROOT / "simrun_api"


def test_a_log_the_export_writes_is_listed_and_not_followed_whatever_its_backend(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    paths = two_squares_run(store)
    [submitted] = read_log(paths.events)
    assert submitted.backend == "local", "the backend the service runs, a name alone decides none"
    paths.events.unlink()
    writer = LogWriter(paths.events)
    writer.append(msgspec.structs.replace(submitted, writer=ev.Writer.EXPORT))
    writer.close()
    written = paths.events.read_bytes()
    backend = FakeBackend(store)
    seen: list[RunState] = []

    def listed(supervisor: Supervisor) -> bool:
        seen.append(supervisor.summary(paths.run_id).state)
        return not supervisor.actors

    supervise(store, backend, listed)
    assert seen and set(seen) == {RunState.SUBMITTING}
    assert not any(call[0] == "submit" for call in backend.calls)
    assert paths.events.read_bytes() == written, "nothing was appended"


def test_a_service_on_the_store_of_an_export_never_writes_the_exported_run(
    tmp_path: Path,
) -> None:
    pytest.importorskip("cwl_utils", reason="the optional extra cwl validates the export")
    from simrun_cli.export import ExportOptions, export_run

    (tmp_path / "squares.yaml").write_bytes((ROOT / "examples" / "squares.yaml").read_bytes())
    exported = export_run(
        ExportOptions(
            workflow=tmp_path / "squares.yaml", cwl=tmp_path / "run.cwl", store=tmp_path / "store"
        )
    )
    run_dir = Path(exported.store) / "runs" / exported.run
    assert run_dir.parent.parent == (tmp_path / "store").resolve()
    files = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}
    assert run_dir / "events.jsonl" in files and run_dir / "run.json" in files

    service = start_configured_service(tmp_path)
    try:
        mk = service.clients["mk"]
        listed = {run["id"]: run for run in mk.get("/runs").json()}
        assert listed[exported.run]["state"] == "submitting", listed
        shown = mk.get(f"/runs/{exported.run}").json()
        assert shown["state"] == "submitting" and shown["backend"] == "cwl", shown
        refused = mk.post(f"/runs/{exported.run}/cancel")
        assert refused.status_code == 409, refused.text
        assert "its log is written by export" in refused.json()["detail"], refused.text
        # A run of the service's own runs to its end meanwhile, so an actor of the exported
        # run, had one been started, would have written its log by then.
        own = service.submit("mk", {"name": "own", "tasks": [squares_task()]})
        assert service.wait(own["id"])["state"] == "succeeded"
        assert mk.get(f"/runs/{exported.run}").json()["state"] == "submitting"
    finally:
        assert stop_configured_service(service) == 0
    after = {path: path.read_bytes() for path in sorted(run_dir.rglob("*")) if path.is_file()}
    assert after == files, "the service wrote nothing of the exported run"


def squares_task() -> dict[str, object]:
    return {"id": "squares", "type": "demo.squares", "settings": {"n": 4}}


def test_no_module_of_the_service_special_cases_an_engine() -> None:
    """Who follows a run is its log's writer, not a name of a backend or an engine."""
    for path in sorted(SIMRUN_API.rglob("*.py")):
        text = path.read_text()
        assert "simrun_core.cwl" not in text, path
        assert "CWL_BACKEND" not in text, path
        assert '== "cwl"' not in text and "backend ==" not in text, path
