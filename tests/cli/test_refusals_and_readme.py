"""The README's demo and every example end to end, and each invalid workflow refused by
`submit --local` with every problem in the one shape `FILE: task 'ID': field: what is wrong`."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_simrun

REPO = Path(__file__).resolve().parents[2]

SQ = "type: demo.squares, settings: {n: 2}"
CMD = "type: command, settings: {image: i, cores: 1, memory_gb: 0.5, args:"
ESCAPE = "write {{ and }} for a literal brace, e.g. ${{HOME}} for ${HOME}"
PLACEHOLDER = "unknown placeholder {%s}, expected {settings}, {out} or {input}; " + ESCAPE
INVALID = {
    "cycle": (
        f"  - {{id: a, {SQ}, inputs: {{after: b.squares}}}}\n"
        f"  - {{id: b, {SQ}, inputs: {{after: a.squares}}}}\n",
        ["the inputs of tasks 'a', 'b' form a cycle"],
    ),
    "duplicate": (f"  - {{id: a, {SQ}}}\n  - {{id: a, {SQ}}}\n", ["task 'a': id: used twice"]),
    "unknown-type": (
        "  - {id: a, type: no.such, settings: {}}\n",
        ["task 'a': type: unknown task type 'no.such' (known: command, demo.squares)"],
    ),
    "unknown-setting": (
        "  - {id: a, type: demo.squares, settings: {n: 2, nn: 3}}\n",
        ["task 'a': settings: unknown setting 'nn'"],
    ),
    "unknown-input": (
        f"  - {{id: a, {SQ}, inputs: {{after: ghost.out}}}}\n",
        ["task 'a': inputs.after: names unknown task 'ghost'"],
    ),
    "bad-id": (f"  - {{id: Scan_1, {SQ}}}\n", ["task 'Scan_1': id: must match [a-z][a-z0-9-]*"]),
    "unknown-port": (
        f"  - {{id: a, {SQ}}}\n  - {{id: b, {SQ}, inputs: {{x: a.squares}}}}\n",
        ["task 'b': inputs.x: no input port of 'demo.squares' (its input ports: after)"],
    ),
    "empty-args": (
        f"  - {{id: a, {CMD} []}}}}\n",
        ["task 'a': settings.args: empty: a command needs at least the program to run"],
    ),
    "unknown-placeholder": (
        f"  - {{id: a, {CMD} [cp, x, '{{output}}']}}}}\n",
        ["task 'a': settings.args[2]: " + PLACEHOLDER % "output"],
    ),
    "shell-syntax": (
        f"  - {{id: a, {CMD} [sh, -c, 'echo ${{1#*=}}']}}}}\n",
        ["task 'a': settings.args[2]: " + PLACEHOLDER % "1#*="],
    ),
    "absurd-count": (
        "  - {id: a, type: demo.squares, settings: {n: 100000000000000000000000000000}}\n",
        [
            "task 'a': settings: 100,000,000,000,000,000,000,000,000,000 units, more than the "
            "10,000,000 a task may have (MAX_UNITS)"
        ],
    ),
    "every-error-at-once": (
        f"  - {{id: a, {CMD} []}}}}\n"
        "  - {id: b, type: demo.squares, settings: {n: 0}}\n"
        "  - {id: c, type: demo.squares, settings: {n: many}, inputs: {x: a.out}}\n",
        [
            "task 'a': settings.args: empty: a command needs at least the program to run",
            "task 'b': settings: 0 units, at least 1 needed",
            "task 'c': settings.n: expected `int`, got `str`",
            "task 'c': inputs.x: no input port of 'demo.squares' (its input ports: after)",
        ],
    ),
    "settings-and-resources-at-once": (
        "  - id: a\n    type: demo.squares\n"
        "    settings: {n: '100', sleep_s: fast, memry_mb: 3}\n"
        "    resources: {workers: two}\n",
        [
            "task 'a': resources.workers: expected `int | null`, got `str`",
            "task 'a': settings: unknown setting 'memry_mb'",
            "task 'a': settings.n: expected `int`, got `str`",
            "task 'a': settings.sleep_s: expected `float`, got `str`",
        ],
    ),
    "quoted-number": (
        "  - {id: a, type: demo.squares, settings: {n: '100'}}\n",
        ["task 'a': settings.n: expected `int`, got `str`"],
    ),
    "resources-of-a-command": (
        f"  - {{id: a, {CMD} [echo]}}, resources: {{memory_per_worker_gb: 2}}}}\n",
        [
            "task 'a': resources: a 'command' task has the resources of its settings (cores, "
            "memory_gb, gpus, scratch_gb), not 'resources'"
        ],
    ),
}


def refused(project: Path, name: str = "bad.yaml") -> list[str]:
    """`simrun submit NAME --local` refused: exit 1, no run, no traceback; its stderr lines."""
    result = run_simrun("submit", name, "--local", cwd=project)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert not list(project.glob(".simrun/store/runs/*"))
    return result.stderr.splitlines()


@pytest.mark.parametrize("case", sorted(INVALID))
def test_an_invalid_workflow_is_refused_naming_it(project: Path, case: str) -> None:
    """Every problem on a line of its own: `error: FILE: task 'ID': field: what is wrong`."""
    tasks, lines = INVALID[case]
    (project / "bad.yaml").write_text(f"name: bad\ntasks:\n{tasks}")
    assert refused(project) == [f"error: bad.yaml: {line}" for line in lines]


def test_a_task_too_big_for_this_machine_names_the_setting_and_the_machine(
    project: Path,
) -> None:
    (project / "big.yaml").write_text(
        f"name: big\ntasks:\n  - {{id: a, {CMD.replace('0.5', '100000')} [echo]}}}}\n"
    )
    (line,) = refused(project, "big.yaml")
    assert line.startswith(
        "error: big.yaml: task 'a': settings.memory_gb: 1 core and 100,000 GiB fits on no node: "
        "the largest has "
    ), line
    assert line.endswith(" GiB") or line.endswith(" GiB for pods)"), line


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"name: caf\xe9\ntasks: []\n", "error: bad.yaml: not UTF-8 text: byte 0xe9 at offset 9"),
        (
            b"[" * 5000 + b"]" * 5000,
            "error: bad.yaml: line 1, column 65: not a workflow: nested deeper than 64 levels",
        ),
        (
            b"name: [w\ntasks: x\n",
            "error: bad.yaml: line 2, column 6: not valid YAML: expected ',' or ']', but got ':' "
            "(while parsing a flow sequence)",
        ),
        (
            b"name: w\x00\n",
            "error: bad.yaml: line 1, column 8: not valid YAML: the character "
            "#x0000 is not allowed",
        ),
    ],
    ids=["latin-1", "deep", "not-yaml", "nul"],
)
def test_a_file_that_is_no_workflow_is_refused_naming_it(
    project: Path, content: bytes, line: str
) -> None:
    (project / "bad.yaml").write_bytes(content)
    assert refused(project) == [line]


def validated(project: Path, name: str = "bad.yaml") -> dict:
    """`simrun validate NAME --json --local` refused: exit 1, its answer on stdout alone."""
    result = run_simrun("validate", name, "--json", "--local", cwd=project)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr == "", result.stderr
    return json.loads(result.stdout)


def test_validate_json_lists_three_wrong_settings_and_a_wrong_resource(project: Path) -> None:
    tasks, lines = INVALID["settings-and-resources-at-once"]
    (project / "bad.yaml").write_text(f"name: bad\ntasks:\n{tasks}")
    assert validated(project) == {"ok": False, "errors": lines}


@pytest.mark.parametrize(
    ("content", "errors"),
    [
        (f"name: c\ntasks:\n{INVALID['cycle'][0]}", INVALID["cycle"][1]),
        (f"name: c\ntasks:\n{INVALID['duplicate'][0]}", INVALID["duplicate"][1]),
        (f"name: c\ntasks:\n{INVALID['bad-id'][0]}", INVALID["bad-id"][1]),
        (
            "name: [w\ntasks: x\n",
            [
                "line 2, column 6: not valid YAML: expected ',' or ']', but got ':' "
                "(while parsing a flow sequence)"
            ],
        ),
        (None, ["cannot be read: No such file or directory"]),
    ],
    ids=["cycle", "duplicate", "bad-id", "not-yaml", "unreadable"],
)
def test_validate_json_answers_every_refusal(
    project: Path, content: str | None, errors: list[str]
) -> None:
    if content is not None:
        (project / "bad.yaml").write_text(content)
    assert validated(project) == {"ok": False, "errors": errors}
    plain = run_simrun("validate", "bad.yaml", "--local", cwd=project)
    assert plain.returncode == 1
    assert plain.stderr.splitlines() == [f"error: bad.yaml: {line}" for line in errors]


EXAMPLES = sorted(path.name for path in (REPO / "examples").iterdir() if path.is_file())


def test_the_readme_demo_is_an_example() -> None:
    readme = (REPO / "README.md").read_text()
    lines = readme.splitlines()
    assert lines[0] == "pip install -e . && simrun submit examples/squares.yaml --local"
    assert lines[1] == "pip install -e '.[dev]' && python -m pytest -n auto -q"
    assert "squares.yaml" in EXAMPLES
    assert (REPO / "examples" / "squares.yaml").read_text() in readme, "the README shows it"


def test_the_readme_shows_the_command_example() -> None:
    """The `command` example of the README is the file in examples/ (tested below), with an
    image, `{out}` and `{input}` in its args, and its cores and memory."""
    example = (REPO / "examples" / "command.yaml").read_text()
    assert example in (REPO / "README.md").read_text()
    (command,) = [t for t in yaml.safe_load(example)["tasks"] if t["type"] == "command"]
    assert {"image", "args", "cores", "memory_gb"} <= set(command["settings"])
    assert {"{out}", "{input}"} <= set(command["settings"]["args"])


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_validates(project: Path, example: str) -> None:
    shutil.copytree(REPO / "examples", project / "examples")
    result = run_simrun("validate", f"examples/{example}", "--local", "--json", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout) == {"ok": True, "errors": []}


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_is_submitted_unchanged_and_succeeds(project: Path, example: str) -> None:
    """`simrun submit examples/X --local` of every file in examples/, the README's demo (the
    sum of a thousand squares) among them."""
    shutil.copytree(REPO / "examples", project / "examples")
    result = run_simrun("submit", f"examples/{example}", "--local", cwd=project, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].split(": ")[1].startswith("succeeded")
    if example == "squares.yaml":
        (summary,) = project.glob(".simrun/store/runs/*/tasks/squares/out/summary.json")
        expected = {"n": 1000, "sum": sum(i * i for i in range(1000))}
        assert json.loads(summary.read_text()) == expected
    if example == "command.yaml":  # run in its task's directory, as the README says
        (count,) = project.glob(".simrun/store/runs/*/tasks/count/out/count.txt")
        assert count.read_text() == "squares: 100 files\n"
        (log,) = count.parent.parent.glob("logs/*.log")
        assert log.read_text().strip().endswith(f"in {count.parent.parent}")


def test_ci_runs_the_test_line_of_the_readme() -> None:
    script = (REPO / ".ci" / "run").read_text()
    (grep,) = [line for line in script.splitlines() if line.startswith("line=$(grep")]
    pattern = grep.split("'")[1]
    chosen = subprocess.run(
        ["grep", "-m1", "-E", pattern, "README.md"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    assert chosen == (REPO / "README.md").read_text().splitlines()[1]
    assert 'eval "$line"' in script
