"""The run store: the layout of a run on disk and its append-only event log.

`<store>/runs/<run>/` holds `events.jsonl` (the truth), `run.json` (a cache of the fold),
`environment.lock` (the lock of its environment on a cluster, when it has one) and per task
`tasks/<task>/settings.json`, `provenance.json`, `out/`, `logs/`, `events/` (a log per worker
attempt) and `ledger/` (claims of a split task). The names are those of `simrun_core.store_layout`.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import msgspec

from simrun_core import faults
from simrun_core.events import Event, EventDecodeError, decode_event, encode_event
from simrun_core.fold import RunFold, RunRecord
from simrun_core.store_layout import (
    ENVIRONMENT_LOG,
    EVENTS,
    LOGS,
    OUT,
    PROVENANCE_FILE,
    REMOVED_PREFIX,
    RUNS,
    SETTINGS_FILE,
    TASKS,
)
from simrun_core.store_layout import output_path as output_path

RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")
MERGED_MARKER = ".simrun-merged"


def new_run_id(when: datetime | None = None) -> str:
    """A new run id, `YYYYMMDD-HHMMSS-<6 hex>`."""
    when = when or datetime.now(UTC)
    return f"{when:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def is_run_id(value: str) -> bool:
    """Whether a string has the form of a run id (and so is safe as a directory name)."""
    return bool(RUN_ID.fullmatch(value))


class RunPaths:
    """The paths of one run below the store."""

    def __init__(self, store: Path, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.dir = runs_dir(store) / run_id
        self.events = self.dir / EVENTS
        self.cache = self.dir / "run.json"
        self.environment_lock = self.dir / "environment.lock"
        """The lock of the run's environment (`simrun_core.environment`), when it has one."""
        self.environment_log = self.dir / ENVIRONMENT_LOG
        self.tasks = self.dir / TASKS
        """The directory of the run's tasks."""

    @property
    def removed(self) -> Path:
        """Where the run's directory is moved while it is removed (`removed_runs`). A
        property: the paths of an id that names no run (a refused request's) never raise."""
        return runs_dir(self.store) / f"{REMOVED_PREFIX}{self.run_id}"

    def task_dir(self, task: str) -> Path:
        """The directory of a task."""
        return self.tasks / task

    def out(self, task: str) -> Path:
        """The outputs of a task: a directory per port and `summary.json`."""
        return self.task_dir(task) / OUT

    def logs(self, task: str) -> Path:
        """The logs of the processes (pods) of a task."""
        return self.task_dir(task) / LOGS

    def worker_events(self, task: str) -> Path:
        """The event logs the harness writes, one per worker attempt."""
        return self.task_dir(task) / "events"

    def worker_log(self, task: str, worker: str, attempt: int) -> Path:
        """The harness event log of one attempt of a worker (a pod)."""
        return self.worker_events(task) / worker_log_name(worker, attempt)

    def ledger(self, task: str) -> Path:
        """The ledger of a split task."""
        return self.task_dir(task) / "ledger"

    def settings(self, task: str) -> Path:
        """The settings of a task as submitted."""
        return self.task_dir(task) / SETTINGS_FILE

    def provenance(self, task: str) -> Path:
        """The provenance of the sources of the run, for the task's processes."""
        return self.task_dir(task) / PROVENANCE_FILE


WORKER_LOG_SUFFIX = ".jsonl"


def worker_log_name(worker: str, attempt: int) -> str:
    """The name of a worker attempt's harness event log, `<worker>.<attempt>.jsonl`."""
    return f"{worker}.{attempt}{WORKER_LOG_SUFFIX}"


def worker_log_pod(path: Path) -> tuple[str, str, int] | None:
    """The task, worker and attempt of a harness event log (`tasks/<task>/events/<worker>.
    <attempt>.jsonl`), None for a file of another name."""
    if not path.name.endswith(WORKER_LOG_SUFFIX) or path.parent.name != "events":
        return None
    worker, _, attempt = path.name.removesuffix(WORKER_LOG_SUFFIX).rpartition(".")
    if not worker or not attempt.isdigit():
        return None
    return path.parent.parent.name, worker, int(attempt)


def output_below_out(run_id: str, task: str, path: str) -> str | None:
    """The part below the task's `out/` of a path `output_path` made, None for another path."""
    prefix = output_path(run_id, task) + "/"
    return path[len(prefix) :] if path.startswith(prefix) and len(path) > len(prefix) else None


