"""The work of `simrun-exec`: stage, expand the argv template, run the command, map its end.

The command is sized as one process, or, for a type with `uses_cores`, as the processes the
cores and the memory allow (like a worker); it learns that number as `SIMRUN_CORES`, so a pool
of its own can size itself. Its environment is the harness's (`SIMRUN_PROVENANCE` included)
with the thread variables of BLAS and OpenMP set to 1. Where the limit is real
(`SIMRUN_MEMORY_ENFORCED=1`) but no cgroup of its own enforces it
(`SIMRUN_MEMORY_SOURCE=process`), a command whose process tree holds more anonymous memory than
`SIMRUN_MEMORY_LIMIT_GB` is killed (`MemoryGuard`) and counted as a kill for memory (exit 137).
Locally (not enforced) nothing kills it for its memory but the machine's out of memory killer.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping

from simrun_core import exits
from simrun_core.argv import TemplateError, expand_argv
from simrun_core.launch import MEMORY_LIMIT_GB, THREAD_VARIABLES
from simrun_harness.env import (
    enforced_limit,
    launch_from_env,
    memory_limit,
    memory_per_worker_gb,
    sizing_from_env,
    task_from_env,
    timing_from_env,
)
from simrun_harness.errors import CommandFailed, ConfigurationError, Killed, Terminated
from simrun_harness.memory import MemoryGuard
from simrun_harness.periodic import Periodic
from simrun_harness.report import Tally, say
from simrun_harness.stage import stage

TICK_S = 0.1


def run_command(environ: Mapping[str, str], tally: Tally, stop: threading.Event) -> None:
    """Run the command of the unsplit task the environment names (see `simrun_harness.exec`).

    Raises ConfigurationError (also for a command that cannot be started), Terminated,
    Killed or CommandFailed; returns when the command exited 0.
    """
    launch = launch_from_env(environ)
    task = task_from_env(launch, "command")
    task_type = task.task_type
    assert task_type.command is not None
    timing = timing_from_env(launch)
    source = launch.memory_source
    if task_type.uses_cores:
        tally.processes = sizing_from_env(launch, task_type).processes
    tally.memory_limit_bytes = memory_limit(launch, source)
    tally.per_worker_gb = memory_per_worker_gb(launch, task_type)
    command_limit = enforced_limit(launch, source, MEMORY_LIMIT_GB)
    ports = list(launch.stage)
    inputs = {port: str(path) for port, path in task.paths.inputs.items()}
    inputs.update({port: str(task.paths.scratch / port) for port in ports})
    try:
        argv = expand_argv(task_type.command, str(task.settings_path), str(task.paths.out), inputs)
    except TemplateError as error:
        raise ConfigurationError(f"the command of {task_type.name!r}: {error}") from None
    stage({port: task.paths.inputs[port] for port in ports}, task.paths.scratch, stop)
    task.paths.out.mkdir(parents=True, exist_ok=True)
    if stop.is_set():
        raise Terminated("stopped on SIGTERM before the command started")
    child_env = {
        **environ,
        **dict.fromkeys(THREAD_VARIABLES, "1"),
        "SIMRUN_CORES": str(tally.processes),
    }
    tally.work_begins()
    say(launch.worker, f"running the command: {shown_command(argv)}")
    began = time.monotonic()
    try:
        child = subprocess.Popen(argv, env=child_env)
    except OSError as error:
        raise ConfigurationError(
            f"cannot start the command {argv[0]!r}: {error.strerror or error}"
        ) from None
    watch = tally.memory.sample
    if command_limit is not None:
        guard = MemoryGuard(
            command_limit,
            lambda: [child.pid] if child.returncode is None else [],
            tally.oom,
            what="the command",
            limit_name=f"{MEMORY_LIMIT_GB}={environ[MEMORY_LIMIT_GB]}",
        )

        def watch() -> None:
            tally.memory.sample()
            guard.check()

    with Periodic(timing.memory_sample_s, watch, "memory"):
        returncode = wait_passing_sigterm(child, stop, timing.grace_s)
    raise_for_returncode(
        returncode,
        argv,
        stopped=stop.is_set(),
        oom_kills=tally.oom.kills(),
        oom_cause=tally.oom.last_kill(),
    )
    say(launch.worker, f"the command ended with exit code 0 after {time.monotonic() - began:.2f} s")


def wait_passing_sigterm(
    child: subprocess.Popen[bytes], stop: threading.Event, grace_s: float
) -> int:
    """Wait for the child; on a stop, SIGTERM it and SIGKILL it `grace_s` later. Its code."""
    signalled_at: float | None = None
    killed = False
    while True:
        try:
            return child.wait(timeout=TICK_S)
        except subprocess.TimeoutExpired:
            pass
        if not stop.is_set():
            continue
        if signalled_at is None:
            child.send_signal(signal.SIGTERM)
            signalled_at = time.monotonic()
        elif not killed and time.monotonic() - signalled_at >= grace_s:
            child.kill()
            killed = True


def raise_for_returncode(
    returncode: int,
    argv: list[str],
    *,
    stopped: bool,
    oom_kills: int = 0,
    oom_cause: str | None = None,
) -> None:
    """Map the end of the command to the harness's: nothing for 0, else the error to raise.

    After a SIGTERM to the harness any error is the stop (143); otherwise SIGKILL or exit 137
    is a kill (137), SIGTERM or exit 143 a stop (143), and anything else a failure (3). The
    message of a kill names the kills for memory (`oom_cause`, what the harness found when it
    killed, else the count of the cgroup's).
    """
    if returncode == 0:
        return
    how = describe_returncode(returncode)
    if stopped:
        raise Terminated(f"stopped on SIGTERM; the command ended with {how}")
    if returncode in (-signal.SIGKILL, exits.KILLED):
        if oom_cause:
            evidence = f"; {oom_cause}"
        elif oom_kills:
            evidence = f", {oom_kills} out of memory kills in the cgroup"
        else:
            evidence = ""
        raise Killed(f"the command was killed: {how}{evidence}")
    if returncode in (-signal.SIGTERM, exits.TERMINATED):
        raise Terminated(f"the command was stopped: {how}")
    raise CommandFailed(f"the command failed with {how}: {shown_command(argv)}")


def shown_command(argv: list[str]) -> str:
    """The command as a shell would take it, cut at 200 characters for a message."""
    command = shlex.join(argv)
    return command if len(command) <= 200 else command[:197] + "..."


def describe_returncode(returncode: int) -> str:
    """`exit code N`, or `signal NAME` for a child killed by a signal."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"signal {signal.Signals(-returncode).name}"
    except ValueError:
        return f"signal {-returncode}"
