"""The submission of a workflow file with its sources, for `submit`, `estimate` and the MCP tools
alike: the workflow is read and its tasks planned by the `plan` of their types installed here
(`plan_tasks`, which `validate` and `render` share), then the working trees are read
(`Submission`), a bad file, plan or source refused before any service is asked;
`Submission.request` then sends the sources as the policy says (`simrun_cli.snapshots`:
provenance, a snapshot in the mounted store, or an upload)."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from simrun_cli.snapshots import PROVENANCE, SourcePolicy, prepare_sources, send_sources
from simrun_core.errors import WorkflowError
from simrun_core.plugins import (
    PlanError,
    checkable_problems,
    installed_task_types,
    plan_workflow,
)
from simrun_core.provenance import SourceProvenance
from simrun_core.wire import SubmitRequest, ValidationResult
from simrun_core.workflow import (
    SplitMode,
    Workflow,
    checkable_workflow,
    decode_workflow,
    load_workflow,
    load_workflow_data,
)

if TYPE_CHECKING:
    from simrun_cli.client import Client


class Submission:
    """A workflow file and its sources, read and checked; `request` sends the sources."""

    def __init__(
        self,
        workflow: Path,
        sources: list[tuple[str, Path]],
        policy: SourcePolicy = PROVENANCE,
        group: str | None = None,
        single_server: bool = False,
        reserve: str | None = None,
        local_commands: Literal["direct", "docker"] | None = None,
    ) -> None:
        """Read the workflow, plan its tasks (`plan_tasks`: the `plan` of every type installed
        here) and read the working trees of its sources, the model first: the plans run before
        the snapshots are taken.

        Raises:
            WorkflowError: The file cannot be read or is no valid workflow; a `PlanError` when
                the settings of a task cannot be planned. The message names the file.
            SourceError: A source has no name, is given twice or is no git working tree (or
                cannot be snapshotted, when `policy` snapshots).
        """
        model = sources[0][1] if sources else None
        self.workflow = plan_tasks(load_workflow(workflow), model, source=str(workflow))
        self.policy = policy
        self.sources = prepare_sources(sources, policy)
        self.group = group
        self.split = SplitMode.SINGLE_SERVER if single_server else None
        self.reserve = reserve
        self.local_commands = local_commands

    def request(self, client: Client | None = None) -> SubmitRequest:
        """The submission, its sources recorded (snapshots written or uploaded through
        `client`, which an upload needs) first.

        Raises:
            SourceError: A snapshot cannot be written; the message names the source.
            ServiceError: The service refused an upload.
        """
        return SubmitRequest(
            workflow=self.workflow,
            sources=send_sources(self.sources, self.policy, client),
            group=self.group,
            split=self.split,
            reserve=self.reserve,
            local_commands=self.local_commands,
        )


def plan_tasks(
    workflow: Workflow, model: Path | None = None, source: str | None = None
) -> Workflow:
    """The workflow with its tasks planned by the types installed where the client runs
    (`simrun_core.plugins.plan_workflow`): only the entry points of the types it uses are
    imported, and a type that is not installed (or does not load) here is submitted as written.

    `model` is the working tree of the model, first on the path of the imports while the plans
    run, as a task imports from it; what they import from it is forgotten afterwards, so a
    long-lived client (the MCP server) plans with the tree as it is at its next call.

    Raises:
        PlanError: The settings of a task do not decode for its type here, or its plan raised
            (named with its error) or returned no settings; `source`, the file, in front.
    """
    types = installed_task_types(task.type for task in workflow.tasks)
    if not any(task_type.plan for task_type in types.values()):
        return workflow
    with _imports_from(model):
        try:
            return plan_workflow(workflow, types)
        except WorkflowError as error:
            raise type(error)(error.problems, source) from None


@contextlib.contextmanager
def _imports_from(root: Path | None) -> Iterator[None]:
    """`root` first on `sys.path` meanwhile; the modules imported from it forgotten after."""
    if root is None:
        yield
        return
    directory = str(Path(root).expanduser().resolve())
    before = set(sys.modules)
    sys.path.insert(0, directory)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(directory)
        for name in set(sys.modules) - before:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if origin.startswith(directory + "/"):
                del sys.modules[name]


def workflow_problems(
    path: Path, model: Path | None, validate: Callable[[Workflow], ValidationResult]
) -> list[str]:
    """Every problem of a workflow file, as `validate` answers them (without the file in
    front): the file unreadable or no YAML, else its field problems (`decode_workflow`) with
    what the service finds in the rest of it (`checkable_workflow`: a wrong setting named
    with a wrong resource), its tasks planned by the types installed here first (`plan_tasks`,
    whose refusal is the answer). `validate` asks the service (`Client.validate`)."""
    try:
        data = load_workflow_data(path)
    except WorkflowError as error:
        return [problem.text() for problem in error.problems]
    workflow, problems = decode_workflow(data)
    found: list[str] = []
    if workflow is None:  # its structural problems are the service's to find, with the rest
        found = [problem.text() for problem in problems]
        workflow = checkable_workflow(data)
        if workflow is None:
            return found
    try:
        planned = plan_tasks(workflow, model)
    except PlanError as error:
        return [*found, *(problem.text() for problem in error.problems)]
    return [*found, *validate(planned).errors]


def checks_here(workflow: Workflow) -> ValidationResult:
    """The answer `validate` gives for a workflow as far as the task types installed here can
    tell (`simrun_core.plugins.checkable_problems`): its structure and the checks of the tasks
    of those types; a task of another type is left to the service (it may be a type of the
    run's snapshots), and so are the nodes a task must fit on.

    For a workflow `submit --local` refuses while the local service does not run: the refusal
    names what the client can find without starting the service, so a refused workflow writes
    nothing (no `.simrun/`)."""
    import msgspec

    types = installed_task_types(task.type for task in workflow.tasks)
    problems = checkable_problems(msgspec.to_builtins(workflow), types)
    return ValidationResult(ok=not problems, errors=[problem.text() for problem in problems])


def submit_request(
    workflow: Path,
    sources: list[tuple[str, Path]],
    group: str | None = None,
    single_server: bool = False,
    reserve: str | None = None,
    policy: SourcePolicy = PROVENANCE,
    client: Client | None = None,
) -> SubmitRequest:
    """The submission of a workflow file with its sources, the model first, sent as `policy`
    says; `reserve` a node of the cluster the run has to itself (else the workflow's `reserve`).

    Raises:
        WorkflowError: The file cannot be read or is no valid workflow; the message names it.
        SourceError: A source has no name, is given twice or is no git working tree.
        ServiceError: The service refused an upload.
    """
    submission = Submission(workflow, sources, policy, group, single_server, reserve)
    return submission.request(client)


def source_provenance(sources: list[tuple[str, Path]]) -> list[SourceProvenance]:
    """The git provenance of named sources, the model first, nothing copied.

    Raises:
        SourceError: A source has no name, is given twice or is no git working tree.
    """
    return send_sources(prepare_sources(sources, PROVENANCE), PROVENANCE)
