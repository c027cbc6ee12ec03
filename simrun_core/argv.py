"""The argv template of an unsplit task: `{settings}`, `{out}` and the repeated `{input}`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

PLACEHOLDERS = frozenset({"settings", "out", "input"})


class TemplateError(ValueError):
    """A template with an unknown placeholder or a brace that is not closed."""


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
                raise TemplateError(f"argument {part!r}: '{{' at {i} is not closed")
            name = part[i + 1 : end]
            if name not in PLACEHOLDERS:
                raise TemplateError(
                    f"argument {part!r}: unknown placeholder {{{name}}}, "
                    "expected {settings}, {out} or {input}"
                )
            pieces.append(("".join(result), None))
            pieces.append(("", name))
            result = []
            i = end + 1
        elif char == "}":
            raise TemplateError(f"argument {part!r}: '}}' at {i} has no '{{'")
        else:
            result.append(char)
            i += 1
    pieces.append(("".join(result), None))
    return pieces
