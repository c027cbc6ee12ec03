"""The `simrun` command line (cyclopts): submit, follow and inspect runs, serve the local service.

Every command talks to the service over HTTP: the one of `SIMRUN_URL` and `SIMRUN_TOKEN`, or with
`--local` the local service of the current directory, started in the background when none runs.
A refusal of the service prints `error: <detail>` to stderr and exits 1; `--json` prints JSON.

The modules only some commands need (the HTTP client, rich tables and live views, the workflow
and its provenance, the local service) are imported by the commands that use them, so `--help`
and a command that prints plain lines start quicker.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any

from cyclopts import App, CycloptsError, Parameter

import simrun_core
from simrun_cli.errors import CliError, check_id
from simrun_cli.formats import format_bytes, format_count, format_duration
from simrun_core.outputs import OUTPUTS_LIMIT
from simrun_core.states import RunState

if TYPE_CHECKING:
    from datetime import datetime

    from rich.console import Console, RenderableType

    from simrun_cli.client import Client
    from simrun_cli.request import Submission
    from simrun_core.errors import WorkflowError
    from simrun_core.wire import RunView, SubmitRequest
    from simrun_core.workflow import Workflow

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_TIMEOUT = 2
EXIT_INTERRUPTED = 130
UNPROCESSABLE = 422
"""The status of a refused workflow, whose detail is its problems, one per line."""

# Whether `main` lets the interpreter end without collecting the objects of the imports: not
# after `serve`, whose service may leave objects whose finalizers should run.
quick_exit = True

app = App(
    name="simrun",
    help="Submit, follow and inspect simulation runs, on the cluster or with --local here.",
    version=simrun_core.__version__,
    default_parameter=Parameter(negative=()),
)


@functools.cache
def _out() -> Console:
    """The console of tables and texts for people (rich is imported on its first use)."""
    from rich.console import Console

    return Console(highlight=False)


@functools.cache
def _err() -> Console:
    """The console of progress bars, on stderr (rich is imported on its first use)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _print_view(renderable: RenderableType) -> None:
    """Print a table or a view for people, without the spaces rich pads its lines with."""
    from simrun_cli.render import Trimmed

    _out().print(Trimmed(renderable))


def connect(local: bool) -> Client:
    """The client of a command: the local service with `--local`, else the one of SIMRUN_URL.

    A command that found the local service running (not the one that started it) starts the
    warm command process of the directory too, if none runs: the commands after it start in a
    few ms (`simrun_cli.warm`).
    """
    with _collector_paused():  # the imports and the probes of the service
        import_http()
        from simrun_cli import warm
        from simrun_cli.connect import connect as connect_client

        # In a fork of the warm process, that process runs already.
        connection = connect_client(local, note_found=not warm.in_fork)
        if connection.found is not None:
            warm.start_warm(connection.found.root, connection.found.pid)
        return connection.client


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection meanwhile, e.g. while the modules of a command are imported:
    imports make many objects that live on and little garbage, and the collections they would
    trigger take a share of the start of a command."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# What httpx and httpcore import when they can, which no command uses: httpx's own command line
# (click, pygments and much of rich), trio and anyio (httpcore's async support under trio and
# asyncio: the commands use the sync client). They take 50-100 ms of the start of a command.
UNUSED_IMPORTS = ("httpx._main", "trio", "anyio")


