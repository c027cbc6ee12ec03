"""The help of the command line and the descriptions of the MCP tools promise what the code does
(issue 15): each claim checked here is one the code keeps, some against a run of the service."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cli_helpers import run_simrun
from live_service import command, run_processes, start_service, stop_service, wait_until

from simrun_cli.mcp import LocalConnection, build_server


def descriptions() -> dict[str, str]:
    server = build_server(LocalConnection(Path.cwd()))
    return {
        tool.name: " ".join(tool.description.split()) for tool in asyncio.run(server.list_tools())
    }


def help_of(*command: str) -> str:
    result = run_simrun(*command, "--help", cwd=Path.cwd())
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.replace("│", " ").split())


def test_cleanup_says_whose_runs_it_removes_and_which_snapshots_it_keeps() -> None:
    text = help_of("cleanup")
    assert "Remove ended runs you may remove" in text
    assert "a person's own and their agents', an agent's own, every run for the owner" in text
    assert "nor a snapshot written within the last hour" in text
    assert "ended this many days ago or earlier (0: all)" in text
    assert "Only the runs which failed (not the cancelled ones)" in text


def test_the_client_help_names_what_submit_validate_and_outputs_do() -> None:
    text = help_of()
    assert "validate" in text and "Check a workflow as submit would submit it" in text
    submit = help_of("submit")
    assert "--docker" in submit and "podman run" in submit and "refused when neither" in submit
    assert "has a plan are completed by it before the sources are recorded" in submit
    outputs = help_of("outputs")
    assert "relative to the store (runs/RUN/tasks/TASK/out/...)" in outputs


def test_the_mcp_descriptions_say_what_the_tools_answer() -> None:
    tools = descriptions()
    progress = tools["run_progress"]
    assert "`counts` of its ledger (`pending`, `claimed` by a worker, `done`, `total`)" in (
        progress
    )
    assert "`first` and `last` progress lines" in progress
    assert "workers (`pods`:" in tools["run_status"]
    assert "a plan that fails refuses the workflow (status 422" in tools["submit_workflow"]
    assert "null for an unsplit task" in tools["estimate_workflow"]
    assert "tasks end as skipped" not in tools["cancel_run"]


def test_a_cancel_ends_the_tasks_as_cancel_run_says(tmp_path: Path) -> None:
    said = descriptions()["cancel_run"]
    assert "its running tasks end `cancelled`, the ones that had not begun `skipped`" in said
    service = start_service(tmp_path)
    try:
        tasks = [
            command("quick", ["true"]),
            command("sleep", ["python", "-c", "import time; time.sleep(600)"]),
            command("after", ["true"], inputs={"x": "sleep.out"}),
        ]
        run = service.submit({"name": "c", "tasks": tasks})
        wait_until(lambda: run_processes(run["id"]), what="the sleeper to run")
        wait_until(
            lambda: (
                service.client.get(f"/runs/{run['id']}").json()["tasks"]["quick"]["state"] == "done"
            ),
            what="the quick task done",
        )
        assert service.client.post(f"/runs/{run['id']}/cancel").status_code == 200
        assert service.wait(run["id"])["state"] == "cancelled"
        view = service.client.get(f"/runs/{run['id']}").json()
        states = {task: view["tasks"][task]["state"] for task in ("quick", "sleep", "after")}
        assert states == {"quick": "done", "sleep": "cancelled", "after": "skipped"}
    finally:
        stop_service(service)
