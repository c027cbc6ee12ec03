"""The sources of a run in a pod: its snapshots installed as editable packages at the start.

A pod mounts the snapshots of its run read-only (`SIMRUN_EDITABLE`, a line per snapshot,
relative to the store or absolute). Before its work the harness installs each into its own
python, without dependencies, without build isolation and without an index (the image has
the dependencies and the build backends), from a writable shadow tree (`shadow_tree`) below
`SOURCES_DIR` of the temporary directory. A source may be a package this process imported
already, simrun itself when a run has the simrun repository as a source: its editable install
removes the package directory the imported modules came from. So the harness then starts again
(`restart`, the same command in a fresh interpreter) with `SOURCES_INSTALLED` set, and the new
interpreter imports the installed sources. A SIGTERM during the install kills the installer and
skips the restart: the harness stops (143).

The local backend sets no `SIMRUN_EDITABLE`: it installs the snapshots into a venv of the run
before its processes start (`simrun_api.backends.local_env`).
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Final

from simrun_core import launch as contract
from simrun_core.editable import (
    editable_arguments,
    installer_command,
    is_project,
    shadow_names,
)
from simrun_core.editable import (
    shadow_tree as _shadow_tree,
)
from simrun_harness.errors import ConfigurationError, HarnessError, Terminated
from simrun_harness.signals import HARNESS_STARTED, harness_started

SOURCES_DIR: Final = "simrun-sources"
"""The directory of the shadow trees below the temporary directory."""
SOURCES_INSTALLED: Final = "SIMRUN_SOURCES_INSTALLED"
"""Set (to 1) in the environment of the harness started again after the install."""
POLL_S: Final = 0.1
TAIL_LINES: Final = 20

__all__ = [
    "HARNESS_STARTED",
    "SOURCES_DIR",
    "SOURCES_INSTALLED",
    "install_editable",
    "install_sources",
    "prepare_sources",
    "shadow_tree",
    "sources_prepared",
]


def shadow_tree(source: Path, target: Path) -> Path:
    """A writable tree of a read-only one: its directories, links to its files.

    A build backend may write into the tree it builds (a version file, metadata, a build
    directory); it writes into the writable directories of the shadow, and never into the
    source. A link (to a file or a directory) of the source is a link to it in the shadow.
    `target`, the shadow, is replaced when it exists. Returns `target`.
    """
    return _shadow_tree(source, target)


def install_editable(
    snapshots: Sequence[str],
    python: str = sys.executable,
    root: Path | None = None,
    *,
    stop: threading.Event | None = None,
) -> None:
    """Install snapshots of sources as editable packages into `python`, without dependencies.

    The image has the dependencies and the build backends of the sources, so the snapshots are
    built without isolation and without an index: `uv pip install --python PY --no-deps
    --no-build-isolation --offline -e SHADOW...` when uv is there, else `PY -m pip install
    --no-deps --no-build-isolation --no-index -e SHADOW...`. Each is installed from a writable
    shadow tree below `root` (`SOURCES_DIR` below the temporary directory by default), named
    after its source. Nothing is installed without a snapshot, nor for a snapshot that is no
    Python project (`is_project`). The installer's output goes to
    stderr (the log of the pod); `stop`, once set, kills it.

    Raises:
        subprocess.CalledProcessError: The installation failed (its `output` the last lines of
            the installer's), or was stopped.
        FileNotFoundError: Neither uv nor pip is installed.
        OSError: A shadow tree cannot be created.
    """
    if not snapshots:
        return
    root = Path(tempfile.gettempdir()) / SOURCES_DIR if root is None else root
    shadows = [
        shadow_tree(Path(snapshot), root / name)
        for snapshot, name in zip(snapshots, shadow_names(snapshots), strict=True)
    ]
    shadows = [shadow for shadow in shadows if is_project(shadow)]
    if not shadows:
        return  # scripts only: their roots are on the import path
    found = installer_command(python)
    if found is None:
        raise FileNotFoundError("neither uv nor pip is installed to install the sources with")
    installer, command = found
    command += editable_arguments(installer, shadows, isolated=False)
    _run_installer(command, stop or threading.Event())


def install_sources(env: Mapping[str, str], stop: threading.Event) -> None:
    """Install the snapshots of `SIMRUN_EDITABLE`, then restart in a fresh interpreter.

    A source can be a package this process imported already (simrun itself): its editable
    install removes the package directory the imported modules came from, so a later import in
    this interpreter would fail. The command therefore starts again (`restart`) with
    `SOURCES_INSTALLED` set, and the new interpreter imports the installed sources. Nothing is
    done without snapshots or once `SOURCES_INSTALLED` is set. A SIGTERM during the install
    (`stop`) skips the restart, so the caller exits.

    Raises:
        subprocess.CalledProcessError: The installation failed.
        OSError: A shadow tree cannot be created, or neither uv nor pip is installed.
        simrun_core.launch.LaunchError: `SIMRUN_EDITABLE` names a relative path and
            `SIMRUN_TASK_DIR` (whose store it is relative to) is missing or malformed.
    """
    if env.get(SOURCES_INSTALLED):
        return
    snapshots = editable_paths(env)
    if not snapshots:
        return
    started = harness_started()
    try:
        install_editable(snapshots, stop=stop)
    except subprocess.CalledProcessError:
        if stop.is_set():
            return  # killed by the stop: no restart, the caller stops
        raise
    restart({**env, SOURCES_INSTALLED: "1", HARNESS_STARTED: repr(started)}, stop)


def editable_paths(env: Mapping[str, str]) -> list[str]:
    """The snapshots of `SIMRUN_EDITABLE` as paths here: a relative one below the store of
    `SIMRUN_TASK_DIR`."""
    view = contract.LaunchEnv(env)
    snapshots = view.editable
    if all(os.path.isabs(snapshot) for snapshot in snapshots):
        return list(snapshots)
    store = Path(view.task_dir).parents[3]
    return [str(store / snapshot) for snapshot in snapshots]


def prepare_sources(env: Mapping[str, str], stop: threading.Event) -> HarnessError | None:
    """`install_sources` for an entry point, which runs it before it imports the rest of the
    harness. It returns without snapshots to install, once they were installed (in the
    interpreter started again), or with the end to report in the harness's work
    (`sources_prepared`): a ConfigurationError naming why the sources cannot be installed (with
    the last lines of the installer), or Terminated after a stop during the install."""
    to_install = not env.get(SOURCES_INSTALLED) and bool(env.get(contract.EDITABLE, "").strip())
    try:
        install_sources(env, stop)
    except subprocess.CalledProcessError as error:
        tail = str(error.output or "").strip()
        program = Path(str(error.cmd[0])).name if error.cmd else "the installer"
        why = f"{program} exited with code {error.returncode}" + (f": {tail}" if tail else "")
        return ConfigurationError(f"the sources of the run cannot be installed: {why}")
    except (OSError, ValueError) as error:
        return ConfigurationError(f"the sources of the run cannot be installed: {error}")
    if to_install and stop.is_set():
        return Terminated("stopped on SIGTERM while the sources were installed")
    return None


def sources_prepared(end: HarnessError | None) -> None:
    """Raise the end `prepare_sources` returned, in the work of the harness (so it is
    reported); nothing when the sources are installed or there are none."""
    if end is not None:
        raise end


def restart(env: Mapping[str, str], stop: threading.Event | None = None) -> None:
    """Replace this process by a fresh interpreter running the same command with `env`, unless
    `stop` is set (then this returns).

    SIGTERM is blocked from before the last look at `stop` across the exec: a stop in between
    stays pending until the new interpreter's handler is installed (`signals.stop_on_sigterm`
    unblocks it), so it is never lost."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    argv = [sys.executable, *sys.orig_argv[1:]]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        if stop is not None and stop.is_set():
            return
        os.execve(sys.executable, argv, dict(env))
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _run_installer(command: list[str], stop: threading.Event) -> None:
    """Run the installer with its output passed on to stderr; CalledProcessError when it fails
    or `stop` killed it (its output the last lines)."""
    print(f"simrun: installing the sources: {' '.join(command)}", file=sys.stderr, flush=True)
    process = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    assert process.stdout is not None
    reader = threading.Thread(target=_pass_on, args=(process.stdout, tail), daemon=True)
    reader.start()
    stopped = False
    while process.poll() is None:
        if stop.wait(POLL_S):
            stopped = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reader.join(timeout=5)
    if stopped:
        tail.append("stopped on SIGTERM")
    if process.returncode != 0 or stopped:
        raise subprocess.CalledProcessError(process.returncode, command, output="\n".join(tail))


def _pass_on(stream: IO[bytes], tail: collections.deque[str]) -> None:
    for raw in stream:
        line = raw.decode(errors="replace").rstrip("\n")
        tail.append(line)
        with contextlib.suppress(OSError, ValueError):
            print(line, file=sys.stderr, flush=True)
    stream.close()