def import_http() -> None:
    """Import httpx and httpcore without the modules of UNUSED_IMPORTS.

    Both fall back on an ImportError of those (httpx without its command line, httpcore without
    trio), which a None in `sys.modules` raises while they are imported; the None entries are
    removed again. A version of them that cannot do without one is imported as it is.
    """
    if "httpx" in sys.modules:
        return
    blocked = [name for name in UNUSED_IMPORTS if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        import httpcore  # noqa: F401
        import httpx  # noqa: F401
    except ImportError:
        for name in [name for name in sys.modules if name.split(".")[0] in ("httpx", "httpcore")]:
            del sys.modules[name]
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def _run_given(_: Any, value: str | list[str]) -> None:
    """Refuse an empty run id before anything is sent (see `check_id`)."""
    for run in [value] if isinstance(value, str) else value:
        check_id(run)


def _task_given(_: Any, value: str) -> None:
    check_id(value, "task")


RunArg = Annotated[str, Parameter(help="The id of the run.", validator=_run_given)]
TaskArg = Annotated[str, Parameter(help="The id of a task of the run.", validator=_task_given)]
Local = Annotated[
    bool, Parameter(help="Use the local service of the current directory (started if none runs).")
]
AsJson = Annotated[bool, Parameter(name="--json", help="Print JSON instead of tables.")]
SingleServer = Annotated[
    bool, Parameter(help="Place the pieces of every task on one server (split mode).")
]
Reserve = Annotated[
    str | None,
    Parameter(help="NODE: a node of the cluster the run has to itself until it ends."),
]
Snapshot = Annotated[
    bool,
    Parameter(
        help="With --local: copy the sources into snapshots/ of the store as on the cluster "
        "instead of recording their provenance only (without --local they always are)."
    ),
]


def submit(
    workflow: Annotated[Path, Parameter(help="The YAML file of the workflow.")],
    /,
    *,
    source: Annotated[
        list[str] | None,
        Parameter(help="NAME=PATH: a source, a git working tree; repeated, the model first."),
    ] = None,
    group: Annotated[str | None, Parameter(help="The group of the run, e.g. a study.")] = None,
    single_server: SingleServer = False,
    reserve: Reserve = None,
    local: Local = False,
    snapshot: Snapshot = False,
    docker: Annotated[
        bool,
        Parameter(
            help="With --local: run the `command` tasks in their images with `docker run` "
            "(`podman run` without docker) instead of as processes here; refused when "
            "neither is installed."
        ),
    ] = False,
    wait: Annotated[
        bool | None,
        Parameter(
            negative="--no-wait",
            help="Follow the run to its end and exit like `wait` (default with --local).",
        ),
    ] = None,
    timeout: Annotated[
        float | None, Parameter(help="With --wait: give up after this many seconds, exit 2.")
    ] = None,
    as_json: AsJson = False,
) -> int:
    """Submit a workflow with its sources (snapshots, or with --local their provenance only);
    with --wait follow it to its end.

    The settings of a task whose type is installed here and has a `plan` are completed by it
    before the sources are recorded, and the planned settings are submitted; a plan that fails
    refuses the workflow, naming the task and the error."""
    follow = local if wait is None else wait
    if timeout is not None and not follow:
        raise CliError("--timeout limits the wait for the run: it needs --wait")
    if timeout is not None and timeout < 0:
        raise CliError(f"--timeout {timeout:g}: the seconds to wait cannot be negative")
    if docker and not local:
        raise CliError(
            "--docker runs the command tasks of the local service in their images: add --local "
            "(on a cluster every task runs in its image)"
        )
    submission = _submission(workflow, source, local, snapshot, group, single_server, reserve)
    if docker:
        submission.local_commands = "docker"
    with connect(local) as client:
        request = _sent(submission, client)
        with _refusal_of(workflow):
            run = client.submit(request)
        if not follow:
            if as_json:
                _print_json(run)
            else:
                _print_line(f"run {run.id}: {run.state}")
                _print_line(
                    f"follow it to its end: simrun wait {run.id}{' --local' if local else ''}"
                )
            return EXIT_OK
        try:
            return _follow_to_end(client, run.id, timeout, as_json, local)
        except KeyboardInterrupt:
            _note(
                f"stopped following run {run.id}, which goes on: "
                f"simrun wait {run.id}{' --local' if local else ''}"
            )
            return EXIT_INTERRUPTED


def _submission(
    workflow: Path,
    source: list[str] | None,
    local: bool,
    snapshot: bool,
    group: str | None,
    single_server: bool,
    reserve: str | None = None,
) -> Submission:
    """A workflow file and its sources read and checked before any service is asked; the
    sources sent as `simrun_cli.snapshots.source_policy` decides for the command."""
    with _collector_paused():  # the imports, the workflow and the plans of its types
        import_http()
        from simrun_cli.provenance import SourceError, parse_source
        from simrun_cli.request import Submission
        from simrun_cli.snapshots import source_policy
        from simrun_core.errors import WorkflowError

        try:
            sources = [parse_source(option) for option in source or []]
            policy = source_policy(Path.cwd() if local else None, snapshot)
            return Submission(workflow, sources, policy, group, single_server, reserve)
        except SourceError as error:
            raise CliError(str(error)) from None
        except WorkflowError as error:
            model = sources[0][1] if sources else None
            raise CliError(_every_problem(workflow, error, model, local)) from None


def _every_problem(workflow: Path, error: WorkflowError, model: Path | None, local: bool) -> str:
    """The refusal of a workflow file with every problem, one per line: its own problems with
    those the service finds in the rest of it (`simrun_cli.request.workflow_problems`), so a
    wrong setting is named with a wrong resource; the refusal as it is when it is a plan's, or
    when the service cannot be asked. With `--local` a service that does not run is not
    started for a refused workflow (nothing is written): the types installed here check the
    rest (`simrun_cli.request.checks_here`)."""
    from simrun_cli.client import ServiceError, ServiceUnreachable
    from simrun_cli.local import running_service
    from simrun_cli.request import checks_here, workflow_problems
    from simrun_core.plugins import PlanError
    from simrun_core.wire import ValidationResult

    if isinstance(error, PlanError):
        return str(error)
    with contextlib.ExitStack() as stack:

        def ask(planned: Workflow) -> ValidationResult:
            if local and running_service(Path.cwd()) is None:
                return checks_here(planned)
            return stack.enter_context(connect(local)).validate(planned)

        try:
            lines = workflow_problems(workflow, model, ask)
        except (ServiceError, ServiceUnreachable, CliError):
            return str(error)
    return "\n".join(f"{workflow}: {line}" for line in lines) if lines else str(error)


def _sent(submission: Submission, client: Client) -> SubmitRequest:
    """The submission with its sources recorded: snapshots written or uploaded first."""
    from simrun_cli.provenance import SourceError

    try:
        return submission.request(client)
    except SourceError as error:
        raise CliError(str(error)) from None


def estimate(
    workflow: Annotated[Path, Parameter(help="The YAML file of the workflow.")],
    /,
    *,
    source: Annotated[
        list[str] | None,
        Parameter(help="NAME=PATH: a source, a git working tree; repeated, the model first."),
    ] = None,
    single_server: SingleServer = False,
    reserve: Reserve = None,
    local: Local = False,
    snapshot: Snapshot = False,
    as_json: AsJson = False,
) -> int:
    """Show the resources, the plan and the expected duration of every task of a submission;
    the sources are recorded as `submit` records them, a node to reserve planned on as
    `submit --reserve` would (and refused where `submit` would refuse it)."""
    submission = _submission(workflow, source, local, snapshot, None, single_server, reserve)
    with connect(local) as client:
        request = _sent(submission, client)
        with _refusal_of(workflow):
            found = client.estimate(request)
    _show(found, as_json, lambda render: render.estimate_view(found))
    return EXIT_OK


def validate(
    workflow: Annotated[Path, Parameter(help="The YAML file of the workflow.")],
    /,
    *,
    source: Annotated[
        list[str] | None,
        Parameter(
            help="NAME=PATH: a source, a git working tree; the model's is first on the path "
            "of the imports of the plans. Repeated, the model first; nothing is recorded."
        ),
    ] = None,
    local: Local = False,
    as_json: AsJson = False,
) -> int:
    """Check a workflow as `submit` would submit it, without submitting it.

    Its tasks are planned by the `plan` of their types installed here, as `submit` plans them,
    then the service checks it (`POST /validate`). Exit 0 if it would be accepted, else 1 with
    every problem on stderr (with --json `{"ok": false, "errors": [...]}` on stdout, also for a
    file that cannot be read or is no YAML); nothing is recorded."""
    import_http()
    from simrun_cli.provenance import SourceError, parse_source
    from simrun_cli.request import workflow_problems
    from simrun_core.wire import ValidationResult

    try:
        sources = [parse_source(option) for option in source or []]
    except SourceError as error:
        raise CliError(str(error)) from None
    with contextlib.ExitStack() as stack:

        def ask(planned: Workflow) -> ValidationResult:
            return stack.enter_context(connect(local)).validate(planned)

        errors = workflow_problems(workflow, sources[0][1] if sources else None, ask)
    result = ValidationResult(ok=not errors, errors=errors)
    if as_json:
        _print_json(result)
    elif result.ok:
        _print_line(f"{workflow}: valid")
    for line in [] if as_json else result.errors:
        _error(f"{workflow}: {line}")
    return EXIT_OK if result.ok else EXIT_FAILED


def edit(
    workflow: Annotated[
        Path, Parameter(help="The YAML file of the workflow; one that does not exist is new.")
    ],
    /,
    *,
    source: Annotated[
        list[str] | None,
        Parameter(
            help="NAME=PATH: a source, as for submit; recorded when the session opens and at "
            "every run. Repeated, the model first."
        ),
    ] = None,
    group: Annotated[
        str | None, Parameter(help="The group of the runs started from the Editor that name none.")
    ] = None,
    local: Local = False,
    snapshot: Snapshot = False,
) -> int:
    """Serve the Editor of the web app for a workflow file until Ctrl-C: saves go into the
    file, runs use the working trees of the sources as `submit` does."""
    import_http()
    from simrun_cli.edit import EditCommand, printer
    from simrun_cli.edit import edit as serve_edit
    from simrun_cli.provenance import SourceError, parse_source
    from simrun_cli.snapshots import source_policy

    try:
        sources = [parse_source(option) for option in source or []]
        policy = source_policy(Path.cwd() if local else None, snapshot)
        command = EditCommand(workflow, sources, policy, group, lambda: connect(local), printer)
        return serve_edit(command)
    except SourceError as error:
        raise CliError(str(error)) from None


def wait(
    run: RunArg,
    /,
    *,
    timeout: Annotated[
        float | None, Parameter(help="Give up after this many seconds, exit 2 (default: never).")
    ] = None,
    local: Local = False,
    as_json: AsJson = False,
) -> int:
    """Wait for a run to end: exit 0 if it succeeded, 1 if it failed or was cancelled, 2 timed out.

    The service answers a long poll that the command repeats, so no connection is held for hours.
    """
    if timeout is not None and timeout < 0:
        raise CliError(f"--timeout {timeout:g}: the seconds to wait cannot be negative")
    with connect(local) as client:
        item = client.wait(run, timeout)
    if as_json:
        _print_json(item)
    else:
        line = _result_line(item.id, item.state, item.created, item.finished, item.message, timeout)
        _print_line(line)
    return _exit_code(item.id, item.state, item.message, timeout, told=not as_json)


def status(run: RunArg, /, *, local: Local = False, as_json: AsJson = False) -> int:
    """Show the state of a run and of its tasks with their units done."""
    with connect(local) as client:
        _show_run(client.run_json(run), as_json)
    return EXIT_OK


def list_runs(
    *,
    group: Annotated[str | None, Parameter(help="Only the runs of this group.")] = None,
    owner: Annotated[
        str | None, Parameter(help="Only the runs of this person, with the ones of their agents.")
    ] = None,
    agent: Annotated[str | None, Parameter(help="Only the runs of this agent.")] = None,
    state: Annotated[RunState | None, Parameter(help="Only the runs in this state.")] = None,
    local: Local = False,
    as_json: AsJson = False,
) -> int:
    """List the runs, filtered by group, owner, agent and state."""
    with connect(local) as client:
        items = client.runs(group=group, owner=owner, agent=agent, state=state)
    if as_json:
        _print_json(items)
    elif not items:
        _print_line("no runs")
    else:
        from simrun_cli.render import runs_table

        _print_view(runs_table(items))
    return EXIT_OK


def logs(
    run: RunArg,
    task: TaskArg,
    /,
    *,
    tail: Annotated[
        int, Parameter(help="The last lines of the log of every pod, 0 for all.")
    ] = 300,
    local: Local = False,
) -> int:
    """Print the logs of the pods (processes) of a task as text."""
    if tail < 0:
        raise CliError(f"--tail {tail}: the number of lines cannot be negative (0 for all)")
    with connect(local) as client:
        text = client.logs(run, task, tail_lines=tail)
    sys.stdout.write(text)
    sys.stdout.flush()
    return EXIT_OK


def outputs(
    run: RunArg,
    task: TaskArg,
    /,
    *,
    glob: Annotated[
        str | None,
        Parameter(
            help="Only the files whose path below the task's out/ matches this pattern "
            "(`*` also crosses `/`), e.g. 'summary*' or 'squares/*.json'."
        ),
    ] = None,
    limit: Annotated[
        int,
        Parameter(help="The most files to list, 0 for all (--to downloads every matching file)."),
    ] = OUTPUTS_LIMIT,
    to: Annotated[Path | None, Parameter(help="Download the files into this directory.")] = None,
    local: Local = False,
    as_json: AsJson = False,
) -> int:
    """List the output files of a task, the results first, or download them with --to.

    The list names each file by its path relative to the store (`runs/RUN/tasks/TASK/out/...`)
    with its bytes: `summary.json` first, then the files the merge wrote, then the units, at
    most --limit of them and how many more there are (--json: `files` and `left_out`). --to
    extracts the files (those matching --glob) into the directory, by their paths below the
    task's `out/`, and with --json prints the paths written."""
    if limit < 0:
        raise CliError(f"--limit {limit}: the number of files cannot be negative (0 for all)")
    if to is not None:
        from simrun_cli.download import check_target

        check_target(to)
    with connect(local) as client:
        if to is None:
            listing = client.outputs(run, task, glob=glob, limit=limit)
            if as_json:
                _print_json(listing)
                return EXIT_OK
            if not listing.files:
                matching = "" if glob is None else f" matching {glob!r}"
                empty = f"task {task} of run {run} has no output files{matching}"
                _out().print(empty, markup=False)
            else:
                from simrun_cli.render import outputs_table

                _print_view(outputs_table(listing.files))
            if listing.left_out:
                more = format_count(listing.left_out, "more file")
                _note(f"{more} not listed; --limit 0 lists all, --glob PATTERN picks some")
            return EXIT_OK
        files = client.outputs(run, task, glob=glob, limit=0).files
        written = _download(client, run, task, files, to, bar=not as_json, glob=glob)
    if as_json:
        _print_json([str(target) for target, _ in written])
    else:
        total = sum(size for _, size in written)
        summary = f"{format_count(len(written), 'file')}, {format_bytes(total)} to {to}"
        _out().print(summary, markup=False)
    return EXIT_OK


def _download(
    client: Client, run: str, task: str, files: Any, to: Path, bar: bool, glob: str | None
) -> list[tuple[Path, int]]:
    """Download the outputs (those matching `glob`) into `to`, with a progress bar on a
    terminal when `bar`."""
    from simrun_cli.download import archive_size, download_outputs

    if not bar or not sys.stderr.isatty():
        return download_outputs(client, run, task, to, glob=glob)
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    total = archive_size(files)
    done = [0]
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True))
    with Progress(
        *columns, TransferSpeedColumn(), TimeRemainingColumn(), console=_err(), transient=True
    ) as progress:
        shown = progress.add_task(f"{format_count(len(files), 'file')} of {task}", total=total)

        def advance(count: int) -> None:
            done[0] += count
            progress.update(shown, completed=min(done[0], total))

        return download_outputs(client, run, task, to, advance, glob)


