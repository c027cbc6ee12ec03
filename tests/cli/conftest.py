"""Fixtures of the CLI tests: a project directory whose local service is stopped at the end."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from simrun_cli.local import pid_alive, read_service, stop_local


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A fresh project directory; a local service a test started in it is stopped afterwards."""
    yield tmp_path
    info = read_service(tmp_path)
    if info is None or not pid_alive(info.pid):
        return
    try:
        stop_local(tmp_path, timeout_s=60)
    except RuntimeError:
        os.killpg(info.pid, signal.SIGKILL)
        raise
