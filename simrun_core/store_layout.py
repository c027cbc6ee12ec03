"""The layout of the run store, `<store>/runs/<run>/`: its one definition, as names.

`simrun_core.store.RunPaths` gives the paths of one run on the service's file system; the
launch contract (`simrun_core.launch`) names the same places as a pod sees them, relative to
the store. Pure: names, no I/O (the harness imports it at its start).

- `runs/<run>/events.jsonl`: the run's event log, the truth.
- `runs/<run>/tasks/<task>/`: a task: `settings.json`, `provenance.json`, `out/` (its outputs,
  a directory per port), `logs/`, `events/`, `ledger/`.
- `runs/.removed-<run>/`: a run's directory while it is being removed.
"""

from __future__ import annotations

from typing import Final

RUNS: Final = "runs"
TASKS: Final = "tasks"
EVENTS: Final = "events.jsonl"
OUT: Final = "out"
LOGS: Final = "logs"
SETTINGS_FILE: Final = "settings.json"
PROVENANCE_FILE: Final = "provenance.json"
REMOVED_PREFIX: Final = ".removed-"
ENVIRONMENT_LOG: Final = "environment.log"
"""The output of the installer of a run's venv (local mode), in the run's directory."""


def run_path(run_id: str) -> str:
    """The directory of a run relative to the store, `runs/<run>`."""
    return f"{RUNS}/{run_id}"


def task_path(run_id: str, task: str) -> str:
    """The directory of a task relative to the store, `runs/<run>/tasks/<task>`."""
    return f"{run_path(run_id)}/{TASKS}/{task}"


def output_path(run_id: str, task: str, path: str = "") -> str:
    """A file of the outputs of a task (or with no `path` their directory) relative to the
    store, `runs/<run>/tasks/<task>/out/<path>`: how the API, the command line and the MCP tools
    name output files, so a client that mounts the store opens one as `store / path`. `path`
    is relative to the task's `out/`."""
    directory = f"{task_path(run_id, task)}/{OUT}"
    return f"{directory}/{path}" if path else directory