def cancel(run: RunArg, /, *, local: Local = False, as_json: AsJson = False) -> int:
    """Cancel a run."""
    with connect(local) as client:
        view = client.cancel(run)
    if as_json:
        _print_json(view)
    else:
        _print_line(f"run {view.id}: {view.state}, cancel requested")
    return EXIT_OK


def compare(
    runs: Annotated[
        list[str],
        Parameter(help="The ids of the runs to put side by side.", validator=_run_given),
    ],
    /,
    *,
    local: Local = False,
    as_json: AsJson = False,
) -> int:
    """Compare runs side by side: their provenance and the summaries of their tasks."""
    if not runs:
        raise CliError("compare needs the ids of the runs: simrun compare RUN RUN...")
    with connect(local) as client:
        table = client.compare(runs)
    _show(table, as_json, lambda render: render.compare_view(table, _out()))
    return EXIT_OK


def cleanup(
    *,
    older_than: Annotated[
        float,
        Parameter(help="Remove the runs which ended this many days ago or earlier (0: all)."),
    ] = 30,
    group: Annotated[str | None, Parameter(help="Only the runs of this group.")] = None,
    failed: Annotated[
        bool, Parameter(help="Only the runs which failed (not the cancelled ones).")
    ] = False,
    dry_run: Annotated[
        bool, Parameter(help="List the runs and snapshots it would remove, remove nothing.")
    ] = False,
    local: Local = False,
    as_json: AsJson = False,
) -> int:
    """Remove ended runs you may remove, then the snapshots no remaining run refers to.

    Of the runs which ended --older-than days ago or earlier (of --group, only --failed ones)
    only those the token may remove are touched, as for a cancel: a person's own and their
    agents', an agent's own, every run for the owner of the service. A run still live is never
    removed, nor a snapshot written within the last hour (a client may be about to submit it).
    Prints the runs and snapshots removed and the bytes freed."""
    if older_than < 0:
        raise CliError(f"--older-than {older_than:g}: the days cannot be negative")
    from simrun_core.wire import CleanupRequest

    request = CleanupRequest(
        older_than_days=older_than, group=group, failed_only=failed, dry_run=dry_run
    )
    with connect(local) as client:
        result = client.cleanup(request)
    _show(result, as_json, lambda render: render.cleanup_view(result, request))
    return EXIT_OK


