"""The provenance of a source of a run: the git state of its working tree."""

import msgspec


class SourceProvenance(msgspec.Struct, omit_defaults=True):
    """A source of a run: its name, path, git branch and commit, uncommitted changes, snapshot."""

    name: str
    path: str
    branch: str | None = None
    commit: str | None = None
    dirty: bool = False
    changed: list[str] = msgspec.field(default_factory=list)
    diff_sha256: str | None = None
    snapshot: str | None = None
