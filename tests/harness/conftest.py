"""Fixtures of the harness tests: task directories in temporary stores."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .helpers import HarnessTask, make_harness_task


@pytest.fixture
def make_task(tmp_path: Path) -> Iterator[Callable[..., HarnessTask]]:
    """A factory of task directories (`make_task(settings, task_type=..., task=...)`); the
    processes their tests started are killed at the end."""
    made: list[HarnessTask] = []
    numbers = itertools.count()

    def make(settings: dict[str, Any], **kwargs: str) -> HarnessTask:
        task = make_harness_task(tmp_path / f"root{next(numbers)}", settings, **kwargs)
        made.append(task)
        return task

    yield make
    for task in made:
        task.end_processes()
