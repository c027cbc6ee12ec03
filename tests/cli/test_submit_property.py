"""A property of `simrun submit FILE --local` as a user runs it: whatever the file holds (any
bytes, any YAML document, documents shaped like workflows), a workflow that cannot run exits 1
with a message on stderr, never a traceback, creates no run and leaves the service answering.

One real local service serves every example (started once, as a user's first command starts
it); the command runs in this process, through `simrun_cli.main.main` as the console script
calls it, so each example costs milliseconds rather than the start of a python.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simrun_cli import main as cli
from simrun_cli.local import read_service, stop_local

EXAMPLES = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)
# Settings without `n`: no generated `demo.squares` task can run (nor a `command` one, whose
# four required settings no generated mapping has), so every document must be refused.
settings_values = st.dictionaries(st.text(max_size=8).filter(lambda key: key != "n"), values)
tasks = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["a", "b", "Bad", ""]) | st.text(max_size=6),
        "type": st.sampled_from(["demo.squares", "command", "no.such"]),
    },
    optional={
        "settings": settings_values,
        "inputs": st.dictionaries(st.sampled_from(["after", "x"]), st.sampled_from(["a.x", "b"])),
        "resources": st.dictionaries(st.sampled_from(["workers", "gpus", "memory"]), values),
        "split": st.sampled_from(["fastest", "slowest"]) | values,
    },
)
workflows = st.fixed_dictionaries(
    {"tasks": st.lists(tasks, max_size=3)},
    optional={"name": st.text(max_size=8) | values, "split": values},
)
documents = (
    st.binary(max_size=200)
    | values.map(lambda value: yaml.safe_dump(value).encode())
    | workflows.map(lambda value: yaml.safe_dump(value, sort_keys=False).encode())
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A project whose local service was started by a first command, stopped at the end."""
    root = tmp_path_factory.mktemp("submit-property")
    # Started by this process's python (as the commands below run), not the console script's.
    assert run(root, "list", "--local") == (0, "")
    try:
        yield root
    finally:
        stop_local(root, timeout_s=60)


def submit(project: Path, content: bytes) -> tuple[int, str]:
    """`simrun submit wf.yaml --local --no-wait` in the project: its exit code and stderr."""
    (project / "wf.yaml").write_bytes(content)
    return run(project, "submit", "wf.yaml", "--local", "--no-wait")


def run(project: Path, *args: str) -> tuple[int, str]:
    """`simrun ARGS` in the project, in this process: its exit code and stderr."""
    stderr = io.StringIO()
    with (
        contextlib.chdir(project),
        contextlib.redirect_stderr(stderr),
        contextlib.redirect_stdout(io.StringIO()),
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(cli, "quick_exit", False)  # no gc.freeze in the process of the tests
        with pytest.raises(SystemExit) as ended:
            cli.main(list(args))
    code = ended.value.code
    return (code if isinstance(code, int) else 0), stderr.getvalue()


def answering(project: Path) -> Any:
    info = read_service(project)
    assert info is not None, "the local service is gone"
    headers = {"Authorization": f"Bearer {info.token}"}
    return httpx.get(f"{info.url}/me", headers=headers, timeout=10).status_code == 200


@EXAMPLES
@given(documents)
def test_any_file_is_refused_with_a_message_and_no_run(project: Path, content: bytes) -> None:
    code, stderr = submit(project, content)
    assert code == 1, (content, stderr)
    lines = stderr.splitlines()
    assert lines and all(line.startswith("error: wf.yaml: ") for line in lines), stderr
    assert "Traceback" not in stderr and "<unicode string>" not in stderr, stderr
    assert not list(project.glob(".simrun/store/runs/*")), "a refused workflow made a run"
    assert answering(project)


def test_the_property_reaches_the_service(project: Path) -> None:
    """A document the file is checked for locally, and one only the service can refuse (its
    types): both in the one shape."""
    assert submit(project, b"name: w\ntasks: []\n") == (
        1,
        "error: wf.yaml: tasks: a workflow needs at least one task\n",
    )
    assert submit(project, b"name: w\ntasks: [{id: a, type: demo.squares}]\n") == (
        1,
        "error: wf.yaml: task 'a': settings.n: missing, it is required\n",
    )
