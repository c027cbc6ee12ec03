"""The schemas of the OpenAPI document beyond the shapes of the routes: which run states are
ended and which task states final (`simrun_core.states`). A client generates them from the
document (the web app: `npm run types`) instead of writing the sets a second time."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from simrun_core.states import ENDED_RUN_STATES, FINAL_TASK_STATES, RunState, TaskState


def _subset(title: str, description: str, states: list[StrEnum]) -> dict[str, Any]:
    """A string enum of some states of an enum, in its order."""
    values = [state.value for state in states]
    return {"title": title, "description": description, "type": "string", "enum": values}


def state_schemas() -> dict[str, dict[str, Any]]:
    """The component schemas `EndedRunState` and `FinalTaskState`."""
    return {
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