def usage(*, local: Local = False, as_json: AsJson = False) -> int:
    """Show the bytes of the store per group and per run."""
    with connect(local) as client:
        found = client.usage()
        groups = {} if as_json else {item.id: item.group for item in client.runs()}
    _show(found, as_json, lambda render: render.usage_view(found, groups))
    return EXIT_OK


HISTORY_TAIL = 300


def history(
    run: RunArg,
    /,
    *,
    event_type: Annotated[
        list[str] | None,
        Parameter(
            name="--type", help="Only the events of this type, e.g. task-state; repeated, of any."
        ),
    ] = None,
    task: Annotated[str | None, Parameter(help="Only the events of this task.")] = None,
    tail: Annotated[
        int | None,
        Parameter(
            help=f"The last events only, 0 for all (default: the last {HISTORY_TAIL} in the "
            "table, all with --json)."
        ),
    ] = None,
    local: Local = False,
    as_json: AsJson = False,
) -> int:
    """Show the events of a run: its log, from `submitted` to its end.

    The service filters the log (`GET /runs/{run}/history?type=&task=&tail=`), so a long log
    is not sent whole to show its end.
    """
    if tail is not None and tail < 0:
        raise CliError(f"--tail {tail}: the number of events cannot be negative (0 for all)")
    types = event_type or []
    _check_event_types(types)
    if task is not None:
        check_id(task, "task")
    limit = tail if tail is not None else (None if as_json else HISTORY_TAIL)
    last = None if not limit else limit + 1  # one more: whether earlier ones were left out
    with connect(local) as client:
        events = client.history(run, types, task, last)
    cut = last is not None and len(events) > limit
    if cut:
        events = events[1:]
    if as_json:
        _print_json(events)
        return EXIT_OK
    if not events:
        _out().print(f"run {run} has no events{_filtered(types, task)}", markup=False)
        return EXIT_OK
    from simrun_cli.render import history_table

    _print_view(history_table(events))
    if cut:
        _note(f"the last {format_count(len(events), 'event')} shown; --tail 0 shows all")
    return EXIT_OK


