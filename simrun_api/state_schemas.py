"""The schemas of the OpenAPI document beyond the shapes of the routes: which run states are
ended and which task states final (`simrun_core.states`), and what a task id may be
(`simrun_core.workflow`). A client generates them from the document (the web app: `npm run
types`) instead of writing the sets and limits a second time."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from simrun_core.states import ENDED_RUN_STATES, FINAL_TASK_STATES, RunState, TaskState
from simrun_core.workflow import TASK_ID, TASK_ID_MAX_CHARS


def _subset(title: str, description: str, states: list[StrEnum]) -> dict[str, Any]:
    """A string enum of some states of an enum, in its order."""
    values = [state.value for state in states]
    return {"title": title, "description": description, "type": "string", "enum": values}


def state_schemas() -> dict[str, dict[str, Any]]:
    """The component schemas `EndedRunState`, `FinalTaskState` and `TaskId`."""
    return {
        "TaskId": {
            "title": "TaskId",
            "description": "What the id of a task may be (`TaskSpec.id`), checked when a "
            "workflow is validated or submitted: lower case letters, digits and `-`, starting "
            f"with a letter, at most {TASK_ID_MAX_CHARS} characters.",
            "type": "string",
            "pattern": f"^{TASK_ID.pattern}$",
            "maxLength": TASK_ID_MAX_CHARS,
        },
        "EndedRunState": _subset(
            "EndedRunState",
            "The states of a run that has ended: a `RunState` it never leaves.",
            [state for state in RunState if state in ENDED_RUN_STATES],
        ),
        "FinalTaskState": _subset(
            "FinalTaskState",
            "The states of a task that will not change any more: a `TaskState` it never leaves.",
            [state for state in TaskState if state in FINAL_TASK_STATES],
        ),
    }
