"""The submission of a workflow file with the git provenance of its sources, for `submit`,
`estimate` and the MCP tools alike."""

from __future__ import annotations

from pathlib import Path

from simrun_cli.provenance import SourceError, git_provenance
from simrun_core.provenance import SourceProvenance
from simrun_core.wire import SubmitRequest
from simrun_core.workflow import SplitMode, load_workflow


def submit_request(
    workflow: Path,
    sources: list[tuple[str, Path]],
    group: str | None = None,
    single_server: bool = False,
    reserve: str | None = None,
) -> SubmitRequest:
    """The submission of a workflow file with the provenance of its sources, the model first;
    `reserve` a node of the cluster the run has to itself (else the workflow's `reserve`).

    Raises:
        WorkflowError: The file cannot be read or is no valid workflow; the message names it.
        SourceError: A source has no name, is given twice or is no git working tree.
    """
    model = load_workflow(workflow)
    return SubmitRequest(
        workflow=model,
        sources=source_provenance(sources),
        group=group,
        split=SplitMode.SINGLE_SERVER if single_server else None,
        reserve=reserve,
    )


def source_provenance(sources: list[tuple[str, Path]]) -> list[SourceProvenance]:
    """The git provenance of named sources, the model first.

    Raises:
        SourceError: A source has no name, is given twice or is no git working tree.
    """
    provenances: list[SourceProvenance] = []
    for name, path in sources:
        if not name.strip():
            raise SourceError(f"the source of {path} has no name")
        if any(known.name == name for known in provenances):
            raise SourceError(f"the source {name!r} is given twice")
        provenances.append(git_provenance(name, Path(path).expanduser()))
    return provenances
