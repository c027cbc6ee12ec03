"""`simrun-mcp`: the MCP server of simrun, a local stdio process of an agent (the `mcp` SDK 2.x).

The tools go through the HTTP `Client` like the command line: the service of `SIMRUN_URL` with
`SIMRUN_TOKEN`, or with `--local` the local service of the current directory, started when a
tool needs it (and found again when it moved, e.g. after its idle exit). Every answer is a JSON
object with the JSON of the API and `store`, the absolute local path of the store (for `--local`
`.simrun/store` of the directory, else `SIMRUN_STORE`, null without it): paths in the answers
that are relative to the store open as `store / path`. A refusal is an MCP error result
(`isError: true`) whose content is the JSON object `{"error": detail, "status": code, "store":
...}`: the status of the service, 503 when it cannot be reached, 422 for a workflow whose tasks
cannot be planned here (the `plan` of a task type installed here raised: the error names the
task and the error) and 400 for another error on this side (a workflow file that cannot be
read, a source that is no git working tree, the variables not set). `validate_workflow` answers
the problems of a workflow as its result (`ok`, `errors`), not as a refusal.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, TextContent
from pydantic import Field

import simrun_core
from simrun_cli.client import Client, ServiceError, ServiceUnreachable
from simrun_cli.errors import CliError
from simrun_cli.local import ensure_local
from simrun_cli.provenance import SourceError
from simrun_cli.request import submit_request, workflow_problems
from simrun_cli.snapshots import PROVENANCE, SourcePolicy, local_store, source_policy
from simrun_core.errors import WorkflowError
from simrun_core.outputs import OUTPUTS_LIMIT
from simrun_core.plugins import PlanError
from simrun_core.store import RunPaths, output_path
from simrun_core.views import view_item
from simrun_core.wire import SubmitRequest
from simrun_core.workflow import Workflow

SERVICE_UNAVAILABLE = 503
CLIENT_ERROR = 400
UNPROCESSABLE = 422
WAIT_DEFAULT_S = 600.0

INSTRUCTIONS = """\
simrun runs simulation workflows (YAML files of tasks) on a cluster or on this machine, records
every run with the git provenance of its sources, and keeps the outputs in a store.

