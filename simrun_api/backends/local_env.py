"""The environment of a local run with snapshots: a venv of the run.

A run of the local backend with snapshots (`--snapshot`) must not install them into the
environment of the service, the one of the user. The backend creates a venv per run in
`.simrun/envs/<run>/venv` (the standard library's `venv`, without pip: it takes a tenth of a
second), which sees the packages of the service through a path file (`BASE_PTH`, which adds the
site directories of the service's python, `base_site_dirs`, with their own path files, so the
editable installs of the service's environment stay importable), installs the snapshots into
it as editable packages from shadow trees in `.simrun/envs/<run>/sources/<source>`
(`simrun_core.editable.shadow_tree`), and starts the harness with its python; a `command` task
finds it first on `PATH`. The venv is removed at the end of the run.

The snapshots are installed without their dependencies, which the environment of the service
has, with uv (on `PATH` or the `uv` package), else with the pip the venv sees of the service's
environment (`installer`); their build backends come from the index or the cache of the
installer, as for any build. The path file sorts after the path files of the editable installs
(`zz-...`), so the snapshots come first on `sys.path`, before an installed copy of the same
package in the environment of the service.

Layout of `<envs>/<run>/`: `venv/`, `sources/<source>/` (the shadow trees), `ready` (written
last: what the environment was created of, so a resumed run reuses a complete one).

A submission whose tasks have a type only its snapshots define makes the venv of its run
already (`simrun_api.snapshot_types`), to ask it about the type with the probe of task types
(`probe_types`, `simrun_harness.types_probe` run with the venv's python); the backend then
finds it complete (`is_ready`) and runs the run in it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import site
import subprocess
import sys
import sysconfig
import time
import venv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from simrun_core.editable import (
    Installer,
    editable_arguments,
    installer_command,
    is_project,
    remove_tree,
    shadow_names,
    shadow_tree,
)
from simrun_core.launch import EDITABLE

BASE_PTH: Final = "zz-simrun-base.pth"
"""The path file in the venv's site-packages that adds the site directories of the service."""
VENV: Final = "venv"
SOURCES: Final = "sources"
READY: Final = "ready"
POLL_S: Final = 0.1
TAIL_LINES: Final = 15
TAIL_CHARS: Final = 2000
PROBE_MODULE: Final = "simrun_harness.types_probe"
PROBE_TIMEOUT_S: Final = 120.0


class RunEnvironmentError(Exception):
    """The venv of a run cannot be created or the snapshots cannot be installed."""


def base_site_dirs() -> list[str]:
    """The site directories of this interpreter, the user site when enabled.

    Those of its prefix (a venv's site-packages; with `include-system-site-packages` also the
    base interpreter's), then the user site when it is enabled and there, each once."""
    dirs = list(site.getsitepackages())
    if sys.prefix != sys.base_prefix and _includes_system_site():
        dirs += site.getsitepackages([sys.base_prefix, sys.base_exec_prefix])
    if site.ENABLE_USER_SITE:
        user = site.getusersitepackages()
        if os.path.isdir(user):
            dirs.append(user)
    seen: list[str] = []
    for directory in dirs:
        if directory not in seen and os.path.isdir(directory):
            seen.append(directory)
    return seen


def installer(python: Path) -> list[str]:
    """The command which installs into the venv of `python`, before its arguments: `uv pip
    install --python PY` with uv on `PATH` or the `uv` package, else `PY -m pip install`, the
    pip of the service's environment, which the venv sees.

    Raises:
        RunEnvironmentError: Neither uv nor pip is installed.
    """
    return _installer(python)[1]


def _installer(python: Path) -> tuple[Installer, list[str]]:
    found = installer_command(python)
    if found is None:
        raise RunEnvironmentError(
            "neither uv nor pip is installed in the environment of the service to install the "
            "snapshots with: install uv (or pip)"
        )
    return found


def python_of(directory: Path) -> Path:
    """The python of the venv of the environment `directory`."""
    return directory / VENV / "bin" / "python"


def bin_of(directory: Path) -> Path:
    """The directory of the venv's programs, first on `PATH` of the run's processes."""
    return directory / VENV / "bin"


def sources_of(directory: Path, snapshots: Sequence[str]) -> list[Path]:
    """The shadow trees of the snapshots in the environment `directory`, in their order."""
    return [directory / SOURCES / name for name in shadow_names(snapshots)]


def is_ready(directory: Path, snapshots: Sequence[str]) -> bool:
    """Whether `directory` holds a complete environment of these snapshots for this service's
    python (a run resumed by a service started again reuses it)."""
    try:
        ready = json.loads((directory / READY).read_text())
    except (OSError, ValueError):
        return False
    return ready == _identity(snapshots) and python_of(directory).exists()


