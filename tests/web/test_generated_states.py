"""The states of runs and tasks and the limits of a task id the web app uses as values are
generated from the OpenAPI document (`web/scripts/states.mjs`, `web/scripts/limits.mjs`, run by
`npm run types` before every build), never written in the app a second time."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from simrun_core.states import ENDED_RUN_STATES, FINAL_TASK_STATES, RunState, TaskState
from simrun_core.workflow import TASK_ID, TASK_ID_MAX_CHARS

ROOT = Path(__file__).parents[2]
WEB = ROOT / "web"


def generated_sets(text: str) -> dict[str, list[str]]:
    """The arrays of the constants of a generated file, by name."""
    constants = re.findall(r"export const (\w+)\b[^=]*= (?:new Set<\w+>\()?\[([^\]]*)\]", text)
    return {name: re.findall(r'"([^"]+)"', values) for name, values in constants}


def test_the_generator_writes_the_states_of_the_document(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is missing (the web app is built with node >= 20.19)")
    output = tmp_path / "states.ts"
    openapi = ROOT / "tests" / "api" / "openapi.json"
    generator = WEB / "scripts" / "states.mjs"
    done = subprocess.run(
        [node, str(generator), str(openapi), str(output)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert generated_sets(output.read_text()) == {
        "RUN_STATES": [state.value for state in RunState],
        "ENDED_RUN_STATES": [state.value for state in RunState if state in ENDED_RUN_STATES],
        "FINAL_TASK_STATES": [state.value for state in TaskState if state in FINAL_TASK_STATES],
    }
    refused = subprocess.run(
        [node, str(generator), str(tmp_path / "none.json"), str(output)],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1
    assert "none.json: cannot be read as the OpenAPI document" in refused.stderr


def test_the_app_writes_no_set_of_states_itself() -> None:
    lists = re.compile(r'\[\s*"(succeeded|failed|cancelled|done|skipped)"\s*,')
    for path in sorted((WEB / "src").rglob("*")):
        if path.suffix in {".ts", ".vue"} and path.name not in {"schema.d.ts", "states.ts"}:
            assert not lists.search(path.read_text()), path


def test_the_generator_writes_the_task_id_limits_of_the_document(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is missing (the web app is built with node >= 20.19)")
    output = tmp_path / "limits.ts"
    openapi = ROOT / "tests" / "api" / "openapi.json"
    generator = WEB / "scripts" / "limits.mjs"
    done = subprocess.run(
        [node, str(generator), str(openapi), str(output)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    text = output.read_text()
    assert f"TASK_ID_MAX_CHARS = {TASK_ID_MAX_CHARS};" in text
    assert f"TASK_ID_PATTERN = new RegExp({json.dumps('^' + TASK_ID.pattern + '$')});" in text
    empty = tmp_path / "empty.json"
    empty.write_text('{"components": {"schemas": {}}}')
    refused = subprocess.run(
        [node, str(generator), str(empty), str(output)], capture_output=True, text=True
    )
    assert refused.returncode == 1
    assert "components.schemas.TaskId has no pattern" in refused.stderr
    assert "components.schemas.TaskId has no maxLength" in refused.stderr


def test_the_app_writes_no_task_id_limit_itself() -> None:
    written = re.compile(r"\[a-z\]\[a-z0-9-\]|\b63\b")
    for path in sorted((WEB / "src").rglob("*")):
        if path.suffix in {".ts", ".vue"} and path.name not in {"schema.d.ts", "limits.ts"}:
            assert not written.search(path.read_text()), path
