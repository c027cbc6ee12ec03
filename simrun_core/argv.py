"""The argv template of an unsplit task: `{settings}`, `{out}` and the repeated `{input}`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

PLACEHOLDERS = frozenset({"settings", "out", "input"})
ESCAPE = "write {{ and }} for a literal brace, e.g. ${{HOME}} for ${HOME}"
"""How to pass a brace through: `{{` and `}}` are the only escapes of a template."""


class TemplateError(ValueError):
    """A template with an unknown placeholder or a brace that is not closed: `argument PART:
    REASON`, the reason also alone (`reason`)."""

    def __init__(self, part: str, reason: str) -> None:
        super().__init__(f"argument {part!r}: {reason}")
        self.part = part
        self.reason = reason


def expand_argv(
    template: Sequence[str], settings: str, out: str, inputs: Mapping[str, str]
) -> list[str]:
    """Fill an argv template.

    `{settings}` is the settings file, `{out}` the output directory; a part with `{input}` is
    repeated once per input port, sorted by port, with `{input}` replaced by `port=path`, and
    dropped without inputs. `{{` and `}}` are literal braces.
    """
    argv: list[str] = []
    for part in template:
        pieces = _parse(part)
        if any(name == "input" for _, name in pieces):
            for port in sorted(inputs):
                argv.append(_fill(pieces, settings, out, f"{port}={inputs[port]}"))
        else:
            argv.append(_fill(pieces, settings, out, ""))
    return argv


def template_problems(
    template: Sequence[str], ports: Iterable[str]
) -> list[tuple[int | None, str]]:
    """Why an argv template cannot start a process for a task with these input ports, checked
    before the task runs: each part's bad placeholder or brace, or NUL character (with the index
    of the part), an argv that is empty once expanded (index None) or an empty program (0).
    """
    problems: list[tuple[int | None, str]] = []
    for index, part in enumerate(template):
        if "\0" in part:
            problems.append((index, "holds a NUL character, which no argument can"))
            continue
        try:
            _parse(part)
        except TemplateError as error:
            problems.append((index, f"{error.reason}; {ESCAPE}"))
    if problems:
        return problems
    argv = expand_argv(template, "settings", "out", {port: port for port in ports})
    if not template:
        problems.append((None, "empty: a command needs at least the program to run"))
    elif not argv:
        problems.append(
            (None, "every part holds {input} and the task has no inputs: nothing to run")
        )
    elif not argv[0]:
        problems.append((0, "the program to run is empty"))
    return problems


def _fill(pieces: list[tuple[str, str | None]], settings: str, out: str, pair: str) -> str:
    values = {"settings": settings, "out": out, "input": pair}
    return "".join(text if name is None else values[name] for text, name in pieces)


def _parse(part: str) -> list[tuple[str, str | None]]:
    """The literal texts (name None) and placeholders of an argument; TemplateError if bad."""
    pieces: list[tuple[str, str | None]] = []
    result: list[str] = []
    i = 0
    while i < len(part):
        char = part[i]
        if part.startswith("{{", i) or part.startswith("}}", i):
            result.append(char)
            i += 2
        elif char == "{":
            end = part.find("}", i)
            if end < 0:
                raise TemplateError(part, f"'{{' at {i} is not closed")
            name = part[i + 1 : end]
            if name not in PLACEHOLDERS:
                raise TemplateError(
                    part,
                    f"unknown placeholder {{{name}}}, expected {{settings}}, {{out}} or {{input}}",
                )
            pieces.append(("".join(result), None))
            pieces.append(("", name))
            result = []
            i = end + 1
        elif char == "}":
            raise TemplateError(part, f"'}}' at {i} has no '{{'")
        else:
            result.append(char)
            i += 1
    pieces.append(("".join(result), None))
    return pieces
