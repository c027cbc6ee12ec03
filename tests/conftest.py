"""Fixtures shared by the tests of every package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from live_service import LocalService, start_service, stop_service

USER_SERVICE_VARIABLES = ("SIMRUN_URL", "SIMRUN_TOKEN", "SIMRUN_STORE", "SIMRUN_CONFIG")
"""The variables by which a command would reach the user's own service or store."""


@pytest.fixture(scope="session", autouse=True)
def away_from_the_users_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test runs in a directory of the suite's own, never in the one pytest started in.

    A `simrun` command finds the local service and the warm command process of its current
    directory (`.simrun/`): run from the repository root, a command of a test would go through
    the user's own service there. A command a test runs without a directory of its own (a
    subprocess without `cwd`, a command in this process) runs here instead, where nothing runs
    but what the suite starts; and none reaches the user's service through the environment.
    """
    directory = tmp_path_factory.mktemp("cwd")
    with pytest.MonkeyPatch.context() as patch:
        for name in USER_SERVICE_VARIABLES:
            patch.delenv(name, raising=False)
        patch.chdir(directory)
        yield directory


@pytest.fixture
def local_service(tmp_path: Path) -> Iterator[LocalService]:
    """A local service of a fresh project directory."""
    service = start_service(tmp_path)
    try:
        yield service
    finally:
        stop_service(service)
