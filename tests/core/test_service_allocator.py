"""The service's process allocates Python's objects with malloc; the processes it starts get
the interpreter's default, and a user's own choice of allocator is theirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from simrun_core.service_allocator import ALLOCATOR, service_environment

SERVICE = """
import json, os, subprocess, sys
from simrun_core.service_allocator import adopt_service_allocator

PYMALLOC = "Small block threshold"

def pymalloc():
    return subprocess.run(
        [sys.executable, "-c", "import sys; sys._debugmallocstats()"],
        capture_output=True, text=True, check=True,
    ).stderr

sys._debugmallocstats()  # to stderr: the statistics of pymalloc, when it is in use
adopt_service_allocator()
child = subprocess.run(
    [sys.executable, "-c", "import os; print(os.environ.get('PYTHONMALLOC'))"],
    capture_output=True, text=True, check=True,
).stdout.strip()
with open(f"/proc/{os.getpid()}/environ") as environ:
    own = environ.read().split("\\0")
print(json.dumps({"started_with": [v for v in own if v.startswith("PYTHONMALLOC=")],
                  "child": child, "child_pymalloc": PYMALLOC in pymalloc()}))
"""


PYMALLOC = "Small block threshold"
"""What CPython's statistics of its small-object allocator begin with (none without it)."""


def _run(environment: dict[str, str]) -> dict[str, object]:
    """What the script of a service started with `environment` saw: how it was started, what
    its child inherited and whether the child used pymalloc; `own_pymalloc` its own."""
    done = subprocess.run(
        [sys.executable, "-c", SERVICE],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    answer: dict[str, object] = json.loads(done.stdout)
    answer["own_pymalloc"] = PYMALLOC in done.stderr
    return answer


def test_the_service_runs_on_malloc_and_its_children_on_the_default() -> None:
    plain = {k: v for k, v in os.environ.items() if k != ALLOCATOR}
    answer = _run(service_environment(plain))
    assert answer["started_with"] == ["PYTHONMALLOC=malloc"]
    assert answer["own_pymalloc"] is False
    assert answer["child"] == "None"
    assert answer["child_pymalloc"] is True


def test_without_the_service_environment_a_process_runs_on_pymalloc() -> None:
    """The check above can fail: the default allocator shows."""
    plain = {k: v for k, v in os.environ.items() if k != ALLOCATOR}
    assert _run(plain)["own_pymalloc"] is True


def test_a_users_own_allocator_is_left_to_them() -> None:
    chosen = {"PATH": "/bin", ALLOCATOR: "debug"}
    assert service_environment(chosen) == chosen
    assert service_environment({"PATH": "/bin"}) == {
        "PATH": "/bin",
        ALLOCATOR: "malloc",
        "SIMRUN_SERVICE_MALLOC": "1",
    }
