"""`simrun-mcp` through the real stdio transport with the SDK's client: the twelve tools on the
local service of a project, the store in every answer, refusals as error results (`isError`)
holding an error object, a workflow written from the schema of `task_types`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from cli_helpers import git, run_simrun, write_squares
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from simrun_cli.local import stop_local
from simrun_cli.mcp import LocalConnection, ServiceConnection

TOOLS = {
    "submit_workflow",
    "wait_for_run",
    "run_status",
    "run_progress",
    "list_runs",
    "compare_runs",
    "cancel_run",
    "run_logs",
    "run_outputs",
    "estimate_workflow",
    "validate_workflow",
    "task_types",
}
CALL_TIMEOUT_S = 90
FOUR_PROBLEMS = (
    "name: four\ntasks:\n"
    "  - id: a\n    type: demo.squares\n"
    "    settings: {n: '100', sleep_s: fast, memry_mb: 3}\n"
    "    resources: {workers: two}\n"
)
"""A workflow of three wrong settings and a wrong resource."""
FOUR_ERRORS = [
    "task 'a': resources.workers: expected `int | null`, got `str`",
    "task 'a': settings: unknown setting 'memry_mb'",
    "task 'a': settings.n: expected `int`, got `str`",
    "task 'a': settings.sleep_s: expected `float`, got `str`",
]


def mcp_command() -> str:
    """The installed `simrun-mcp` console script (the one of this interpreter)."""
    script = Path(sys.executable).parent / "simrun-mcp"
    if not script.exists():
        pytest.fail("the console script simrun-mcp is not installed: pip install -e '.[dev]'")
    return str(script)


Call = tuple[str, dict[str, Any]]


def session(cwd: Path, args: list[str], env: dict[str, str], script: Any) -> Any:
    """Start `simrun-mcp ARGS` in `cwd` on stdio and run `script(call, tools)` with it.

    `call(name, arguments)` answers the structured content of a tool call, which must be a
    success (`refused=True`: an error result); `tools` are the listed tools. Its stderr goes to
    `cwd/mcp.log`.
    """

    async def main() -> Any:
        params = StdioServerParameters(command=mcp_command(), args=args, env=env, cwd=cwd)
        with open(cwd / "mcp.log", "a") as log:
            async with (
                stdio_client(params, errlog=log) as (read, write),
                ClientSession(read, write) as client,
            ):
                await client.initialize()
                listed = (await client.list_tools()).tools

                async def call(
                    name: str, arguments: dict[str, Any], refused: bool = False
                ) -> dict[str, Any]:
                    with anyio.fail_after(CALL_TIMEOUT_S):
                        result = await client.call_tool(name, arguments)
                    assert result.is_error is refused, (name, result.content)
                    assert result.structured_content is not None, result.content
                    text = result.content[0].text  # type: ignore[union-attr]
                    assert json.loads(text) == result.structured_content
                    return result.structured_content

                return await script(call, listed)

    return anyio.run(main)


def workflow_from_schema(types: dict[str, Any], name: str, units: int) -> dict[str, Any]:
    """A workflow of one task of the type `name`, its settings written from what `task_types`
    says of them: every required setting a value of its JSON type (an integer is `units`)."""
    [entry] = [entry for entry in types["task_types"] if entry["name"] == name]
    schema = entry["settings_schema"]
    samples = {"integer": units, "number": 0.0, "string": "x", "boolean": False}
    settings = {key: samples[schema["properties"][key]["type"]] for key in schema["required"]}
    return {"name": "written", "tasks": [{"id": "squares", "type": name, "settings": settings}]}


class Tour:
    """The answers of one session of an agent in a fresh project with `--local`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = str((root / ".simrun" / "store").resolve())
        self.answers: dict[str, Any] = {}
        self.tools: list[Any] = []
        self.cli_four: subprocess.CompletedProcess[str] | None = None


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tour]:
    root = tmp_path_factory.mktemp("agent")
    model = root / "model"
    model.mkdir()
    git(model, "init", "-q", "-b", "main")
    (model / "model.py").write_text("VALUE = 1\n")
    git(model, "add", ".")
    git(model, "commit", "-q", "-m", "first")
    write_squares(root, n=5)
    seen = Tour(root)

    async def script(call: Any, tools: list[Any]) -> None:
        seen.tools = tools
        answers = seen.answers
        answers["estimate"] = await call("estimate_workflow", {"workflow_path": "squares.yaml"})
        sources = {"model": "model"}
        first = await call(
            "submit_workflow",
            {"workflow_path": "squares.yaml", "sources": sources, "group": "agents"},
        )
        answers["submit"] = first
        answers["wait"] = await call("wait_for_run", {"run_id": first["id"], "timeout_s": 60})
        answers["status"] = await call("run_status", {"run_id": first["id"]})
        answers["progress"] = await call("run_progress", {"run_id": first["id"]})
        outputs = {"run_id": first["id"], "task_id": "squares"}
        answers["outputs"] = await call("run_outputs", outputs)
        answers["outputs_two"] = await call("run_outputs", {**outputs, "limit": 2})
        answers["outputs_summary"] = await call("run_outputs", {**outputs, "glob": "summary*"})
        answers["logs"] = await call(
            "run_logs", {"run_id": first["id"], "task_id": "squares", "tail_lines": 0}
        )
        (model / "model.py").write_text("VALUE = 2\n")
        second = await call(
            "submit_workflow",
            {"workflow_path": str(root / "squares.yaml"), "sources": sources, "group": "agents"},
        )
        answers["wait2"] = await call("wait_for_run", {"run_id": second["id"], "timeout_s": 60})
        answers["list"] = await call("list_runs", {"group": "agents"})
        answers["list_failed"] = await call("list_runs", {"state": "failed"})
        answers["compare"] = await call("compare_runs", {"run_ids": [first["id"], second["id"]]})
        answers["cancel_ended"] = await call("cancel_run", {"run_id": first["id"]}, refused=True)
        answers["bad_path"] = await call(
            "submit_workflow", {"workflow_path": "nowhere.yaml"}, refused=True
        )
        answers["bad_source"] = await call(
            "estimate_workflow",
            {"workflow_path": "squares.yaml", "sources": {"model": str(root)}},
            refused=True,
        )
        answers["unknown_run"] = await call(
            "run_status", {"run_id": "20990101-000000-000000"}, refused=True
        )
        (root / "unknown.yaml").write_text(
            yaml.safe_dump({"name": "u", "tasks": [{"id": "t", "type": "no.such.type"}]})
        )
        answers["unknown_type"] = await call(
            "submit_workflow", {"workflow_path": "unknown.yaml"}, refused=True
        )
        answers["types"] = await call("task_types", {})
        written = workflow_from_schema(answers["types"], "demo.squares", units=60)
        (root / "written.yaml").write_text(yaml.safe_dump(written))
        answers["valid"] = await call("validate_workflow", {"workflow_path": "written.yaml"})
        wrong = yaml.safe_load((root / "written.yaml").read_text())
        wrong["tasks"][0]["settings"].update(sleep_s="slow", speed=2)
        (root / "wrong.yaml").write_text(yaml.safe_dump(wrong))
        answers["invalid"] = await call("validate_workflow", {"workflow_path": "wrong.yaml"})
        answers["unreadable"] = await call("validate_workflow", {"workflow_path": "nowhere.yaml"})
        (root / "four.yaml").write_text(FOUR_PROBLEMS)
        answers["four"] = await call("validate_workflow", {"workflow_path": "four.yaml"})
        seen.cli_four = run_simrun("validate", "four.yaml", "--json", "--local", cwd=root)
        third = await call("submit_workflow", {"workflow_path": "written.yaml", "snapshot": False})
        answers["wait3"] = await call("wait_for_run", {"run_id": third["id"], "timeout_s": 60})
        answers["outputs3"] = await call(
            "run_outputs", {"run_id": third["id"], "task_id": "squares"}
        )

    try:
        session(root, ["--local"], {}, script)
        yield seen
    finally:
        stop_local(root, timeout_s=60)


