"""The run view in a real browser of a run whose log goes on after its end (as a second writer
would leave it): the run keeps its first end, and the service's warning that its log is damaged
is shown with the run's details."""

from __future__ import annotations

import json
from pathlib import Path

from live_service import command, python
from playwright.sync_api import expect
from web_helpers import free_port, log_in, screenshot, start_local, stop_local


def test_the_run_view_shows_the_warning_of_a_damaged_log(page, tmp_path: Path) -> None:
    service = start_local(tmp_path, free_port())
    try:
        run = service.submit({"name": "fit", "tasks": [command("fit", python("exit(3)"))]})["id"]
        assert service.wait(run)["state"] == "failed"
    finally:
        stop_local(service)
    log = service.run_dir(run) / "events.jsonl"
    failed = json.loads(log.read_text().splitlines()[-1])
    assert failed["type"] == "failed", failed
    later = {"seq": failed["seq"] + 1, "time": failed["time"], "type": "succeeded"}
    with log.open("a") as file:
        file.write(json.dumps(later) + "\n")

    service = start_local(tmp_path, free_port())
    try:
        log_in(page, service, f"/runs/{run}")
        expect(page.locator("[data-role=runbar] [data-role=state]")).to_have_text("failed")
        warning = page.locator("[data-role=run-warning]")
        expect(warning).to_have_count(1)
        expect(warning).to_contain_text(
            f"the log is damaged: the run ended at event {failed['seq']} ('failed')"
        )
        screenshot(page, "executions-damaged-log")
    finally:
        stop_local(service)
