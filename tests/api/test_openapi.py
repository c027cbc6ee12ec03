"""The OpenAPI document of the service, and its committed copy `openapi.json` beside this file.

The copy is the input of the types of clients (the web app); this test keeps it equal to the
API. After a change of the API, regenerate it and commit it with the change:

    SIMRUN_UPDATE_OPENAPI=1 python -m pytest tests/api/test_openapi.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from simrun_api.app import ROUTES, openapi_document
from simrun_core.states import ENDED_RUN_STATES, FINAL_TASK_STATES

COPY = Path(__file__).with_name("openapi.json")


def _text(document: dict) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def test_the_committed_openapi_document_is_the_one_of_the_api():
    document = openapi_document()
    if os.environ.get("SIMRUN_UPDATE_OPENAPI") == "1":
        COPY.write_text(_text(document))
    assert COPY.exists(), "no tests/api/openapi.json: run with SIMRUN_UPDATE_OPENAPI=1"
    assert json.loads(COPY.read_text()) == json.loads(_text(document)), (
        "the API changed: regenerate tests/api/openapi.json with SIMRUN_UPDATE_OPENAPI=1"
    )


def test_every_route_is_documented_with_its_response_shape():
    document = openapi_document()
    operations = [
        (method, path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]
    assert len(operations) == len(ROUTES)
    for method, path, operation in operations:
        success = [code for code in operation["responses"] if code.startswith("2")]
        assert len(success) == 1, (method, path)
        content = operation["responses"][success[0]]["content"]
        assert all(media["schema"] for media in content.values()), (method, path)
        assert operation.get("description"), (method, path)
        if path != "/local/instance":
            assert "401" in operation["responses"], (method, path)
    schemas = document["components"]["schemas"]
    for shape in ("RunItem", "RunView", "ServerUsage", "WorkerView", "CompareTable", "Usage"):
        assert shape in schemas


def test_the_document_says_which_run_states_are_ended_and_which_task_states_final():
    """The web app generates these sets from the document (web/scripts/states.mjs)."""
    schemas = openapi_document()["components"]["schemas"]
    assert set(schemas["EndedRunState"]["enum"]) == {state.value for state in ENDED_RUN_STATES}
    assert set(schemas["FinalTaskState"]["enum"]) == {state.value for state in FINAL_TASK_STATES}
    assert set(schemas["EndedRunState"]["enum"]) < set(schemas["RunState"]["enum"])
    assert set(schemas["FinalTaskState"]["enum"]) < set(schemas["TaskState"]["enum"])
