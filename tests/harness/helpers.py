"""Helpers of the harness tests: a task directory in a temporary store and its processes."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from live_service import wait_until  # noqa: F401 - shared with the tests here

from simrun_core.events import UNITS_EVENTS, Event, UnitStarted, WorkerReport, done_units
from simrun_core.store import read_log
from simrun_harness.ledger import Ledger

RUN_ID = "20260101-000000-abcdef"
SCRIPTS = Path(sysconfig.get_path("scripts"))
PLUGINS = Path(__file__).with_name("plugins")


def script(name: str) -> str:
    """The path of an installed console script of simrun (no shim in between)."""
    path = SCRIPTS / name
    assert path.exists(), f"{path} is not installed: pip install -e '.[dev]'"
    return str(path)


@dataclasses.dataclass
class HarnessTask:
    """A task directory `<store>/runs/<run>/tasks/<task>` and the environment of its harness."""

    store: Path
    task_dir: Path
    env: dict[str, str]
    processes: list[subprocess.Popen[str]] = dataclasses.field(default_factory=list)

    def environment(self, **changes: str | None) -> dict[str, str]:
        """The base environment with changes; a value of None removes the variable."""
        env = dict(self.env)
        for name, value in changes.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def run(self, name: str, timeout: float = 30.0, **env: str | None) -> subprocess.Popen[str]:
        """Run a console script to its end; the process with `stderr` read."""
        process = self.start(name, **env)
        return self.finish(process, name, timeout)

    def finish(
        self, process: subprocess.Popen[str], name: str = "the harness", timeout: float = 30.0
    ) -> subprocess.Popen[str]:
        """Wait for a started process to end; the process with `stderr` read."""
        try:
            _, process.stderr_text = process.communicate(timeout=timeout)  # type: ignore[attr-defined]
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            pytest.fail(f"{name} did not end within {timeout} s")
        return process

    def start(
        self, name: str, *, block_sigterm: bool = False, **env: str | None
    ) -> subprocess.Popen[str]:
        """Start a console script in its own process group, stderr captured.

        `block_sigterm` starts it with SIGTERM blocked, so a SIGTERM sent at once stays
        pending until the harness unblocks it (see `simrun_harness.signals`).
        """
        process = subprocess.Popen(
            [script(name)],
            env=self.environment(**env),
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=_block_sigterm if block_sigterm else None,
        )
        self.processes.append(process)
        return process

    def end_processes(self) -> None:
        """Kill what the test left running (each started in a process group of its own)."""
        for process in self.processes:
            kill_group(process)

    def log_path(self, worker: str = "w0", attempt: int = 0) -> Path:
        return self.task_dir / "events" / f"{worker}.{attempt}.jsonl"

    def events(self, worker: str = "w0", attempt: int = 0) -> list[Event]:
        """The events of the log of one worker attempt ([] before it exists)."""
        path = self.log_path(worker, attempt)
        return read_log(path) if path.exists() else []

    def report(self, worker: str = "w0", attempt: int = 0) -> WorkerReport:
        """The one report of a worker attempt, which must be its last event."""
        events = self.events(worker, attempt)
        reports = [event for event in events if isinstance(event, WorkerReport)]
        assert len(reports) == 1, f"expected one report, got {events}"
        assert events[-1] is reports[0]
        return reports[0]

    def units_done(self, worker: str = "w0", attempt: int = 0) -> list[int]:
        """The indices the worker's events record done, in the order of its log."""
        events = self.events(worker, attempt)
        return [i for e in events if isinstance(e, UNITS_EVENTS) for i, _ in done_units(e)]

    def units_started(self, worker: str = "w0", attempt: int = 0) -> list[int]:
        return [e.index for e in self.events(worker, attempt) if isinstance(e, UnitStarted)]

    def ledger(self, n_units: int) -> Ledger:
        return Ledger(self.task_dir / "ledger", n_units)

    def summary(self) -> dict[str, Any]:
        return json.loads((self.task_dir / "out" / "summary.json").read_text())

    def out_files(self) -> dict[str, bytes]:
        """Every file below `out/` (hidden ones included) by relative path, with its bytes."""
        out = self.task_dir / "out"
        return {
            str(path.relative_to(out)): path.read_bytes()
            for path in sorted(out.rglob("*"))
            if path.is_file()
        }