def _check_event_types(types: list[str]) -> None:
    """CliError for a type no event has, naming the types there are."""
    from simrun_core.events import KNOWN_TYPES

    unknown = [name for name in types if name not in KNOWN_TYPES]
    if unknown:
        raise CliError(
            f"--type {unknown[0]}: no event has this type; the types are "
            + ", ".join(sorted(KNOWN_TYPES))
        )


def _filtered(types: list[str], task: str | None) -> str:
    """What `history` chose its events by, for the line that says it found none."""
    parts = []
    if types:
        parts.append("of type " + " or ".join(types))
    if task is not None:
        parts.append(f"of task {task}")
    return (" " + " ".join(parts)) if parts else ""


def replay(
    run: RunArg,
    /,
    *,
    at: Annotated[
        int | None, Parameter(help="The seq of the event to fold up to (default: the last).")
    ] = None,
    local: Local = False,
    as_json: AsJson = False,
) -> int:
    """Show a run as it was after an event: its record folded from its log up to --at."""
    if at is not None and at < 1:
        raise CliError(f"--at {at}: the seq of an event starts at 1")
    with connect(local) as client:
        body = client.run_json(run, at=at)
    if at is not None and (found := _decode_run(body).seq) < at:
        raise CliError(f"--at {at}: run {run} has only {format_count(found, 'event')}")
    _show_run(body, as_json)
    return EXIT_OK