def create(
    directory: Path,
    snapshots: list[str],
    log: Path,
    cancelled: Callable[[], bool] = lambda: False,
) -> Path:
    """Create the venv of a run and install its snapshots into it.

    Args:
        directory: The directory of the environment of the run, replaced.
        snapshots: The paths of the snapshots.
        log: The file the output of the installer is appended to.
        cancelled: Polled while the installer runs; when it holds, the installer is killed.

    Returns:
        The python of the venv.

    Raises:
        RunEnvironmentError: The venv cannot be created, there is no installer, or the
            installation failed or was cancelled; the message has the installer's last lines.
    """
    try:
        remove_tree(directory)
        directory.mkdir(parents=True)
        venv.EnvBuilder(with_pip=False, symlinks=True, clear=True).create(directory / VENV)
        python = python_of(directory)
        site_packages = Path(_venv_purelib(directory / VENV))
        site_packages.mkdir(parents=True, exist_ok=True)
        lines = [f"import site; site.addsitedir({path!r})" for path in base_site_dirs()]
        (site_packages / BASE_PTH).write_text("".join(line + "\n" for line in lines))
    except (OSError, subprocess.CalledProcessError) as error:
        raise RunEnvironmentError(
            f"the venv {directory / VENV} cannot be created: {error}"
        ) from None
    try:
        shadows = [
            shadow_tree(Path(snapshot), shadow)
            for snapshot, shadow in zip(snapshots, sources_of(directory, snapshots), strict=True)
        ]
    except OSError as error:
        raise RunEnvironmentError(
            f"a shadow tree of the snapshots cannot be made: {error}"
        ) from None
    projects = [shadow for shadow in shadows if is_project(shadow)]
    if projects:
        kind, command = _installer(python)
        command += editable_arguments(kind, projects, isolated=True)
        _install(kind, command, directory / VENV, log, cancelled)
    (directory / READY).write_text(json.dumps(_identity(snapshots)))
    return python


def remove(directory: Path) -> None:
    """Remove the environment of a run, if it is there; an error is logged by the caller."""
    remove_tree(directory)


def probe_types(
    directory: Path, tasks: bytes, import_root: Path | None, timeout_s: float = PROBE_TIMEOUT_S
) -> bytes:
    """Run the probe of task types (`simrun_harness.types_probe`) with the python of the
    environment `directory`, as a harness of the run would run (its programs first on `PATH`,
    `import_root` first on `PYTHONPATH`): `tasks` (JSON) on its stdin, its answer (stdout).

    Raises:
        RunEnvironmentError: The probe cannot start, failed or took longer than `timeout_s`
            (then killed with its process group); the message has the last lines of its
            stderr.
    """
    env = dict(os.environ)
    for variable in ("PYTHONHOME", EDITABLE):
        env.pop(variable, None)
    env["VIRTUAL_ENV"] = str(directory / VENV)
    env["PATH"] = os.pathsep.join(filter(None, [str(bin_of(directory)), env.get("PATH")]))
    if import_root is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(import_root), env.get("PYTHONPATH")]))
    command = [str(python_of(directory)), "-m", PROBE_MODULE]
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=directory,
            start_new_session=True,
        )
    except OSError as error:
        raise RunEnvironmentError(f"the probe of the task types cannot start: {error}") from None
    try:
        out, err = process.communicate(tasks, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise RunEnvironmentError(
            f"the probe of the task types took longer than {timeout_s:g} s"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # what the plugin may have left running
    if process.returncode != 0:
        lines = [line.strip() for line in err.decode(errors="replace").splitlines()]
        tail = " | ".join(line for line in lines if line)[-TAIL_CHARS:] or "(no output)"
        raise RunEnvironmentError(
            f"the probe of the task types exited with code {process.returncode}: {tail}"
        )
    return out


def _install(
    program: Installer,
    command: list[str],
    venv_dir: Path,
    log: Path,
    cancelled: Callable[[], bool],
) -> None:
    """Run the installer with its output appended to `log`; RunEnvironmentError with the last
    lines of its output when it fails or is cancelled (then killed with its process group)."""
    env = dict(os.environ)
    for variable in ("PIP_TARGET", "PIP_PREFIX", "PIP_ROOT", "PIP_USER", "PYTHONHOME"):
        env.pop(variable, None)
    env["VIRTUAL_ENV"] = str(venv_dir)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as output:
        start = output.tell()
        output.write(f"$ {' '.join(command)}\n".encode())
        output.flush()
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as error:
            raise RunEnvironmentError(f"the installer {command[0]} cannot start: {error}") from None
        stopped = False
        while process.poll() is None:
            if cancelled():
                stopped = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                break
            time.sleep(POLL_S)
    if stopped:
        raise RunEnvironmentError(f"the installation of the snapshots with {program} was cancelled")
    if process.returncode != 0:
        tail = _tail(log, start)
        raise RunEnvironmentError(
            f"{program} exited with code {process.returncode} installing the snapshots "
            f"(log {log}): {tail}"
        )


def _tail(log: Path, start: int) -> str:
    """The last lines the installer wrote into the log (after `start`), joined by ' | '."""
    try:
        with open(log, "rb") as stream:
            stream.seek(start)
            text = stream.read().decode(errors="replace")
    except OSError:
        return "(its output cannot be read)"
    lines = [line.strip() for line in text.splitlines()[1:] if line.strip()]
    return " | ".join(lines[-TAIL_LINES:])[-TAIL_CHARS:] or "(no output)"


def _identity(snapshots: Sequence[str]) -> dict[str, object]:
    """What an environment is created of: the snapshots, the python and its site dirs."""
    return {"snapshots": list(snapshots), "python": sys.executable, "site": base_site_dirs()}


def _venv_purelib(venv_dir: Path) -> str:
    """The site-packages of a venv (as `venv` computes it)."""
    base = str(venv_dir)
    paths = {"base": base, "platbase": base, "installed_base": base, "installed_platbase": base}
    if "venv" in sysconfig.get_scheme_names():
        return sysconfig.get_path("purelib", scheme="venv", vars=paths)
    return sysconfig.get_path("purelib", scheme="posix_prefix", vars=paths)


def _includes_system_site() -> bool:
    """Whether this interpreter's venv includes the system site-packages (`pyvenv.cfg`)."""
    try:
        text = (Path(sys.prefix) / "pyvenv.cfg").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "include-system-site-packages":
            return value.strip().lower() == "true"
    return False