def make_harness_task(
    root: Path, settings: dict[str, Any], task_type: str = "demo.squares", task: str = "squares"
) -> HarnessTask:
    """Write `settings.json` of a task below `root/store` and the environment of its harness."""
    store = root / "store"
    task_dir = store / "runs" / RUN_ID / "tasks" / task
    task_dir.mkdir(parents=True)
    (task_dir / "settings.json").write_text(json.dumps(settings))
    env = {name: value for name, value in os.environ.items() if not name.startswith("SIMRUN_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), env.get("PYTHONPATH")]))
    env.update(
        SIMRUN_TASK_DIR=str(task_dir),
        SIMRUN_TASK_TYPE=task_type,
        SIMRUN_WORKER="w0",
        SIMRUN_ATTEMPT="0",
        SIMRUN_ROLE="base",
        SIMRUN_MERGE="1",
        SIMRUN_NODE="test-node",
        SIMRUN_CORES="2",
        SIMRUN_MEMORY_SOURCE="process",
        SIMRUN_HEARTBEAT_S="0.2",
        SIMRUN_GRACE_S="5",
        SIMRUN_SCRATCH=str(root / "scratch"),
    )
    return HarnessTask(store, task_dir, env)


def make_cgroup(root: Path, **files: str) -> Path:
    """A fixture cgroup v2 mount at `root` (for `SIMRUN_CGROUP_ROOT`), its files given by name
    with `.` as `_` (`memory_stat="anon 5\n"`). The harness's `/proc/self/cgroup` path is not
    below it, so the harness takes the mount itself as its cgroup."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    write_cgroup(root, **files)
    return root


def write_cgroup(root: Path, **files: str) -> None:
    """Write files of a fixture cgroup, each through a rename so a reader never sees half."""
    for name, text in files.items():
        path = root / name.replace("_", ".", 1)
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text(text)
        temporary.replace(path)


def sigterm_caught(pid: int) -> bool:
    """Whether a process has a handler for SIGTERM (`SigCgt` of its status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def pool_processes(worker: subprocess.Popen[str]) -> list[int]:
    """The processes of a worker's pool: its descendants running its own command line."""
    command = Path(f"/proc/{worker.pid}/cmdline").read_bytes()
    return [pid for pid in descendants(worker.pid) if cmdline(pid) == command]


def cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether a process exists and is no zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _block_sigterm() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


def descendants(pid: int) -> list[int]:
    """The live descendants of a process, from the parent pids of /proc (independent of the
    harness's own reading of procfs)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        frontier += children
    return found


def kill_group(process: subprocess.Popen[str]) -> None:
    """End a test's process group, whatever it left running."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()


def ledger_entries(root: Path, kind: str, shard_units: int = 1000) -> dict[str, str]:
    """The entries of a ledger's `claim/`, `release/` or `done/` below `root`, read from the
    files alone (not through `Ledger`): by name, the worker each names (its link's target).
    Asserts the layout: each entry is a link in the shard directory of its index (`index //
    shard_units`), and the directory holds nothing but shards."""
    entries: dict[str, str] = {}
    directory = root / kind
    for shard in os.listdir(directory):
        assert shard.isdigit() and (directory / shard).is_dir(), f"{kind}/{shard}: no shard"
        for name in os.listdir(directory / shard):
            path = directory / shard / name
            index = int(name.split(".")[0])
            assert index // shard_units == int(shard), f"{kind}/{shard}/{name}: not in its shard"
            assert path.is_symlink(), f"{kind}/{shard}/{name}: no link"
            entries[name] = os.readlink(path)
    return entries


def ledger_entry(root: Path, kind: str, name: str) -> Path:
    """The path of a ledger's entry `name` (`<index>.<epoch>` or `<index>`) in `kind`:
    `<kind>/<index // 1000>/<name>`."""
    return root / kind / str(int(name.split(".")[0]) // 1000) / name