def render(
    workflow: Annotated[Path, Parameter(help="The YAML file of the workflow.")],
    /,
    *,
    argo: Annotated[
        bool, Parameter(help="The Argo Workflow, with its Kueue labels, a submission creates.")
    ] = False,
    slurm: Annotated[
        bool, Parameter(help="The Slurm batch scripts a submission creates, one a worker.")
    ] = False,
    source: Annotated[
        list[str] | None,
        Parameter(help="NAME=PATH: a source, a git working tree; repeated, the model first."),
    ] = None,
    nodes: Annotated[
        Path | None,
        Parameter(
            help="A YAML or JSON list of nodes (name, cores, memory_gb, gpus) to plan on; "
            "default: three of 8 cores and 32 GiB."
        ),
    ] = None,
    settings: Annotated[
        Path | None,
        Parameter(
            help="With --slurm: the service's settings file, its store and slurm: block "
            "(partitions, scratch_path, account, sbatch_options, python); default: their "
            "defaults, the store /shared/simrun/store."
        ),
    ] = None,
    group: Annotated[str | None, Parameter(help="The group of the run, e.g. a study.")] = None,
    single_server: SingleServer = False,
    reserve: Reserve = None,
    as_json: Annotated[bool, Parameter(name="--json", help="Print JSON instead of YAML.")] = False,
) -> int:
    """Print what a submission would create on the cluster, with no service and no cluster:
    planned with the task types installed here, for review and GitOps."""
    if argo == slurm:
        raise CliError("render needs what to render: --argo or --slurm (one of them)")
    if settings is not None and not slurm:
        raise CliError("render: --settings is read with --slurm only")
    if slurm:
        from simrun_cli.rendering import render_slurm, slurm_json, slurm_scripts

        jobs = render_slurm(workflow, source or [], nodes, settings, group, single_server, reserve)
        if as_json:
            _print_json(slurm_json(jobs))
        else:
            _write_raw(slurm_scripts(jobs).encode())
        return EXIT_OK
    from simrun_cli.rendering import render_argo

    manifest = render_argo(workflow, source or [], nodes, group, single_server, reserve)
    if as_json:
        _print_json(manifest)
    else:
        import yaml

        _write_raw(yaml.safe_dump(manifest, sort_keys=False).encode())
    return EXIT_OK


def export(
    workflow: Annotated[Path, Parameter(help="The YAML file of the workflow.")],
    /,
    *,
    cwl: Annotated[
        Path | None, Parameter(help="FILE: write the run as a CWL v1.2 workflow (cwltool, Toil).")
    ] = None,
    source: Annotated[
        list[str] | None,
        Parameter(
            help="NAME=PATH: a source, a git working tree, snapshotted into the store; "
            "repeated, the model first."
        ),
    ] = None,
    store: Annotated[
        Path | None,
        Parameter(
            help="DIR: the run store to prepare the run in, the path every step sees (on "
            "Slurm the shared file system); not a service's store. Default: ./simrun-store."
        ),
    ] = None,
    scratch: Annotated[
        str, Parameter(help="The default local scratch directory of the steps.")
    ] = "/tmp/simrun-scratch",
    nodes: Annotated[
        Path | None,
        Parameter(
            help="A YAML or JSON list of nodes (name, cores, memory_gb, gpus) to plan on, "
            "e.g. those of a Slurm cluster; default: this machine."
        ),
    ] = None,
    group: Annotated[str | None, Parameter(help="The group of the run, e.g. a study.")] = None,
    single_server: SingleServer = False,
    as_json: AsJson = False,
) -> int:
    """Prepare a run in a store without a service and write it for another engine: with --cwl
    a CWL workflow that cwltool runs here and Toil on Slurm; prints the commands that run it."""
    if cwl is None:
        raise CliError("export needs what to write: --cwl FILE")
    from simrun_cli.export import ExportOptions, export_run

    options = ExportOptions(
        workflow=workflow,
        cwl=cwl,
        store=store,
        sources=tuple(source or ()),
        nodes=nodes,
        group=group,
        single_server=single_server,
        scratch=scratch,
    )
    exported = export_run(options)
    if as_json:
        _print_json(exported)
        return EXIT_OK
    tasks = format_count(len(exported.tasks), "task")
    _print_line(f"run {exported.run}: prepared in {exported.store} ({tasks})")
    _print_line(f"wrote {exported.cwl} ({format_count(len(exported.steps), 'step')}); run it here:")
    _print_line(f"  {exported.cwltool}")
    _print_line("or on Slurm, the store on a shared file system every node mounts:")
    _print_line(f"  {exported.toil_slurm}")
    return EXIT_OK


def serve(
    *,
    local: Annotated[
        bool, Parameter(help="The local service of the current directory, tasks as processes.")
    ] = False,
    stop: Annotated[
        bool, Parameter(help="With --local: stop the service of the directory and wait for it.")
    ] = False,
    port: Annotated[
        int | None, Parameter(help="The port (default: a free one; 8000 for SIMRUN_CONFIG).")
    ] = None,
    host: Annotated[
        str | None,
        Parameter(help="The address to listen on (default 127.0.0.1; 0.0.0.0 in a pod)."),
    ] = None,
    idle_exit: Annotated[
        float | None,
        Parameter(help="With --local: exit after this many seconds without requests or runs."),
    ] = None,
) -> int:
    """Run the service in the foreground until stopped; exits 3 if a service holds its store.

    With --local the service of the current directory with the local backend (when it runs
    already: its link and where its token is, exit 0); without it the service of the settings
    SIMRUN_CONFIG names.
    """
    global quick_exit
    quick_exit = False
    if stop:
        if not local:
            raise CliError("--stop stops the local service: simrun serve --local --stop")
        return _stop_local()
    if local:
        if host is not None:
            raise CliError("--host is for the service of SIMRUN_CONFIG; --local binds 127.0.0.1")
        return _serve_local(port, idle_exit)
    if idle_exit is not None:
        raise CliError("--idle-exit is for the local service: add --local")
    try:
        from simrun_api.app import serve_from_config
        from simrun_api.store_lock import StoreLocked
    except ImportError as error:
        raise CliError(f"the service of SIMRUN_CONFIG cannot start here: {error}") from None
    options: dict[str, Any] = {}
    if port is not None:
        options["port"] = port
    if host is not None:
        options["host"] = host
    try:
        serve_from_config(**options)
    except StoreLocked as error:
        from simrun_cli.local import EXIT_SERVICE_RUNNING

        raise CliError(f"{error}", code=EXIT_SERVICE_RUNNING) from None
    except (ValueError, OSError) as error:
        raise CliError(f"the service of SIMRUN_CONFIG cannot start: {error}") from None
    return EXIT_OK


