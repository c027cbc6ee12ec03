"""Errors of the domain that name what is wrong and where, in one shape.

Every refusal of a workflow is a list of `Problem`s, each written (`Problem.text`) as

    FILE: task 'ID': FIELD: what is wrong

FILE is the file the user gave (none in an answer of the service, which knows no file: the
command line puts it in front), `task 'ID'` the task (`tasks[N]` for an entry without a usable
id), FIELD the field as the user wrote it (`settings.n`, `inputs.x`, `settings.args[0]`,
`resources.memory_per_worker_gb`), or for a problem of the text itself its place
(`line 3, column 7`); a part that does not apply is left out. A `WorkflowError` carries every
problem at once, one line each. This module is the one definition of the shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import msgspec


class Problem(msgspec.Struct, frozen=True, omit_defaults=True):
    """One thing wrong with a workflow: where (task, field) and what."""

    message: str
    task: str | None = None
    index: int | None = None
    field: str | None = None

    def text(self, source: str | None = None) -> str:
        """`FILE: task 'ID': FIELD: message`, without the parts that do not apply; one line
        (a line break written by the user shows as `\\n`)."""
        parts = [source] if source else []
        if self.task is not None:
            parts.append(f"task {self.task!r}")
        elif self.index is not None:
            parts.append(f"tasks[{self.index}]")
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts).replace("\r", "\\r").replace("\n", "\\n")

    def of_task(self, task: str | None, index: int | None = None) -> Problem:
        """The problem located in a task (its id, else its position in `tasks`)."""
        return msgspec.structs.replace(self, task=task, index=None if task else index)

    def key(self) -> Problem:
        """The problem as one of the key of its field, not of the value."""
        return msgspec.structs.replace(self, message=f"a key: {self.message}")

    def under(self, prefix: str) -> Problem:
        """The problem with its field below `prefix`: `n` under `settings` is `settings.n`."""
        return msgspec.structs.replace(self, field=join_field(prefix, self.field))


class WorkflowError(ValueError):
    """A workflow which is not valid: every problem, each naming the task and the field.

    `str()` is the problems one per line, each in the shape above (with `source`, the file,
    in front when known); a plain message is one problem without a location.
    """

    def __init__(self, problems: str | Problem | Iterable[Problem], source: str | None = None):
        if isinstance(problems, str):
            problems = [Problem(problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        self.source = source
        super().__init__("\n".join(problem.text(source) for problem in self.problems))

    def naming(self, source: str) -> WorkflowError:
        """The same problems, written with the file (or other source) they are of."""
        return WorkflowError(self.problems, source)


_PLAIN = re.compile(r"[\w.-]+")


def field_name(key: object) -> str:
    """A key of a mapping as a field: as written when it is a plain name, else quoted."""
    return key if isinstance(key, str) and _PLAIN.fullmatch(key) else repr(key)


def join_field(prefix: str, field: str | None) -> str:
    """A field below another, as written: `settings` + `n` is `settings.n`, + `[0]` `args[0]`."""
    if not field:
        return prefix
    if not prefix:
        return field
    return prefix + field if field.startswith("[") else f"{prefix}.{field}"


_AT = re.compile(r"(?s)(?P<message>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?")
_FIELD_MESSAGES = (
    (re.compile(r"Object missing required field `(?P<name>[^`]*)`"), "missing, it is required"),
    (re.compile(r"Object contains unknown field `(?P<name>[^`]*)`"), "unknown field"),
)


def validation_problem(error: msgspec.ValidationError) -> Problem:
    """The problem of a msgspec error, its `$.a[0].b` path as the field `a[0].b`.

    A missing or unknown field is named as the field itself ("settings.n: missing, it is
    required"); the message starts in lower case, as every message of the shape does.
    """
    match = _AT.fullmatch(str(error))
    assert match is not None  # the pattern matches any text
    message, path = match.group("message"), (match.group("path") or "").lstrip(".")
    for pattern, text in _FIELD_MESSAGES:
        named = pattern.fullmatch(message)
        if named:
            return Problem(text, field=join_field(path, named.group("name")))
    if match.group("key"):
        message = f"a key: {lowercase_first(message)}"
    return Problem(lowercase_first(message), field=path or None)


def lowercase_first(message: str) -> str:
    """`Expected int` as `expected int`; a message starting with a name (`'x' ...`) as it is."""
    if len(message) > 1 and message[0].isupper() and message[1].islower():
        return message[0].lower() + message[1:]
    return message
