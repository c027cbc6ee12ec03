"""The argv template of an unsplit task: `{settings}`, `{out}` and the repeated `{input}`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


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
        if "{input}" in part:
            for port in sorted(inputs):
                argv.append(_fill(part, settings, out, f"{port}={inputs[port]}"))
        else:
            argv.append(_fill(part, settings, out, None))
    return argv


def _fill(part: str, settings: str, out: str, input_pair: str | None) -> str:
    values = {"settings": settings, "out": out}
    if input_pair is not None:
        values["input"] = input_pair
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
            if name not in values:
                raise TemplateError(
                    f"argument {part!r}: unknown placeholder {{{name}}}, "
                    "expected {settings}, {out} or {input}"
                )
            result.append(values[name])
            i = end + 1
        elif char == "}":
            raise TemplateError(f"argument {part!r}: '}}' at {i} has no '{{'")
        else:
            result.append(char)
            i += 1
    return "".join(result)
