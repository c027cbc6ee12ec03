"""The entry point `simrun-exec`: the command of an unsplit plugin task (a type with `command`).

`python -m simrun_harness.exec` runs it too. It stages the inputs of `SIMRUN_STAGE` into
scratch, expands the type's argv template (`{settings}`, `{out}`, `{input}` as `port=path`, a
staged port as `<scratch>/<port>`), sets `OMP_NUM_THREADS`, `OPENBLAS_NUM_THREADS` and
`MKL_NUM_THREADS` to 1 and runs the command as its child, whose stdout and stderr pass
through. A SIGTERM is passed on to the command, which is killed after `SIMRUN_GRACE_S`.
The memory of the harness and the command is sampled for the report.

Exit codes: 0 done, 3 the command failed, 4 a configuration error (also a command that cannot
be started), 137 the command was killed by SIGKILL or exited 137, 143 stopped on SIGTERM.
"""

from __future__ import annotations

import os
import sys

from simrun_harness.signals import stop_on_sigterm


def main() -> None:
    """Run `simrun-exec` for the task of `SIMRUN_TASK_DIR`; exit with its code.

    The worker id of its event log and report is `SIMRUN_WORKER`, else the task id.
    """
    stop = stop_on_sigterm()
    from simrun_harness.command import run_command
    from simrun_harness.entry import run_harness_process

    environ = dict(os.environ)
    code = run_harness_process(
        "simrun-exec",
        environ,
        lambda identity, log, tally: run_command(environ, tally, stop),
        children_cpu=True,
    )
    sys.exit(code)


if __name__ == "__main__":
    main()
