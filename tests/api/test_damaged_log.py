"""A run's log that goes on after its end (a `failed`, then a `succeeded` appended after it, as a
second writer would): the service folds the first end as final. `GET /runs/{run}` answers the
run failed with a warning that its log is damaged, the list has it failed, and the service's
log says so at its start."""

from __future__ import annotations

import json
from pathlib import Path

from live_service import command, python
from service_helpers import start_configured_service, stop_configured_service


def test_a_log_that_goes_on_after_its_end_keeps_its_first_end_and_warns(tmp_path: Path) -> None:
    service = start_configured_service(tmp_path)
    try:
        workflow = {"name": "fails", "tasks": [command("t", python("raise SystemExit(3)"))]}
        run = service.submit("mk", workflow)["id"]
        end = service.wait(run)
        assert end["state"] == "failed", end
        assert service.clients["mk"].get(f"/runs/{run}").json()["warnings"] == []
    finally:
        assert stop_configured_service(service) == 0

    log = service.run_dir(run) / "events.jsonl"
    events = service.events(run)
    failed = next(event for event in events if event["type"] == "failed")
    assert failed is events[-1], [event["type"] for event in events]
    later = {"seq": failed["seq"] + 1, "time": failed["time"], "type": "succeeded"}
    with log.open("a") as file:
        file.write(json.dumps(later) + "\n")

    (tmp_path / "service.log").write_text("")
    service = start_configured_service(tmp_path)
    try:
        answer = service.clients["mk"].get(f"/runs/{run}")
        assert answer.status_code == 200, answer.text
        view = answer.json()
        assert view["state"] == "failed", view
        assert view["message"] == failed["message"]
        assert view["seq"] == later["seq"]
        warning = (
            f"the log is damaged: the run ended at event {failed['seq']} ('failed') and 1 event "
            f"follows, the first at event {later['seq']} ('succeeded'); they are ignored"
        )
        assert view["warnings"] == [warning]
        listed = service.clients["mk"].get("/runs").json()
        assert [(item["id"], item["state"]) for item in listed] == [(run, "failed")]
        assert f"run {run}: {warning}" in (tmp_path / "service.log").read_text()
    finally:
        assert stop_configured_service(service) == 0
