"""Fixtures of the simrun_core tests, built from `core_samples`."""

from __future__ import annotations

import pytest
from core_samples import sample_log, sample_plans, sample_submitted, sample_workflow

from simrun_core import events as ev
from simrun_core.planner import TaskPlan
from simrun_core.workflow import Workflow


@pytest.fixture
def workflow() -> Workflow:
    """A split task of 3 units and a command task that reads its output port."""
    return sample_workflow()


@pytest.fixture
def plans(workflow: Workflow) -> dict[str, TaskPlan]:
    """The plans of the workflow's tasks on one node of 2 cores and 24 GiB."""
    return sample_plans(workflow)


@pytest.fixture
def submitted(workflow: Workflow, plans: dict[str, TaskPlan]) -> ev.Submitted:
    """The first event of the run."""
    return sample_submitted(workflow, plans)


@pytest.fixture
def run_log(submitted: ev.Submitted) -> list[ev.Event]:
    """A whole successful run: 3 units (one reported twice), a merge, the command, the end."""
    return sample_log(submitted)
