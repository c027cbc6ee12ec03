"""The logs of the pods (local processes) of a task, kept in the run store.

Locally every process writes its output into `tasks/<task>/logs/<pod>.log` of the store, the pod
named `<worker>-<attempt>`. Once a task is final its actor writes `logs/index.json`, the pods in
their order, and then appends `logs-kept`; the API serves the kept logs of a task whose record
has that event, and the log files of its live pods otherwise.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from simrun_core.store import write_atomic

INDEX = "index.json"


def pod_order(path: Path) -> tuple[str, int]:
    """The order of the log of a pod: by worker, then attempt."""
    worker, _, attempt = path.stem.rpartition("-")
    return (worker, int(attempt)) if attempt.isdigit() else (path.stem, 0)


def live_pods(logs: Path) -> list[str]:
    """The pods with a log file, in order."""
    return [path.stem for path in sorted(logs.glob("*.log"), key=pod_order)]


def keep(logs: Path) -> list[str]:
    """Write `index.json` of the logs of a final task: the pods with a log, in order."""
    pods = live_pods(logs)
    write_atomic(logs / INDEX, msgspec.json.encode(pods))
    return pods


def kept_pods(logs: Path) -> list[str] | None:
    """The pods of the kept logs, None when they are not kept."""
    try:
        return msgspec.json.decode((logs / INDEX).read_bytes(), type=list[str])
    except (OSError, msgspec.DecodeError):
        return None


def render(logs: Path, pods: list[str], tail_lines: int) -> str:
    """The logs of the pods as one text, each under a header; the last `tail_lines` (0 all)."""
    parts = []
    for pod in pods:
        if "/" in pod or pod.startswith("."):
            continue
        try:
            text = tail(logs / f"{pod}.log", tail_lines)
        except FileNotFoundError:
            text = ""
        lines = text.splitlines()
        if tail_lines:
            lines = lines[-tail_lines:]
        parts.append(f"==> {pod}.log <==\n" + "".join(line + "\n" for line in lines))
    return "".join(parts)


TAIL_BLOCK = 256 * 1024
"""The bytes of a log read at a time from its end."""


def tail(path: Path, lines: int) -> str:
    """The end of a file that holds at least its last `lines` lines (the whole file for 0),
    read from the end a block at a time: the tail of a log of gigabytes costs the memory of
    the tail, not of the log (it cost five times the log's size)."""
    with path.open("rb") as file:
        if not lines:
            return file.read().decode(errors="replace")
        position = file.seek(0, 2)
        blocks: list[bytes] = []
        breaks = 0
        # A line break is \n, \r or \r\n (others only make more lines): one more than asked,
        # so that the first line read, cut by where the reading stopped, is not shown.
        while position > 0 and breaks <= lines:
            size = min(TAIL_BLOCK, position)
            position -= size
            file.seek(position)
            block = file.read(size)
            breaks += block.count(b"\n") + block.count(b"\r") - block.count(b"\r\n")
            if blocks and block.endswith(b"\r") and blocks[-1].startswith(b"\n"):
                breaks -= 1  # a \r\n between two blocks
            blocks.append(block)
        return b"".join(reversed(blocks)).decode(errors="replace")
