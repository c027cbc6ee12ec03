"""The entry point `simrun-exec`: the command of an unsplit plugin task (a type with `command`).

`python -m simrun_harness.exec` runs it too. It stages the inputs of `SIMRUN_STAGE` into
scratch, expands the type's argv template (`{settings}`, `{out}`, `{input}` as `port=path`, a
staged port as `<scratch>/<port>`), sets `OMP_NUM_THREADS`, `OPENBLAS_NUM_THREADS` and
`MKL_NUM_THREADS` to 1 and runs the command as its child, whose stdout and stderr pass
through; it gets `SIMRUN_CORES`, the processes it is sized for (1, or those the cores and the
memory allow for a type with `uses_cores`), and the rest of the environment of the harness,
`SIMRUN_PROVENANCE` included. A SIGTERM is passed on to the command, which is killed after
`SIMRUN_GRACE_S`. The memory of the harness and the command is sampled every
`SIMRUN_MEMORY_SAMPLE_S` for the report; with `SIMRUN_MEMORY_SOURCE=process` a command above
`SIMRUN_MEMORY_LIMIT_GB` is killed for its memory, as the kernel does in a pod's cgroup.

Exit codes: 0 done, 3 the command failed, 4 a configuration error (also a command that cannot
be started), 137 the command was killed by SIGKILL (for its memory: `oom_kills` in the report)
or exited 137, 143 stopped on SIGTERM. The report is written in every case.
"""

from __future__ import annotations

import os

from simrun_harness.signals import exit_now, harness_started, stop_on_sigterm


def main(started: float | None = None) -> None:
    """Run `simrun-exec` for the task of `SIMRUN_TASK_DIR`; exit with its code.

    The worker id of its event log and report is `SIMRUN_WORKER`, else the task id.
    `started`: when the process took up its task (a spare, `simrun_harness.spare`); else the
    start of the process.
    """
    stop = stop_on_sigterm()
    started = harness_started() if started is None else started
    from simrun_harness.sources import prepare_sources, sources_prepared

    sources = prepare_sources(os.environ, stop)
    from simrun_harness.command import run_command
    from simrun_harness.entry import run_harness_process
    from simrun_harness.env import Identity
    from simrun_harness.report import EventLog, Tally

    environ = dict(os.environ)

    def work(identity: Identity, log: EventLog, tally: Tally) -> None:
        sources_prepared(sources)
        run_command(environ, tally, stop)

    code = run_harness_process(
        "simrun-exec",
        environ,
        work,
        started=started,
        children_cpu=True,
    )
    exit_now(code)


if __name__ == "__main__":
    main()