A typical session: task_types to learn the task types and the JSON Schema of their settings,
validate_workflow to check a workflow file written from them, estimate_workflow to see the plan
and the expected time, submit_workflow (it answers at once with the run id), wait_for_run
(repeat it while the run is not ended), run_progress or run_status on the way, then
run_outputs (the task's summary.json first) and run_logs of a task. Runs of one study share a
`group`: list_runs(group=...) finds them, compare_runs puts their provenance and task summaries
side by side. Every answer carries `store`, the local path of the store: a path in an answer
that is relative to the store opens as `store / path`. A refusal is an error result holding
{"error": ..., "status": ..., "store": ...}: 4xx is a problem of the request (read the error and
fix it), 503 means the service cannot be reached (try again later).
"""

RunId = Annotated[str, Field(description="The id of a run, as submit_workflow or list_runs give.")]
TaskId = Annotated[str, Field(description="The id of a task of the run, as in its workflow.")]
WorkflowPath = Annotated[
    str,
    Field(
        description="The path of the workflow YAML file, absolute or relative to the directory "
        "this server runs in."
    ),
]
Sources = Annotated[
    dict[str, str] | None,
    Field(
        description="The sources of the run: a name to the path of a git working tree, the model "
        'first, e.g. {"model": "/home/me/git/model"}. Their branch, commit and uncommitted '
        "changes are recorded with the run; a service of SIMRUN_URL gets a snapshot of each "
        "(the local service records the working trees only)."
    ),
]
SingleServer = Annotated[
    bool, Field(description="Place the pieces of every task on one server instead of spreading.")
]
Snapshot = Annotated[
    bool,
    Field(
        description="For the local service (simrun-mcp --local): copy the sources into "
        "snapshots of the store and run them in an environment of their own, as `simrun submit "
        "--snapshot` does, instead of recording their provenance only. A service of SIMRUN_URL "
        "always gets snapshots."
    ),
]
StateFilter = Literal["submitting", "queued", "running", "succeeded", "failed", "cancelled"]


class Connection:
    """Where the tools find the service: a client for every call and the store of its answers."""

    store: Path | None

    def policy(self, snapshot: bool) -> SourcePolicy:
        """How the tools send sources, snapshots asked for or not: see
        `simrun_cli.snapshots.source_policy`."""
        return PROVENANCE

    def client(self) -> Client:
        """The client of the service; `Unavailable` or `ClientSide` when there is none."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the client, if one was made."""


class Unavailable(Exception):
    """The service cannot be reached or started: answered with the status 503."""


class ClientSide(Exception):
    """Something on this side is wrong, e.g. a variable is not set: answered with 400."""


class ServiceConnection(Connection):
    """The service of `SIMRUN_URL` with `SIMRUN_TOKEN`; the store is `SIMRUN_STORE` if set."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.url = env.get("SIMRUN_URL", "").strip()
        self.token = env.get("SIMRUN_TOKEN", "").strip()
        store = env.get("SIMRUN_STORE", "").strip()
        self.store = Path(store).expanduser().resolve() if store else None
        self._policy = source_policy(None, environ=env)
        self._client: Client | None = None
        self._lock = threading.Lock()

    def policy(self, snapshot: bool) -> SourcePolicy:
        """Snapshots always: written into `SIMRUN_STORE`, else uploaded."""
        return self._policy

    def client(self) -> Client:
        given = (("SIMRUN_URL", self.url), ("SIMRUN_TOKEN", self.token))
        missing = [name for name, value in given if not value]
        if missing:
            raise ClientSide(
                f"{' and '.join(missing)} not set in the environment of simrun-mcp: register the "
                "server with SIMRUN_URL (the address of the service) and SIMRUN_TOKEN (the token "
                "of this agent), or start it with --local for the local service of a directory"
            )
        with self._lock:
            if self._client is None:
                self._client = Client(self.url, self.token)
            return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


class LocalConnection(Connection):
    """The local service of a project directory, started or found again at every call."""

    def __init__(self, root: Path, warn: Callable[[str], None] | None = None) -> None:
        self.root = Path(root).resolve()
        self.store = local_store(self.root)
        self._warn = warn
        self._client: Client | None = None
        self._where: tuple[str, str] | None = None
        self._lock = threading.Lock()

    def policy(self, snapshot: bool) -> SourcePolicy:
        """The provenance of the sources, or with `snapshot` snapshots in the local store."""
        return source_policy(self.root, snapshot)

    def _locate(self) -> tuple[str, str]:
        try:
            info = ensure_local(self.root, warn=self._warn)
        except RuntimeError as error:
            raise Unavailable(
                f"the local service of {self.root} is not available: {error}"
            ) from None
        return info.url, info.token

    def client(self) -> Client:
        with self._lock:
            where = self._locate()
            if self._client is None or where != self._where:
                if self._client is not None:
                    self._client.close()
                self._client = Client(*where, relocate=self._locate)
                self._where = where
            return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


Answer = Annotated[CallToolResult, dict[str, Any]]
"""What a tool answers: a JSON object, as structured content and as its text; a refusal is an
error result (`isError`) holding `{"error", "status", "store"}`."""


def build_server(connection: Connection) -> MCPServer:
    """The MCP server whose twelve tools call the service of `connection`.

    Every answer carries `store` (`connection.store` as a string, or null).
    """
    store = None if connection.store is None else str(connection.store)
    server = MCPServer(
        "simrun",
        title="simrun",
        instructions=INSTRUCTIONS,
        version=simrun_core.__version__,
        log_level="WARNING",
    )

    def tool(fn: Callable[..., Answer]) -> Callable[..., Answer]:
        """Register a tool, its docstring (dedented) as its description for the agent."""
        server.add_tool(fn, description=inspect.cleandoc(fn.__doc__ or ""))
        return fn

    def answer(call: Callable[[Client], dict[str, Any]]) -> Answer:
        try:
            return _result({**call(connection.client()), "store": store})
        except ServiceError as error:
            refusal = {"error": error.detail, "status": error.status}
        except (ServiceUnreachable, Unavailable) as error:
            refusal = {"error": str(error), "status": SERVICE_UNAVAILABLE}
        except PlanError as error:
            refusal = {"error": str(error), "status": UNPROCESSABLE}
        except (ClientSide, CliError, WorkflowError, SourceError) as error:
            refusal = {"error": str(error), "status": CLIENT_ERROR}
        return _result({**refusal, "store": store}, refused=True)

    @tool
    def submit_workflow(
        workflow_path: WorkflowPath,
        sources: Sources = None,
        group: Annotated[
            str | None,
            Field(description="The group of the run, e.g. a study or the id a main agent gave."),
        ] = None,
        single_server: SingleServer = False,
        reserve: Annotated[
            str | None,
            Field(description="A node of the cluster the run has to itself until it ends."),
        ] = None,
        snapshot: Snapshot = False,
    ) -> Answer:
        """Submit a workflow: record the git state of its sources and start a run.

        The settings of a task whose type is installed where this server runs and has a `plan`
        are completed by it first (e.g. the units from the model), and the planned settings are
        submitted; a plan that fails refuses the workflow (status 422, naming the task and the
        error). Answers at once with the summary of the run in the state `submitting` (`id`,
        `state`, `tasks` and their states, `group`, ...); follow it with wait_for_run,
        run_progress or run_status. Check a workflow first with estimate_workflow when its cost
        is unknown.
        """

        def call(client: Client) -> dict[str, Any]:
            policy = connection.policy(snapshot)
            request = _request(
                workflow_path, sources, group, single_server, reserve, policy, client
            )
            return _builtins(view_item(client.submit(request)))

        return answer(call)

    @tool
    def wait_for_run(
        run_id: RunId,
        timeout_s: Annotated[
            float, Field(ge=0, description="Seconds to wait at most (600 by default).")
        ] = WAIT_DEFAULT_S,
    ) -> Answer:
        """Wait for a run to end, at most `timeout_s` seconds.

        Answers the summary of the run: `state` is `succeeded`, `failed` or `cancelled` once it
        ended (`message` says why a run failed), else still `queued` or `running` after the
        timeout, with `progress` from 0 to 1; call it again then. A connection lost on the way
        is retried until the timeout.
        """
        return answer(lambda client: _builtins(client.wait(run_id, timeout_s)))

    @tool
    def run_status(run_id: RunId) -> Answer:
        """The full record of a run: its state, every task (in `tasks`) with its state, units
        done, message, plan (pods, cores, memory and where it comes from) and workers (`pods`:
        server, attempt, exit code, kills for memory, peak memory), the provenance of its sources
        (branch, commit, uncommitted files, tree hash, the snapshot and the patch below the store
        when they were copied), who submitted it, when, and why it failed. Use run_progress for
        a lighter view while it runs."""
        return answer(lambda client: msgspec.json.decode(client.run_json(run_id)))

    @tool
    def run_progress(run_id: RunId) -> Answer:
        """The progress of every task of a run: its state, for a split task its `units` and
        units `done`, the `counts` of its ledger (`pending`, `claimed` by a worker, `done`,
        `total`), its `first` and `last` progress lines (the first and the last unit done:
        `index`, `worker`, `seconds`, `time`), and the message of a failure. Cheap: call it to
        see how far a run is and whether a task is stuck (units claimed, none done lately)."""
        return answer(lambda client: _builtins(client.progress(run_id)))

    @tool
    def list_runs(
        group: Annotated[str | None, Field(description="Only the runs of this group.")] = None,
        agent: Annotated[str | None, Field(description="Only the runs of this agent.")] = None,
        state: Annotated[StateFilter | None, Field(description="Only runs in this state.")] = None,
        owner: Annotated[
            str | None,
            Field(description="Only the runs of this person, with the ones of their agents."),
        ] = None,
    ) -> Answer:
        """The runs, newest first, filtered by group, agent, state and owner.

        Answers `runs`: the summary of each (`id`, `state`, `workflow`, `group`, `agent`,
        `created`, `progress` of a live run). Use it to find the runs of a group, also while
        they run, before compare_runs.
        """
        return answer(
            lambda client: {
                "runs": _builtins(client.runs(group=group, owner=owner, agent=agent, state=state))
            }
        )

    @tool
    def compare_runs(
        run_ids: Annotated[
            list[str], Field(min_length=1, description="The ids of the runs to compare.")
        ],
    ) -> Answer:
        """Runs side by side: a row per run with `run`, `group`, `agent`, `state`, per source
        its changed files (git status lines such as `M model.py`), the hash of its tree and its
        snapshot (below the store) when it has one, and every value of the `summary.json` of
        every task as `<task>.<key>`. Answers `columns` and `rows`. Use it to pick the best
        variant of a group and find its provenance."""
        return answer(lambda client: _builtins(client.compare(run_ids)))

    @tool
    def cancel_run(run_id: RunId) -> Answer:
        """Cancel a live run: its processes are stopped; its running tasks end `cancelled`,
        the ones that had not begun `skipped`, the ones done stay `done`.

        Answers the summary of the run once the cancel is recorded (it becomes `cancelled`
        shortly after; wait_for_run shows the end). A run that ended is refused with 409.
        """
        return answer(lambda client: _builtins(view_item(client.cancel(run_id))))

    @tool
    def run_logs(
        run_id: RunId,
        task_id: TaskId,
        tail_lines: Annotated[
            int, Field(ge=0, description="The last lines of each process (300; 0 for all).")
        ] = 300,
    ) -> Answer:
        """The logs of the processes (pods) of a task, the last `tail_lines` of each, under a
        `==> <worker>-<attempt>.log <==` line per process. Answers `logs` (the text) and
        `directory`, where they are below the store. Read them when a task failed."""

        def call(client: Client) -> dict[str, Any]:
            text = client.logs(run_id, task_id, tail_lines=tail_lines)
            directory = RunPaths(Path(), run_id).logs(task_id)
            return {"run": run_id, "task": task_id, "directory": str(directory), "logs": text}

        return answer(call)

    @tool
    def run_outputs(
        run_id: RunId,
        task_id: TaskId,
        glob: Annotated[
            str | None,
            Field(
                description="Only the files whose path below the task's out/ matches this "
                "pattern (`*` also crosses `/`), e.g. `summary*` or `results/*.csv`."
            ),
        ] = None,
        limit: Annotated[
            int, Field(ge=0, description=f"The most files to list ({OUTPUTS_LIMIT}; 0 for all).")
        ] = OUTPUTS_LIMIT,
    ) -> Answer:
        """The output files of a task, the results first: `files` with each `path` relative to
        the store and its `bytes`, `summary.json` (the summary of the task) first, then the
        files its merge wrote, then the many files of its units; at most `limit` of those
        matching `glob`, and `left_out`, how many more match. `directory` is the output
        directory of the task below the store. Open a file as `store / path`."""

        def call(client: Client) -> dict[str, Any]:
            listing = client.outputs(run_id, task_id, glob=glob, limit=limit)
            return {
                "run": run_id,
                "task": task_id,
                "directory": output_path(run_id, task_id),
                "files": _builtins(listing.files),
                "left_out": listing.left_out,
            }

        return answer(call)

    @tool
    def estimate_workflow(
        workflow_path: WorkflowPath,
        sources: Sources = None,
        single_server: SingleServer = False,
        snapshot: Snapshot = False,
    ) -> Answer:
        """The plan and the expected duration of every task of a submission, without running
        it: `tasks`, by task id, with its `resources` (cores, memory, seconds per unit and where
        they come from: a plugin hint or what past runs taught), its `plan` (pods, processes,
        units) and the expected `seconds` (null for an unsplit task, or before any run taught
        the seconds of a unit). The tasks are planned by the `plan` of their types installed
        here first, as submit_workflow plans them."""

        def call(client: Client) -> dict[str, Any]:
            policy = connection.policy(snapshot)
            request = _request(workflow_path, sources, None, single_server, None, policy, client)
            return {"tasks": _builtins(client.estimate(request))}

        return answer(call)

    @tool
    def validate_workflow(workflow_path: WorkflowPath, sources: Sources = None) -> Answer:
        """Check a workflow file as submit_workflow would submit it, without submitting it:
        its tasks are planned by the `plan` of their types installed here (the first source,
        the model, on the path of their imports), then the service checks it. Answers `ok`
        and `errors`, every problem at once, each naming the task and the field (`task 'fit':
        settings.n: expected int, got str`); a file that cannot be read or is no YAML is a
        problem too. Nothing is recorded. Learn the types and their settings with task_types."""

        def call(client: Client) -> dict[str, Any]:
            model = next(iter((sources or {}).values()), None)
            errors = workflow_problems(
                _absolute(workflow_path),
                None if model is None else _absolute(model),
                client.validate,
            )
            return {"ok": not errors, "errors": errors}

        return answer(call)

    @tool
    def task_types() -> Answer:
        """What a workflow can hold: `task_types`, each type the service runs with its
        `description`, its `settings_schema` (the JSON Schema of the `settings` of a task of
        the type, with the description of each setting; a `readOnly` one is set by the type's
        plan), its `inputs` and `outputs` ports, whether it is `splittable` into units, and
        its `hint`, the default resources (memory base and per process in GiB, scratch, GPUs)
        until past runs teach them; and `workflow_schema`, the JSON Schema of a workflow file.
        A workflow file is YAML: `name`, then `tasks`, each with an `id`, a `type`, its
        `settings` and its `inputs` (an input port to `<task>.<output port>` of another task),
        e.g. `{name: sq, tasks: [{id: squares, type: demo.squares, settings: {n: 10}}]}`."""

        def call(client: Client) -> dict[str, Any]:
            return {
                "task_types": _builtins(client.task_types()),
                "workflow_schema": msgspec.json.schema(Workflow),
            }

        return answer(call)

    return server


def _result(value: dict[str, Any], refused: bool = False) -> CallToolResult:
    """A tool's answer: the object as structured content and as its JSON text; a refusal is an
    error result, so an agent (and its client) cannot take it for a success."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=value, is_error=refused
    )


