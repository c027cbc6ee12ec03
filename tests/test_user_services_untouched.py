"""The suite never reaches the user's own services (issue 24): a `simrun` command of a test
runs in a directory of the suite, not in the one pytest was started in, whose `.simrun/` may
hold the user's local service and warm command process; and the user's `SIMRUN_URL` is not
the tests'.

Checked by running a small test module with the suite's conftest and CLI helpers in a fresh
pytest started in a directory that stands for the user's project: its `.simrun/commands.sock`
listens (as a warm process does) and `SIMRUN_URL` names a server that listens too. The module
runs commands the way tests that forget a directory do; nothing may connect to either.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from simrun_cli import warm_wire

TESTS = Path(__file__).resolve().parent

COMMANDS_WITHOUT_A_DIRECTORY = """
import os
import subprocess
from pathlib import Path

from cli_helpers import run_simrun, simrun_command


def test_commands_of_a_test_that_names_no_directory():
    subprocess.run([*simrun_command(), "--help"], capture_output=True, timeout=120, check=True)
    assert run_simrun("--help", cwd=Path.cwd()).returncode == 0
    listed = subprocess.run(
        [*simrun_command(), "list"], capture_output=True, text=True, timeout=120
    )
    print(listed.returncode, listed.stderr)
"""


class Sentinel:
    """A listening socket that notes every connection made to it, until closed."""

    def __init__(self, listener: socket.socket) -> None:
        self.listener = listener
        self.connections = 0
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.connections += 1
            connection.close()

    def close(self) -> None:
        # shutdown wakes the thread blocked in accept; close alone may not
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(timeout=10)


def warm_socket(project: Path) -> Sentinel:
    """A socket at `.simrun/commands.sock` of `project`, where a warm process would listen."""
    (project / ".simrun").mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(project / warm_wire.SOCKET))
    listener.listen(16)
    return Sentinel(listener)


def remote_service() -> Sentinel:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    return Sentinel(listener)


def state_of(directory: Path) -> dict[str, tuple[int, int]]:
    """Each entry below `directory`: its mode and mtime."""
    return {
        str(path.relative_to(directory)): (path.lstat().st_mode, path.lstat().st_mtime_ns)
        for path in sorted(directory.rglob("*"))
    }


def test_the_suite_runs_no_command_in_the_users_directory_nor_against_their_service(
    tmp_path: Path,
) -> None:
    users_project = tmp_path / "project"
    users_project.mkdir()
    (users_project / "test_commands.py").write_text(COMMANDS_WITHOUT_A_DIRECTORY)
    warm = warm_socket(users_project)
    service = remote_service()
    port = service.listener.getsockname()[1]
    (users_project / ".simrun" / "service.json").write_text('{"pid": 1, "url": "sentinel"}')
    before = state_of(users_project / ".simrun")
    env = {
        **os.environ,
        "SIMRUN_URL": f"http://127.0.0.1:{port}",
        "SIMRUN_TOKEN": "the-users-token",
        "PYTHONPATH": os.pathsep.join(
            [str(TESTS), str(TESTS / "cli"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    try:
        inner = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-s",
                "-p",
                "conftest",  # the suite's tests/conftest.py, as every test of the suite has it
                "-p",
                "no:cacheprovider",
                "-p",
                "no:randomly",
                "test_commands.py",
            ],
            cwd=users_project,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        warm.close()
        service.close()
    assert inner.returncode == 0, inner.stdout + inner.stderr
    assert "1 passed" in inner.stdout, inner.stdout
    assert warm.connections == 0, "a command connected to the warm process of the user"
    assert service.connections == 0, "a command connected to the service of SIMRUN_URL"
    assert "SIMRUN_URL and SIMRUN_TOKEN not set" in inner.stdout, "`list` reached no service"
    assert state_of(users_project / ".simrun") == before, "the user's .simrun/ changed"
