"""Fixtures shared by the tests of every package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from live_service import LocalService, start_service, stop_service


@pytest.fixture
def local_service(tmp_path: Path) -> Iterator[LocalService]:
    """A local service of a fresh project directory."""
    service = start_service(tmp_path)
    try:
        yield service
    finally:
        stop_service(service)
