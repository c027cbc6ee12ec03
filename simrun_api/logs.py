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


LOG_ANSWER_MAX_BYTES = 8 * 1024**2
"""The most bytes of log an answer of a task's logs holds, the newest: each log is read from
its end, the last first, until the bytes of the answer reach this; a log cut so is shown with
a line saying how many of its first bytes were left out (`left_out_line`). A log of gigabytes
without a line break, or all of it (`tail_lines=0`), costs the memory of this bound."""
TAIL_BLOCK = 256 * 1024
"""The bytes of a log read at a time from its end."""


def left_out_line(left_out: int) -> str:
    """The line shown at the start of a log of which `left_out` first bytes are not shown."""
    return (
        f"[simrun: the first {left_out:,} bytes of this log are left out: an answer holds at "
        f"most {LOG_ANSWER_MAX_BYTES:,} bytes of logs, the newest]"
    )


def render(
    logs: Path, pods: list[str], tail_lines: int, max_bytes: int = LOG_ANSWER_MAX_BYTES
) -> str:
    """The logs of the pods as one text, each under a header; the last `tail_lines` (0 all)
    of each, and at most `max_bytes` of them all, the newest (`LOG_ANSWER_MAX_BYTES`)."""
    parts = []
    budget = max_bytes
    for pod in reversed(pods):
        if "/" in pod or pod.startswith("."):
            continue
        try:
            data, left_out = tail(logs / f"{pod}.log", tail_lines, budget)
        except FileNotFoundError:
            data, left_out = b"", 0
        budget -= len(data)
        lines = data.decode(errors="replace").splitlines()
        if left_out:
            lines.insert(0, left_out_line(left_out))
        elif tail_lines:
            lines = lines[-tail_lines:]
        parts.append(f"==> {pod}.log <==\n" + "".join(line + "\n" for line in lines))
    return "".join(reversed(parts))


def tail(path: Path, lines: int, max_bytes: int = LOG_ANSWER_MAX_BYTES) -> tuple[bytes, int]:
    """The end of a file that holds at least its last `lines` lines (the whole file for 0),
    read from the end a block at a time, and at most `max_bytes` of it: the tail of a log of
    gigabytes costs the memory of the tail, not of the log (it cost five times the log's
    size). With the bytes of the file before that end, when `max_bytes` stopped the reading
    before the lines were found (0 otherwise)."""
    with path.open("rb") as file:
        position = file.seek(0, 2)
        blocks: list[bytes] = []
        read = 0
        breaks = 0
        # A line break is \n, \r or \r\n (others only make more lines): one more than asked,
        # so that the first line read, cut by where the reading stopped, is not shown.
        while position > 0 and (not lines or breaks <= lines):
            size = min(TAIL_BLOCK, position, max_bytes - read)
            if size <= 0:
                return b"".join(reversed(blocks)), position
            position -= size
            file.seek(position)
            block = file.read(size)
            read += len(block)
            breaks += block.count(b"\n") + block.count(b"\r") - block.count(b"\r\n")
            if blocks and block.endswith(b"\r") and blocks[-1].startswith(b"\n"):
                breaks -= 1  # a \r\n between two blocks
            blocks.append(block)
        return b"".join(reversed(blocks)), 0
