"""`simrun list` and `simrun status` in a terminal of 80 columns (a pseudo-terminal of that
size, no `COLUMNS`), against the real local service of a temp project: long names wrap at
their word boundaries."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import yaml
from cli_helpers import cli_env, run_simrun, simrun_command

WORKFLOW = "scan-of-the-liver-model-with-a-long-name"
GROUP = "fit-of-every-liver-model-in-the-study"
ESCAPE = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\))")
"""A control sequence of a terminal: CSI (colours) or OSC (links)."""


def run_in_terminal(*args: str, cwd: Path, columns: int, timeout: float = 60.0) -> str:
    """Run `simrun ARGS` with its stdout on a pseudo-terminal `columns` wide; what it printed
    there, without control sequences, its lines ended by `\\n`."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    process = subprocess.Popen(
        [*simrun_command(), *args],
        cwd=cwd,
        env=cli_env(TERM="xterm-256color"),
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], deadline - time.monotonic())
            if not ready:
                continue
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer of the terminal closed it
                break
            if not chunk:
                break
            chunks.append(chunk)
        _, stderr = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr.decode()
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    return ESCAPE.sub("", text)


def column(lines: list[str], header: str, following: str, first: int, end: int) -> list[str]:
    """The pieces of a column in the rows `first` to `end` of a table: the text below `header`
    up to the column `following`."""
    start, stop = lines[0].index(header), lines[0].index(following)
    return [line[start:stop].strip() for line in lines[first:end] if line[start:stop].strip()]


SEPARATORS = ("-", "_", ".", "/")
"""Where a name may break: after one of these, or before a hyphen."""


def assert_wrapped_at_words(pieces: list[str], name: str) -> None:
    """The pieces are the whole name, each line break next to a separator."""
    assert "".join(pieces) == name, pieces
    for piece, after in itertools.pairwise(pieces):
        at_word = piece.endswith(SEPARATORS) or after.startswith("-")
        assert at_word, f"{name!r} cut mid-word: {pieces}"


def test_list_at_80_columns_wraps_names_at_their_word_boundaries(project: Path) -> None:
    workflow = {"name": WORKFLOW, "tasks": [{"id": "squares", "type": "demo.squares"}]}
    workflow["tasks"][0]["settings"] = {"n": 2}
    (project / "w.yaml").write_text(yaml.safe_dump(workflow))
    runs = []
    for extra in (["--group", GROUP], []):
        submitted = run_simrun("submit", "w.yaml", "--local", "--json", *extra, cwd=project)
        assert submitted.returncode == 0, submitted.stderr
        runs.append(json.loads(submitted.stdout)["id"])

    text = run_in_terminal("list", "--local", cwd=project, columns=80)

    lines = text.rstrip("\n").split("\n")
    assert lines[0].split()[:3] == ["id", "workflow", "group"], text
    assert all(len(line) <= 80 for line in lines), text
    starts = [next(i for i, line in enumerate(lines) if line.startswith(run)) for run in runs]
    for run, first in zip(runs, starts, strict=True):
        end = min([start for start in starts if start > first], default=len(lines))
        assert_wrapped_at_words(column(lines, "workflow", "group", first, end), WORKFLOW)
        group = column(lines, "group", "state", first, end)
        if run == runs[0]:
            assert_wrapped_at_words(group, GROUP)
        else:
            assert group == []


LONG_TASK = "squares-of-the-liver-model-scan-with-long-id"
"""A task id (never wrapped) that leaves the type of its task 8 columns at 80."""


def test_status_at_80_columns_wraps_task_types_at_their_word_boundaries(project: Path) -> None:
    task = {"id": LONG_TASK, "type": "demo.squares", "settings": {"n": 2, "fail_at": 1}}
    (project / "w.yaml").write_text(yaml.safe_dump({"name": "liver", "tasks": [task]}))
    submitted = run_simrun("submit", "w.yaml", "--local", "--json", cwd=project)
    assert submitted.returncode == 1, submitted.stderr  # its failure message takes room
    run = json.loads(submitted.stdout)["id"]

    text = run_in_terminal("status", run, "--local", cwd=project, columns=80)

    lines = text.rstrip("\n").split("\n")
    assert all(len(line) <= 80 for line in lines), text
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["task", "type"])
    table = lines[header:]
    first = next(i for i, line in enumerate(table) if line.startswith(LONG_TASK))
    end = next((i for i, line in enumerate(table) if i > first and not line.strip()), len(table))
    pieces = column(table, "type", "state", first, end)
    assert len(pieces) > 1, text  # narrow enough to wrap
    assert_wrapped_at_words(pieces, "demo.squares")