def test_the_twelve_tools_are_described_for_an_agent(tour: Tour) -> None:
    assert {tool.name for tool in tour.tools} == TOOLS
    for tool in tour.tools:
        assert len(tool.description) > 80 and "\n    " not in tool.description, tool.name
    schemas = {tool.name: tool.input_schema for tool in tour.tools}
    assert schemas["submit_workflow"]["required"] == ["workflow_path"]
    assert set(schemas["submit_workflow"]["properties"]) == {
        "workflow_path",
        "sources",
        "group",
        "single_server",
        "reserve",
        "snapshot",
    }
    assert schemas["wait_for_run"]["properties"]["timeout_s"]["default"] == 600
    assert schemas["run_logs"]["properties"]["tail_lines"]["default"] == 300
    assert set(schemas["list_runs"]["properties"]) == {"group", "agent", "state", "owner"}
    assert set(schemas["estimate_workflow"]["properties"]) == {
        "workflow_path",
        "sources",
        "single_server",
        "snapshot",
    }
    assert set(schemas["validate_workflow"]["properties"]) == {"workflow_path", "sources"}
    assert schemas["run_outputs"]["properties"]["limit"]["default"] == 50
    assert "glob" in schemas["run_outputs"]["properties"]


def test_every_answer_carries_the_store(tour: Tour) -> None:
    assert Path(tour.store).is_absolute()
    for name, answer in tour.answers.items():
        assert answer["store"] == tour.store, name


