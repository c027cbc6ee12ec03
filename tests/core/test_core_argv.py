"""simrun_core.argv: the argv template of an unsplit task."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simrun_core.argv import TemplateError, expand_argv

SETTINGS = "/store/runs/r/tasks/t/settings.json"
OUT = "/store/runs/r/tasks/t/out"
INPUTS = {"b": "/scratch/b", "a": "/store/runs/r/tasks/src/out/a"}


def expand(*template: str, inputs: dict[str, str] | None = None) -> list[str]:
    return expand_argv(list(template), SETTINGS, OUT, INPUTS if inputs is None else inputs)


def template_error(*template: str, inputs: dict[str, str] | None = None) -> str:
    with pytest.raises(TemplateError) as info:
        expand(*template, inputs=inputs)
    return str(info.value)


def test_settings_and_out() -> None:
    assert expand("run", "--settings={settings}", "{out}", "{out}/log.txt") == [
        "run",
        f"--settings={SETTINGS}",
        OUT,
        f"{OUT}/log.txt",
    ]


def test_input_is_repeated_per_port_sorted_by_port() -> None:
    assert expand("fit", "--input={input}", "--out={out}") == [
        "fit",
        "--input=a=/store/runs/r/tasks/src/out/a",
        "--input=b=/scratch/b",
        f"--out={OUT}",
    ]


def test_input_part_may_hold_other_placeholders() -> None:
    assert expand("{input}@{out}", inputs={"z": "/z", "m": "/m"}) == [
        f"m=/m@{OUT}",
        f"z=/z@{OUT}",
    ]


def test_input_part_is_dropped_without_inputs() -> None:
    assert expand("fit", "--input", "--input={input}", "{settings}", inputs={}) == [
        "fit",
        "--input",
        SETTINGS,
    ]


def test_double_braces_are_literal() -> None:
    assert expand("{{out}}", "a}}b", "{{}}", "{{{out}}}", '--json={{"k": 1}}') == [
        "{out}",
        "a}b",
        "{}",
        "{" + OUT + "}",
        '--json={"k": 1}',
    ]


def test_no_template_no_argv() -> None:
    assert expand() == []


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ("{outdir}", "argument '{outdir}': unknown placeholder {outdir}, "),
        ("--x={}", "argument '--x={}': unknown placeholder {}, "),
        ("{ out}", "argument '{ out}': unknown placeholder { out}, "),
    ],
)
def test_unknown_placeholder_is_refused(part: str, message: str) -> None:
    assert template_error("run", part) == message + "expected {settings}, {out} or {input}"


def test_unclosed_brace_is_refused() -> None:
    assert template_error("--x={out") == "argument '--x={out': '{' at 4 is not closed"


def test_lone_closing_brace_is_refused() -> None:
    assert template_error("a}b") == "argument 'a}b': '}' at 1 has no '{'"


def test_errors_in_an_input_part_are_refused_with_inputs() -> None:
    assert template_error("{input}{bogus}") == (
        "argument '{input}{bogus}': unknown placeholder {bogus}, "
        "expected {settings}, {out} or {input}"
    )


def test_escaped_input_is_a_literal_not_repeated() -> None:
    assert expand("--x={{input}}") == ["--x={input}"]


def test_unknown_placeholder_is_refused_also_without_inputs() -> None:
    with pytest.raises(TemplateError):
        expand("{input}{bogus}", inputs={})


PIECES = st.sampled_from(
    ["{", "}", "{{", "}}", "{settings}", "{out}", "{input}", "{in", "put}", "x", "=", "{}"]
)
PARTS = st.one_of(st.text(max_size=12), st.lists(PIECES, max_size=6).map("".join))


@settings(max_examples=300, deadline=None, database=None)
@given(
    template=st.lists(PARTS, max_size=5),
    inputs=st.dictionaries(st.text(max_size=4), st.text(max_size=6), max_size=3),
)
def test_expand_argv_gives_strings_or_template_error(
    template: list[str], inputs: dict[str, str]
) -> None:
    try:
        argv = expand_argv(template, "S", "O", inputs)
    except TemplateError as error:
        assert str(error).startswith("argument ")
        return
    assert isinstance(argv, list)
    assert all(isinstance(part, str) for part in argv)
    plain = [part for part in template if "{input}" not in part]
    assert len(argv) == len(plain) + len(inputs) * (len(template) - len(plain))
