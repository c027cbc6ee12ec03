"""The provenance of a source of a run: the git state of its working tree."""

import msgspec


class SourceProvenance(msgspec.Struct, omit_defaults=True):
    """A source of a run: its name, git branch and commit, uncommitted changes (`changed`, the
    porcelain status paths), `diff_sha256` (the tree hash a snapshot of it has), and either the
    working tree it was recorded from (`path`, local mode without a snapshot) or its snapshot
    and the stored patch, both relative to the store root."""

    name: str
    path: str | None = None
    branch: str | None = None
    commit: str | None = None
    dirty: bool = False
    changed: list[str] = msgspec.field(default_factory=list)
    diff_sha256: str | None = None
    snapshot: str | None = None
    patch: str | None = None
