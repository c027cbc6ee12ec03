"""Identities of the callers of the service, their tokens and the priorities of their runs."""

from __future__ import annotations

import hmac
import os
import stat
from pathlib import Path
from typing import Any

import msgspec
import yaml

from simrun_core.wire import Identity
from simrun_core.workflow import Priority


class TokensError(ValueError):
    """A tokens file that cannot be used; the message names the file and the entry."""


class _IdentityEntry(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    kind: str = "person"
    owner: str | None = None


def load_tokens(path: Path) -> dict[str, Identity]:
    """The identities by token from a YAML mapping `{token: {name, kind, owner}}`.

    A file readable by others than its owner is refused: tokens are secrets.
    """
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as error:
        raise TokensError(f"tokens file {path}: {error.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokensError(
            f"tokens file {path}: mode {stat.S_IMODE(mode):04o} lets others read it; "
            f"run: chmod 600 {path}"
        )
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise TokensError(f"tokens file {path}: not valid YAML: {error}") from None
    if not isinstance(data, dict):
        raise TokensError(f"tokens file {path}: expected a mapping of token to identity")
    tokens: dict[str, Identity] = {}
    for token, value in data.items():
        if not isinstance(token, str) or not token:
            raise TokensError(f"tokens file {path}: a token is empty or not a string")
        try:
            entry = msgspec.convert(value, _IdentityEntry)
        except msgspec.ValidationError as error:
            name = entry_name(value)
            raise TokensError(f"tokens file {path}: identity {name}: {error}") from None
        if entry.kind not in ("person", "agent"):
            raise TokensError(f"tokens file {path}: {entry.name}: kind is person or agent")
        if entry.kind == "agent" and not entry.owner:
            raise TokensError(f"tokens file {path}: agent {entry.name} has no owner")
        owner = entry.owner if entry.kind == "agent" else entry.name
        tokens[token] = Identity(name=entry.name, kind=entry.kind, owner=owner)  # type: ignore[arg-type]
    return tokens


def entry_name(value: Any) -> str:
    """The name of a tokens entry for a message, without the token."""
    return repr(value.get("name")) if isinstance(value, dict) else "an entry"


def write_tokens(path: Path, tokens: dict[str, Identity]) -> None:
    """Write a tokens file, created with mode 0600 before any secret is in it."""
    data = {token: msgspec.to_builtins(identity) for token, identity in tokens.items()}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        yaml.safe_dump(data, file)


def authenticate(tokens: dict[str, Identity], token: str) -> Identity | None:
    """The identity of a token, compared in constant time with every known token."""
    found: Identity | None = None
    given = token.encode()
    for known, identity in tokens.items():
        if hmac.compare_digest(known.encode(), given):
            found = identity
    return found


def may_act_on(identity: Identity, submitted_by: str, run_owner: str, owner: str) -> bool:
    """Whether an identity may cancel or remove a run: the owner of the service any run, a
    person their runs and their agents' runs, an agent its own runs."""
    if identity.kind == "person":
        return identity.name in (owner, run_owner, submitted_by)
    return identity.name == submitted_by


def priority_of(identity: Identity, owner: str) -> Priority:
    """`owner` for the owner and their agents, `standard` for other people, `agent` else."""
    if identity.owner == owner:
        return Priority.OWNER
    return Priority.STANDARD if identity.kind == "person" else Priority.AGENT
