"""The submission of a workflow file with its sources, for `submit`, `estimate` and the MCP tools
alike: the workflow and the working trees are read first (`Submission`), a bad file or source
refused before any service is asked; `Submission.request` then sends the sources as the policy
says (`simrun_cli.snapshots`: provenance, a snapshot in the mounted store, or an upload)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from simrun_cli.snapshots import PROVENANCE, SourcePolicy, prepare_sources, send_sources
from simrun_core.provenance import SourceProvenance
from simrun_core.wire import SubmitRequest
from simrun_core.workflow import SplitMode, load_workflow

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
    ) -> None:
        """Read the workflow and the working trees of its sources, the model first.

        Raises:
            WorkflowError: The file cannot be read or is no valid workflow; the message names it.
            SourceError: A source has no name, is given twice or is no git working tree (or
                cannot be snapshotted, when `policy` snapshots).
        """
        self.workflow = load_workflow(workflow)
        self.policy = policy
        self.sources = prepare_sources(sources, policy)
        self.group = group
        self.split = SplitMode.SINGLE_SERVER if single_server else None
        self.reserve = reserve

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
        )


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