def test_submit_answers_at_once_and_wait_answers_the_end(tour: Tour) -> None:
    submitted = tour.answers["submit"]
    assert submitted["state"] == "submitting" and submitted["group"] == "agents"
    assert submitted["tasks"] == {"squares": "waiting"}
    ended = tour.answers["wait"]
    assert (ended["id"], ended["state"]) == (submitted["id"], "succeeded")
    assert tour.answers["wait2"]["state"] == "succeeded"


def test_status_records_the_provenance_and_progress_the_units(tour: Tour) -> None:
    status = tour.answers["status"]
    [source] = status["sources"]
    assert source["name"] == "model" and source["path"] == str(tour.root / "model")
    assert source["branch"] == "main" and not source.get("dirty"), "omitted when false"
    squares = tour.answers["progress"]["tasks"]["squares"]
    assert (squares["state"], squares["units"], squares["done"]) == ("done", 5, 5)
    assert squares["first_done"] <= squares["last_done"]


def test_outputs_open_below_the_store_and_logs_are_text(tour: Tour) -> None:
    outputs = tour.answers["outputs"]
    paths = [file["path"] for file in outputs["files"]]
    out = outputs["directory"]
    assert paths == [f"{out}/summary.json", *(f"{out}/squares/{index}.json" for index in range(5))]
    assert outputs["left_out"] == 0
    summary = json.loads((Path(tour.store) / out / "summary.json").read_text())
    assert summary["sum"] == sum(i * i for i in range(5))
    for file in outputs["files"]:
        assert (Path(tour.store) / file["path"]).stat().st_size == file["bytes"]
    logs = tour.answers["logs"]
    assert logs["logs"].startswith("==> w0-0.log <==")
    assert (Path(tour.store) / logs["directory"]).is_dir()


def test_outputs_show_the_summary_first_and_at_most_their_limit(tour: Tour) -> None:
    out = tour.answers["outputs"]["directory"]
    two = tour.answers["outputs_two"]
    assert [file["path"] for file in two["files"]] == [
        f"{out}/summary.json",
        f"{out}/squares/0.json",
    ]
    assert two["left_out"] == 4
    summary = tour.answers["outputs_summary"]
    assert [file["path"] for file in summary["files"]] == [f"{out}/summary.json"]
    many = tour.answers["outputs3"]
    assert len(many["files"]) == 50 and many["left_out"] == 61 - 50
    assert many["files"][0]["path"] == f"{many['directory']}/summary.json"


def test_estimate_plans_every_task(tour: Tour) -> None:
    squares = tour.answers["estimate"]["tasks"]["squares"]
    assert squares["plan"]["units"] == 5 and squares["resources"]["source"]


def test_list_finds_the_runs_of_the_group(tour: Tour) -> None:
    listed = [run["id"] for run in tour.answers["list"]["runs"]]
    assert sorted(listed) == sorted([tour.answers["submit"]["id"], tour.answers["wait2"]["id"]])
    assert tour.answers["list_failed"]["runs"] == []


def test_compare_puts_the_runs_side_by_side(tour: Tour) -> None:
    compare = tour.answers["compare"]
    assert "error" not in compare, compare
    rows = compare["rows"]
    assert [row["run"] for row in rows] == [
        tour.answers["submit"]["id"],
        tour.answers["wait2"]["id"],
    ]
    assert rows[0]["model.diff_sha256"] and rows[1]["model.diff_sha256"]
    assert rows[0]["model.diff_sha256"] != rows[1]["model.diff_sha256"]
    assert rows[0]["squares.sum"] == 30