# The commands, registered by their import paths: cyclopts reads the signature of a command (its
# annotations evaluated) only when it runs, not at every start (~15 ms for all of them). Their
# help is their docstring, given here so `--help` lists them without reading every signature.
COMMANDS = (
    "submit",
    "estimate",
    "validate",
    "edit",
    "wait",
    "status",
    "list_runs",
    "logs",
    "outputs",
    "cancel",
    "compare",
    "cleanup",
    "usage",
    "history",
    "replay",
    "render",
    "export",
    "serve",
)
RENAMED = {"list_runs": "list"}
for _command in COMMANDS:
    app.command(
        f"{__name__}:{_command}", name=RENAMED.get(_command), help=globals()[_command].__doc__
    )


def main(argv: list[str] | None = None) -> None:
    """Run the command line and exit with the code of the command.

    A wrong use of the command line exits 1 like any refusal, so exit 2 always means a timeout.
    """
    code = run(sys.argv[1:] if argv is None else argv)
    if quick_exit:
        _end_now(code)
    sys.exit(code)


def run(tokens: list[str]) -> int:
    """The exit code of the command line `tokens`, once its command returned: what `main` ends
    with, and what a fork of the warm command process runs (`simrun_cli.entry`)."""
    try:
        code = app(tokens, result_action="return_value", exit_on_error=False, print_error=True)
    except CycloptsError:
        code = EXIT_FAILED
    except CliError as error:
        _error(error.message)
        code = error.code
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except Exception as error:
        message = _refusal(error)
        if message is None:
            raise
        _error(message)
        code = EXIT_FAILED
    return code if isinstance(code, int) else EXIT_OK


def preload() -> None:
    """Import what the commands import when they run, and resolve the commands registered by
    their import path: done once by the warm command process, so its forks start with them."""
    import io

    from rich.console import Console

    import_http()
    for command in list(app):
        app[command]
    for tokens in ([], ["status"]):  # the modules of help texts: docstrings, markdown
        app.help_print(tokens, console=Console(file=io.StringIO()))


def _end_now(code: int) -> None:
    """End the process with `code` without the interpreter's teardown, which collects and frees
    the objects of every module imported (several ms): the handlers of `atexit` run and the
    streams are flushed first; a command closes its files and clients itself. With another
    thread still running, the interpreter ends as usual (it waits for that thread). `serve`
    always ends as usual (`quick_exit`)."""
    import threading

    if threading.active_count() > 1:
        gc.freeze()  # the final collection skips the objects of the imports
        sys.exit(code)
    run_exit_handlers()
    os._exit(code)


