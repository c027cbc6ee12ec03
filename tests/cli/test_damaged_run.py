"""`simrun status` of a run whose log goes on after its end (as a second writer would leave it):
the run keeps its first end, and the service's warning that its log is damaged is shown."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import run_simrun, write_squares


def test_status_of_a_run_with_a_damaged_log_shows_the_warning(project: Path) -> None:
    write_squares(project, n=2, fail_at=0)
    submitted = run_simrun("submit", "squares.yaml", "--local", "--json", cwd=project)
    assert submitted.returncode == 1, submitted.stdout + submitted.stderr
    run = json.loads(submitted.stdout)["id"]
    stopped = run_simrun("serve", "--local", "--stop", cwd=project)
    assert stopped.returncode == 0, stopped.stderr
    log = project / ".simrun" / "store" / "runs" / run / "events.jsonl"
    failed = json.loads(log.read_text().splitlines()[-1])
    assert failed["type"] == "failed", failed
    later = {"seq": failed["seq"] + 1, "time": failed["time"], "type": "succeeded"}
    with log.open("a") as file:
        file.write(json.dumps(later) + "\n")

    status = run_simrun("status", run, "--local", cwd=project)

    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert any(line.split() == ["state", "failed"] for line in lines), status.stdout
    warning = next((line for line in lines if line.startswith("warning")), None)
    assert warning is not None, status.stdout
    assert "the log is damaged: the run ended at event" in " ".join(status.stdout.split())
    as_json = json.loads(run_simrun("status", run, "--local", "--json", cwd=project).stdout)
    assert as_json["warnings"] and as_json["warnings"][0].startswith("the log is damaged")
