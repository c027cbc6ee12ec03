"""`simrun-mcp` through the real stdio transport with the SDK's client: the ten tools on the
local service of a project, the store in every answer, refusals as error objects."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from cli_helpers import git, write_squares
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from simrun_cli.local import stop_local

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
}
CALL_TIMEOUT_S = 90


def mcp_command() -> str:
    """The installed `simrun-mcp` console script (the one of this interpreter)."""
    script = Path(sys.executable).parent / "simrun-mcp"
    if not script.exists():
        pytest.fail("the console script simrun-mcp is not installed: pip install -e '.[dev]'")
    return str(script)


Call = tuple[str, dict[str, Any]]


def session(cwd: Path, args: list[str], env: dict[str, str], script: Any) -> Any:
    """Start `simrun-mcp ARGS` in `cwd` on stdio and run `script(call, tools)` with it.

    `call(name, arguments)` answers the structured content of a tool call; `tools` are the
    listed tools. Its stderr goes to `cwd/mcp.log`.
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

                async def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
                    with anyio.fail_after(CALL_TIMEOUT_S):
                        result = await client.call_tool(name, arguments)
                    assert not result.is_error, result.content
                    assert result.structured_content is not None, result.content
                    text = result.content[0].text  # type: ignore[union-attr]
                    assert json.loads(text) == result.structured_content
                    return result.structured_content

                return await script(call, listed)

    return anyio.run(main)


class Tour:
    """The answers of one session of an agent in a fresh project with `--local`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = str((root / ".simrun" / "store").resolve())
        self.answers: dict[str, Any] = {}
        self.tools: list[Any] = []


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
        answers["outputs"] = await call(
            "run_outputs", {"run_id": first["id"], "task_id": "squares"}
        )
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
        answers["cancel_ended"] = await call("cancel_run", {"run_id": first["id"]})
        answers["bad_path"] = await call("submit_workflow", {"workflow_path": "nowhere.yaml"})
        answers["bad_source"] = await call(
            "estimate_workflow",
            {"workflow_path": "squares.yaml", "sources": {"model": str(root)}},
        )
        answers["unknown_run"] = await call("run_status", {"run_id": "20990101-000000-000000"})

    try:
        session(root, ["--local"], {}, script)
        yield seen
    finally:
        stop_local(root, timeout_s=60)


def test_the_ten_tools_are_described_for_an_agent(tour: Tour) -> None:
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
    }
    assert schemas["wait_for_run"]["properties"]["timeout_s"]["default"] == 600
    assert schemas["run_logs"]["properties"]["tail_lines"]["default"] == 300
    assert set(schemas["list_runs"]["properties"]) == {"group", "agent", "state", "owner"}
    assert set(schemas["estimate_workflow"]["properties"]) == {
        "workflow_path",
        "sources",
        "single_server",
    }


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
    paths = {file["path"] for file in outputs["files"]}
    out = outputs["directory"]
    assert paths == {f"{out}/squares/{index}.json" for index in range(5)} | {f"{out}/summary.json"}
    summary = json.loads((Path(tour.store) / out / "summary.json").read_text())
    assert summary["sum"] == sum(i * i for i in range(5))
    for file in outputs["files"]:
        assert (Path(tour.store) / file["path"]).stat().st_size == file["bytes"]
    logs = tour.answers["logs"]
    assert logs["logs"].startswith("==> w0-0.log <==")
    assert (Path(tour.store) / logs["directory"]).is_dir()


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


def test_refusals_and_client_errors_are_answered_as_error_objects(tour: Tour) -> None:
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
        return await call("list_runs", {})

    unreachable = session(tmp_path, [], env, script)
    assert unreachable["status"] == 503 and "cannot reach the service" in unreachable["error"]
    assert unreachable["store"] == str(store)
    unset = session(tmp_path, [], {}, script)
    assert unset["status"] == 400 and "SIMRUN_URL" in unset["error"]
    assert unset["store"] is None