def run_exit_handlers() -> None:
    """What the interpreter does at its end before its teardown: the handlers of `atexit` run,
    stdout and stderr flushed."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def _refusal(error: Exception) -> str | None:
    """The message of an error that ends a command with exit 1: a refusal of the service, a
    service that cannot be reached, a source or a record that cannot be read; None for others.

    The modules are imported here, not at the start: a command that raised one imported it.
    """
    from simrun_cli.client import ServiceError, ServiceUnreachable
    from simrun_cli.provenance import SourceError
    from simrun_core.fold import FoldError

    if isinstance(error, ServiceError):
        return error.detail
    if isinstance(error, (ServiceUnreachable, SourceError, FoldError)):
        return str(error)
    return None


def _follow_to_end(
    client: Client, run_id: str, timeout: float | None, as_json: bool, local: bool = False
) -> int:
    from simrun_cli.follow import Display, LiveLines, PlainLines, failure_lines, follow_run

    display: Display | None = None
    live = not as_json and sys.stdout.isatty()
    if not as_json:
        failure = functools.partial(failure_lines, client, local=local)
        display = LiveLines(_out(), failure) if live else PlainLines(_print_line, failure)
    with display if display is not None else contextlib.nullcontext():
        watch = follow_run(client, run_id, timeout, display)
    run = watch.view
    if as_json:
        body = client.run_json(run_id)
        _write_raw(body)
        run = _decode_run(body)
    elif run is not None:
        line = _result_line(run.id, run.state, run.created, run.finished, run.message, timeout)
        if live:
            _out().print(line, markup=False)
        else:  # the last of the plain lines, printed like them (no rich needed)
            _print_line(line)
    if run is None:
        _note(f"run {run_id}: no event of it arrived" + _within(timeout))
        return EXIT_TIMEOUT
    return _exit_code(run_id, run.state, run.message, timeout, told=not as_json)


def _result_line(
    run_id: str,
    state: RunState,
    created: datetime,
    finished: datetime | None,
    message: str | None,
    timeout: float | None = None,
) -> str:
    """The one line of the end of a wait: the state, how long the run took and its message, or
    that it is still going after `timeout` seconds."""
    if not state.ended:
        return f"run {run_id} is still {state}" + _after(timeout)
    line = f"run {run_id}: {state}"
    if finished is not None:
        line += f" after {format_duration((finished - created).total_seconds())}"
    if message and state is not RunState.SUCCEEDED:
        line += f": {message}"
    return line


def _exit_code(
    run_id: str, state: RunState, message: str | None, timeout: float | None, *, told: bool
) -> int:
    """0 for a run that succeeded, 1 for one that failed or was cancelled, 2 for one not ended.

    Unless `told` (the line of `_result_line` was printed), a note on stderr says why.
    """
    if state is RunState.SUCCEEDED:
        return EXIT_OK
    if state.ended:
        if not told:
            _note(f"run {run_id} {state}" + (f": {message}" if message else ""))
        return EXIT_FAILED
    if not told:
        _note(f"run {run_id} is still {state}" + _after(timeout))
    return EXIT_TIMEOUT


def _after(timeout: float | None) -> str:
    return "" if timeout is None else f" after {format_duration(timeout)}"


def _within(timeout: float | None) -> str:
    return "" if timeout is None else f" within {format_duration(timeout)}"


def _show_run(body: bytes, as_json: bool) -> None:
    if as_json:
        _write_raw(body)
        return
    from simrun_cli.render import status_view

    _print_view(status_view(_decode_run(body)))


def _decode_run(body: bytes) -> RunView:
    """The view of a run the service answered; CliError when this version cannot read it."""
    import msgspec

    from simrun_core.wire import RunView

    try:
        return msgspec.json.decode(body, type=RunView)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise CliError(f"the service answered a run this version cannot read: {error}") from None


def _stop_local() -> int:
    import_http()
    from simrun_cli.local import stop_local

    root = Path.cwd()
    try:
        info = stop_local(
            root,
            stopping=lambda info: _note(
                f"stopping the local service at {info.url} (pid {info.pid}), cancelling its runs"
            ),
        )
    except RuntimeError as error:
        raise CliError(str(error)) from None
    if info is None:
        _print_line(f"no local service runs in {root}")
    else:
        _print_line(f"stopped the local service at {info.url} (pid {info.pid})")
    return EXIT_OK


def _serve_local(port: int | None, idle_exit: float | None) -> int:
    try:
        from simrun_api.auth import TokensError
        from simrun_api.local import ServiceRunning, serve_local
    except ImportError as error:
        raise CliError(f"the local service cannot start here: {error}") from None
    try:
        serve_local(
            Path.cwd(),
            port=port or 0,
            idle_exit_s=idle_exit,
            background=os.environ.get("SIMRUN_BACKGROUND") == "1",
            ready=lambda info: print(
                f"simrun at {info.url}/ui/ (token in .simrun/service.json)", flush=True
            ),
            stopping=lambda what: print(f"stopping: {what}", file=sys.stderr, flush=True),
        )
    except ServiceRunning as error:
        import_http()
        from simrun_cli.local import EXIT_SERVICE_RUNNING, running_service, service_path

        running = running_service(Path.cwd())
        if running is not None:  # where to find it; exit 3 only while it does not answer
            _print_line(f"the local service of {Path.cwd()} runs already (pid {running.pid})")
            _print_line(f"simrun at {running.url}/ui/ (token in {service_path(Path.cwd())})")
            return EXIT_OK
        raise CliError(
            str(error) or f"the local service of {Path.cwd()} runs already",
            code=EXIT_SERVICE_RUNNING,
        ) from None
    except TokensError as error:
        raise CliError(f"the local service cannot start: {error}") from None
    except (RuntimeError, OSError) as error:
        raise CliError(f"the local service stopped: {error}") from None
    return EXIT_OK


def _show(value: Any, as_json: bool, view: Callable[[ModuleType], Any]) -> None:
    """Print `value` as JSON, or the view `view` makes of it with `simrun_cli.render` (imported
    only here: rich is slow to import)."""
    if as_json:
        _print_json(value)
        return
    from simrun_cli import render

    _print_view(view(render))


def _print_json(value: Any) -> None:
    import msgspec

    _write_raw(msgspec.json.encode(value))


def _write_raw(body: bytes) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(body if body.endswith(b"\n") else body + b"\n")
    sys.stdout.buffer.flush()


def _print_line(line: str) -> None:
    print(line, flush=True)


def _error(message: str) -> None:
    """An error for people on stderr: `error: <message>`, each line of it so (a refused
    workflow has a line per problem)."""
    for line in message.splitlines() or [message]:
        print(f"error: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _refusal_of(workflow: Path) -> Iterator[None]:
    """A workflow the service refused (422) as a CliError with the file in front of each of
    its problems: `FILE: task 'ID': field: what is wrong`, the shape of `simrun_core.errors`."""
    from simrun_cli.client import ServiceError

    try:
        yield
    except ServiceError as error:
        if error.status != UNPROCESSABLE:
            raise
        lines = error.detail.splitlines() or [error.detail]
        raise CliError("\n".join(f"{workflow}: {line}" for line in lines)) from None


def _note(message: str) -> None:
    """A note for people on stderr, e.g. why a run failed."""
    print(message, file=sys.stderr, flush=True)
