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
) -> SubmitRequest:
    """The submission of a workflow file with the provenance of its sources, the model first.

    Raises:
        WorkflowError: The file cannot be read or is no valid workflow; the message names it.
        SourceError: A source has no name, is given twice or is no git working tree.
    """
    model = load_workflow(workflow)
    provenances: list[SourceProvenance] = []
    for name, path in sources:
        if not name.strip():
            raise SourceError(f"the source of {path} has no name")
        if any(known.name == name for known in provenances):
            raise SourceError(f"the source {name!r} is given twice")
        provenances.append(git_provenance(name, Path(path).expanduser()))
    split = SplitMode.SINGLE_SERVER if single_server else None
    return SubmitRequest(workflow=model, sources=provenances, group=group, split=split)
