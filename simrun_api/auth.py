"""Identities of the callers of the service, their tokens and the priorities of their runs.

The tokens file is a YAML mapping `{token: {name, kind, owner}}`. An identity is its name, its
kind and, for an agent, the person it acts for (`simrun_core.wire.Identity`): the file refuses
two entries that would be taken for one another (a person's name used by any other entry, one
agent twice, one token twice). Every refusal of the file names its lines and columns, never
what is written there: the file is all secrets.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
import re
import stat
from collections.abc import Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

import msgspec
import yaml

from simrun_core.wire import Identity
from simrun_core.workflow import Priority

FIELDS = ("name", "kind", "owner")
KINDS = ("person", "agent")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_SYNTAX = re.compile(r"<[a-z ]+>|[^\w\s]{1,3}|\\\w{1,4}")
"""What a YAML error may quote and a message may show: a syntax element (`':'`, `'<stream
end>'`, `'\\t'`); anything else quoted (an alias, a tag) could be part of a token."""


class TokensError(ValueError):
    """A tokens file that cannot be used; the message names the file and the lines, never a
    token or anything else the file holds."""


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One `token: identity` of the file: the values as YAML read them, and where they are."""

    token: Any
    value: Any
    line: int
    field_lines: dict[Any, int]


def load_tokens(path: Path) -> dict[str, Identity]:
    """The identities by token of a tokens file (see the module); TokensError names every
    problem at once.

    A file readable by others than its owner is refused: tokens are secrets.
    """
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as error:
        raise TokensError(f"tokens file {path}: {error.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokensError(
            f"tokens file {path}: mode {stat.S_IMODE(mode):04o} lets others read it; "
            f"run: chmod 600 {path}"
        )
    try:
        text = data.decode()
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise TokensError(f"tokens file {path}: line {line}: not UTF-8 text") from None
    try:
        entries = _entries(text)
    except yaml.YAMLError as error:
        where = _yaml_problem(error, text)
        raise TokensError(f"tokens file {path}: not valid YAML: {where}") from None
    if entries is None:
        raise TokensError(f"tokens file {path}: expected a mapping of token to identity")
    problems: list[str] = []
    tokens: dict[str, Identity] = {}
    lines: dict[str, int] = {}
    for entry in entries:
        identity = _identity(entry, problems)
        if not isinstance(entry.token, str) or not entry.token:
            problems.append(f"line {entry.line}: a token is empty or not a string (quote it)")
        elif entry.token in lines:
            problems.append(f"lines {lines[entry.token]} and {entry.line}: the same token twice")
        elif identity is not None:
            tokens[entry.token] = identity
            lines[entry.token] = entry.line
    problems.extend(_confusions([(lines[token], identity) for token, identity in tokens.items()]))
    if problems:
        raise TokensError(f"tokens file {path}: " + "; ".join(problems))
    return tokens


def _entries(text: str) -> list[_Entry] | None:
    """The entries of the file in their order, None when it is no mapping. YAMLError."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if not isinstance(root, yaml.MappingNode):
            return None
        loader.flatten_mapping(root)
        entries = []
        for key, value in root.value:
            field_lines = {}
            if isinstance(value, yaml.MappingNode):
                field_lines = {
                    loader.construct_object(field, deep=True): field.start_mark.line + 1
                    for field, _ in value.value
                    if isinstance(field, yaml.ScalarNode)
                }
            entries.append(
                _Entry(
                    token=loader.construct_object(key, deep=True),
                    value=loader.construct_object(value, deep=True),
                    line=key.start_mark.line + 1,
                    field_lines=field_lines,
                )
            )
        return entries
    finally:
        loader.dispose()


def _yaml_problem(error: yaml.YAMLError, text: str) -> str:
    """Where the YAML is wrong and what is wrong there, quoting no more of it than syntax."""
    if isinstance(error, yaml.reader.ReaderError):
        line = text[: error.position].count("\n") + 1
        return f"line {line}: a character YAML does not allow"
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    if mark is None:
        return "(the parser gave no position)"
    problem = getattr(error, "problem", None) or getattr(error, "context", None) or "invalid"
    shown = _QUOTED.sub(
        lambda quoted: quoted[0] if _SYNTAX.fullmatch(quoted[0][1:-1]) else "(…)", problem
    )
    return f"line {mark.line + 1}, column {mark.column + 1}: {shown}"


def _identity(entry: _Entry, problems: list[str]) -> Identity | None:
    """The identity of an entry, or None with its problems added to `problems`."""
    value, line = entry.value, entry.line
    if not isinstance(value, dict):
        problems.append(f"line {line}: expected the identity {{name, kind, owner}} of the token")
        return None
    found = len(problems)
    for field, field_line in entry.field_lines.items():
        if field not in FIELDS:
            problems.append(
                f"line {field_line}: an unknown field (the fields are name, kind, owner)"
            )
    name, kind, owner = value.get("name"), value.get("kind", "person"), value.get("owner")
    if not isinstance(name, str) or not name.strip():
        problems.append(f"line {line}: name: a name is required")
    if not isinstance(kind, str) or kind not in KINDS:
        problems.append(f"line {line}: kind: person or agent")
    elif kind == "agent" and (not isinstance(owner, str) or not owner.strip()):
        problems.append(f"line {line}: an agent needs an owner, the person it acts for")
    elif kind == "person" and owner is not None and owner != name:
        problems.append(f"line {line}: a person acts for no one else (leave out owner)")
    if len(problems) > found:
        return None
    return Identity(name=name, kind=kind, owner=owner if kind == "agent" else name)


def _confusions(identities: list[tuple[int, Identity]]) -> Iterator[str]:
    """The pairs of entries that would be taken for one another: a person and any other
    entry of the same name, and one agent (its name and its person) twice."""
    by_name: dict[str, list[tuple[int, Identity]]] = {}
    for line, identity in sorted(identities, key=lambda pair: pair[0]):
        by_name.setdefault(identity.name, []).append((line, identity))
    for same_name in by_name.values():
        for (first, one), (second, other) in combinations(same_name, 2):
            kinds = {one.kind, other.kind}
            if kinds == {"person"}:
                what = "two persons of one name"
            elif kinds == {"person", "agent"}:
                what = "a person and an agent of one name"
            elif one == other:
                what = "one agent of one person twice"
            else:
                continue
            yield f"lines {first} and {second}: {what} would be taken for one another"


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


def may_act_on(identity: Identity, submitter: Identity, owner: str) -> bool:
    """Whether an identity may cancel or remove a run of `submitter`: the person who owns the
    service any run, a person their runs and their agents' runs, an agent its own runs.
    Whole identities are compared, never names: an agent `root` acting for `someone` is
    neither the person `root` nor `root`'s agent."""
    if identity == Identity.person(owner):
        return True
    if identity.kind == "person":
        return identity == submitter.responsible
    return identity == submitter


def priority_of(identity: Identity, owner: str) -> Priority:
    """`owner` for the owner and their agents, `standard` for other people, `agent` else."""
    if identity.responsible == Identity.person(owner):
        return Priority.OWNER
    return Priority.STANDARD if identity.kind == "person" else Priority.AGENT