def test_refusals_and_client_errors_are_error_results_holding_an_error_object(
    tour: Tour,
) -> None:
    ended = tour.answers["cancel_ended"]
    assert ended["status"] == 409 and "has ended" in ended["error"]
    bad_path = tour.answers["bad_path"]
    assert bad_path["status"] == 400
    assert (
        str(tour.root / "nowhere.yaml") in bad_path["error"]
        and "cannot be read" in bad_path["error"]
    )
    bad_source = tour.answers["bad_source"]
    assert bad_source["status"] == 400 and "no git working tree" in bad_source["error"]
    unknown = tour.answers["unknown_run"]
    assert unknown["status"] == 404 and "does not exist" in unknown["error"]
    refused = tour.answers["unknown_type"]
    assert refused["status"] == 422 and "no.such.type" in refused["error"]


def test_task_types_describe_the_settings_ports_and_resources_of_each_type(tour: Tour) -> None:
    types = {entry["name"]: entry for entry in tour.answers["types"]["task_types"]}
    squares = types["demo.squares"]
    assert squares["inputs"] == ["after"] and squares["outputs"] == ["squares"]
    assert squares["splittable"] is True
    assert squares["hint"]["memory_per_worker_gb"] == 0.25
    schema = squares["settings_schema"]
    assert schema["required"] == ["n"] and schema["additionalProperties"] is False
    assert "number of units" in schema["properties"]["n"]["description"]
    assert "{out}" in types["command"]["settings_schema"]["properties"]["args"]["description"]
    workflow = tour.answers["types"]["workflow_schema"]
    assert "tasks" in workflow["$defs"]["Workflow"]["properties"]


def test_a_workflow_written_from_the_schema_validates_and_runs(tour: Tour) -> None:
    assert tour.answers["valid"] == {"ok": True, "errors": [], "store": tour.store}
    assert tour.answers["wait3"]["state"] == "succeeded"


def test_validation_answers_every_problem_as_its_result(tour: Tour) -> None:
    invalid = tour.answers["invalid"]
    assert invalid["ok"] is False
    text = "\n".join(invalid["errors"])
    assert "task 'squares': settings.sleep_s" in text and "speed" in text, text
    unreadable = tour.answers["unreadable"]
    assert unreadable["ok"] is False and "cannot be read" in unreadable["errors"][0]


def test_validation_answers_the_problems_simrun_validate_answers(tour: Tour) -> None:
    """Three wrong settings and a wrong resource: all four, as `simrun validate --json`."""
    assert tour.answers["four"] == {"ok": False, "errors": FOUR_ERRORS, "store": tour.store}
    assert tour.cli_four is not None and tour.cli_four.returncode == 1, tour.cli_four
    assert json.loads(tour.cli_four.stdout) == {"ok": False, "errors": FOUR_ERRORS}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_without_a_service_the_answers_are_503_and_400(tmp_path: Path) -> None:
    store = tmp_path / "mnt"
    env = {
        "SIMRUN_URL": f"http://127.0.0.1:{closed_port()}",
        "SIMRUN_TOKEN": "t",
        "SIMRUN_STORE": str(store),
    }

    async def script(call: Any, tools: list[Any]) -> dict[str, Any]:
        return await call("list_runs", {}, refused=True)

    unreachable = session(tmp_path, [], env, script)
    assert unreachable["status"] == 503 and "cannot reach the service" in unreachable["error"]
    assert unreachable["store"] == str(store)
    unset = session(tmp_path, [], {}, script)
    assert unset["status"] == 400 and "SIMRUN_URL" in unset["error"]
    assert unset["store"] is None


def test_snapshot_asks_the_local_service_for_snapshots_as_submit_does(tmp_path: Path) -> None:
    local = LocalConnection(tmp_path)
    assert local.policy(False).mode == "provenance"
    snapshots = local.policy(True)
    assert (snapshots.mode, snapshots.store) == ("store", tmp_path.resolve() / ".simrun" / "store")
    service = ServiceConnection({"SIMRUN_URL": "http://x", "SIMRUN_TOKEN": "t"})
    assert service.policy(False).mode == service.policy(True).mode == "upload"