def _request(
    workflow_path: str,
    sources: dict[str, str] | None,
    group: str | None,
    single_server: bool,
    reserve: str | None = None,
    policy: SourcePolicy = PROVENANCE,
    client: Client | None = None,
) -> SubmitRequest:
    """The submission of a workflow file, its paths relative to the current directory, its
    sources sent as `policy` says (snapshots uploaded through `client`)."""
    named = [(name, _absolute(path)) for name, path in (sources or {}).items()]
    workflow = _absolute(workflow_path)
    return submit_request(workflow, named, group, single_server, reserve, policy, client)


def _absolute(path: str) -> Path:
    """A path of an agent, `~` expanded, relative to the current directory: errors name it whole."""
    return Path.cwd() / Path(path).expanduser()


def _builtins(value: Any) -> Any:
    """A struct (or a list or dict of them) as the JSON of the API."""
    return msgspec.to_builtins(value)


def main(argv: list[str] | None = None) -> None:
    """Run the server on stdio: `simrun-mcp` for `SIMRUN_URL`, `--local` for this directory."""
    parser = argparse.ArgumentParser(
        prog="simrun-mcp",
        description="The MCP server of simrun on stdio, for an agent.",
    )
    parser.add_argument(
        "--local",
        action="store_true",
        help="use the local service of the current directory (started when a tool needs it) "
        "instead of SIMRUN_URL",
    )
    args = parser.parse_args(argv)
    connection: Connection
    if args.local:
        connection = LocalConnection(Path.cwd(), warn=_stderr)
    else:
        connection = ServiceConnection()
        try:
            connection.client()
        except ClientSide as error:
            _stderr(f"simrun-mcp: {error}")
    try:
        build_server(connection).run("stdio")
    finally:
        connection.close()


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