def runs_dir(store: Path) -> Path:
    """The directory of the runs of a store."""
    return store / RUNS


def run_ids(store: Path) -> list[str]:
    """The ids of the runs in the store, sorted (and so in order of submission)."""
    runs = runs_dir(store)
    if not runs.is_dir():
        return []
    named = (entry.name for entry in runs.iterdir() if is_run_id(entry.name))
    return sorted(name for name in named if (runs / name / EVENTS).exists())


def removed_runs(store: Path) -> list[Path]:
    """The directories of runs whose removal began (`RunPaths.removed`)."""
    return sorted(runs_dir(store).glob(f"{REMOVED_PREFIX}*"))


def task_log_files(store: Path, pattern: str) -> list[Path]:
    """The files matching `pattern` in the logs directories (`RunPaths.logs`) of every task
    of every run of the store."""
    return sorted(runs_dir(store).glob(f"*/{TASKS}/*/{LOGS}/{pattern}"))


def write_atomic(path: Path, data: bytes, mode: int = 0o644, *, durable: bool = True) -> None:
    """Write a file through a temporary file in its directory and a rename: the file is the
    old one or the new one, never a part (an error removes the temporary file). `durable`
    fsyncs the data before the rename, so a crash of the machine cannot leave the new name
    on an empty file; a cache that is checked when read may skip it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            faults.check("atomic", path)
            file.write(data)
            if durable:
                file.flush()
                faults.fsync(file.fileno(), path)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


BLOCK_BYTES = 1 << 20
"""How much of a log `iter_blocks` reads at a time."""


class LogCorrupt(ValueError):
    """A line of an event log, not its last, that is not an event; names the file and line."""


def iter_log(path: Path, offset: int = 0) -> Iterator[tuple[int, Event]]:
    """The events of a log from byte `offset` with the offset after each; see `iter_lines`."""
    for end, _, event in iter_lines(path, offset):
        yield end, event


def iter_lines(
    path: Path, offset: int = 0, line_at: int | None = None
) -> Iterator[tuple[int, bytes, Event]]:
    """The lines of a log from byte `offset`: the offset after each, its bytes, its event.

    A torn last line (no newline) is not read; a corrupt whole line raises LogCorrupt, which
    names its byte and its line: counted from the start of the file, or from `line_at`, the
    number of the line at `offset` when the caller knows it.
    """
    known = offset == 0 or line_at is not None
    with open(path, "rb") as file:
        file.seek(offset)
        for number, line in enumerate(file, start=line_at or 1):
            if not line.endswith(b"\n"):
                return
            offset += len(line)
            yield offset, line, _decode_line(path, line, offset, number if known else None)


def _decode_line(path: Path, line: bytes, end: int, number: int | None) -> Event:
    """The event of a whole line that ends at byte `end`; LogCorrupt naming the file, the line
    (`number`, when known) and its byte."""
    try:
        return decode_event(line)
    except EventDecodeError as error:
        start = end - len(line)
        where = f"line {number} (byte {start})" if number is not None else f"byte {start}"
        raise LogCorrupt(f"{path}: {where}: {error}") from None


class OpenLog:
    """A log read again and again as it grows, through one descriptor kept open (an `open` a
    look costs the event loop's thread a system call and the GIL each time)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def events(self, offset: int) -> Iterator[tuple[int, Event]]:
        """The events of the whole lines from byte `offset`, with the offset after each, as
        `iter_log` has them (a torn last line is not read; LogCorrupt for a line that is not an
        event, after the events before it)."""
        data = bytearray()
        while chunk := os.pread(self._fd, BLOCK_BYTES, offset + len(data)):
            data += chunk
        start = 0
        while (newline := data.find(b"\n", start)) >= 0:
            line = bytes(data[start : newline + 1])
            start = newline + 1
            yield offset + start, _decode_line(self.path, line, offset + start, None)

    def close(self) -> None:
        """Close the descriptor."""
        os.close(self._fd)


def iter_blocks(
    path: Path, offset: int = 0, line_at: int | None = None
) -> Iterator[tuple[int, list[Event]]]:
    """The events of a log from byte `offset`, a block of whole lines at a time: the offset
    after the block and its events. What a fold reads: one read and one decode per line, no
    generator step per event (`iter_lines` is the same log a line at a time).

    A torn last line is not read; at a corrupt line the events before it come as a block of
    their own, then LogCorrupt names the line as `iter_lines` does.
    """
    known = offset == 0 or line_at is not None
    number = line_at or 1
    decode = decode_event
    with open(path, "rb") as file:
        file.seek(offset)
        rest = b""
        while block := file.read(BLOCK_BYTES):
            if rest:
                block = rest + block
            cut = block.rfind(b"\n") + 1
            rest = block[cut:]
            if not cut:
                continue
            lines = block[: cut - 1].split(b"\n")
            events: list[Event] = []
            try:
                for line in lines:
                    events.append(decode(line))
            except EventDecodeError as error:
                bad = len(events)
                start = offset + sum(len(line) + 1 for line in lines[:bad])
                if events:
                    yield start, events
                where = f"line {number + bad} (byte {start})" if known else f"byte {start}"
                raise LogCorrupt(f"{path}: {where}: {error}") from None
            offset += cut
            number += len(lines)
            yield offset, events


def fold_log(path: Path, at: int | None = None) -> RunFold:
    """The fold of a log (up to its event `at`, all of it for None); LogCorrupt or FoldError
    when it does not fold."""
    folder = RunFold()
    for _, events in iter_blocks(path):
        if at is not None and events[-1].seq > at:
            folder.apply_all(event for event in events if event.seq <= at)
            break
        folder.apply_all(events)
    return folder


def read_log(path: Path) -> list[Event]:
    """The events of a whole log, in order."""
    return [event for _, events in iter_blocks(path) for event in events]


def whole_length(path: Path) -> int:
    """The length of a log up to its last newline: what a writer keeps of it."""
    with open(path, "rb") as file:
        data = file.read()
    return data.rfind(b"\n") + 1


class LogWriter:
    """The single writer of an event log: appends whole lines, fsynced before it returns.

    Opening truncates a torn last line left by a crash, so every line is whole. An append that
    fails (a full disk, an I/O error, a store that became read-only: the OSError is raised)
    leaves the log as it was: what it wrote of the lines is truncated again. Should that
    truncation fail too, the writer is `dirty` and the next append truncates first (and raises
    while it cannot), so a later line never follows a part of one.
    """

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fsync = fsync
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            keep = whole_length(path)
            if keep != os.fstat(self._fd).st_size:
                os.ftruncate(self._fd, keep)
        except BaseException:
            os.close(self._fd)
            raise
        self._length = keep
        self.dirty = False

    @property
    def length(self) -> int:
        """The length of the log as this writer wrote it: where its next append starts."""
        return self._length

    def size(self) -> int:
        """The size of the file now (larger than `length` when another process appended)."""
        return os.fstat(self._fd).st_size

    def append(self, *events: Event) -> list[bytes]:
        """Append events as whole lines, durable once this returns: their lines. On an OSError
        the log is left as it was before (see the class)."""
        lines = [encode_event(event) for event in events]
        data = b"".join(lines)
        if self.dirty:
            self._restore()
        try:
            written = 0
            while written < len(data):
                written += faults.write(self._fd, data[written:], self.path)
            if self.fsync:
                faults.fsync(self._fd, self.path)
        except OSError:
            with contextlib.suppress(OSError):  # else dirty: the next append truncates first
                self._restore()
            raise
        self._length += len(data)
        return lines

    def _restore(self) -> None:
        """Truncate the log to the whole lines it had before the last append."""
        self.dirty = True
        os.ftruncate(self._fd, self._length)
        if self.fsync:
            faults.fsync(self._fd, self.path)
        self.dirty = False

    def close(self) -> None:
        """Close the log."""
        os.close(self._fd)


def write_record_cache(paths: RunPaths, record: RunRecord) -> None:
    """Write `run.json`, the fold up to `record.seq`, atomically; not fsynced: a cache that
    cannot be read, or is older than the log, is folded again (`read_record_cache`)."""
    write_atomic(paths.cache, msgspec.json.encode(record), durable=False)


def read_record_cache(paths: RunPaths) -> RunRecord | None:
    """The cached fold of a run, None when missing or unreadable."""
    try:
        return msgspec.json.decode(paths.cache.read_bytes(), type=RunRecord)
    except (OSError, msgspec.DecodeError):
        return None
