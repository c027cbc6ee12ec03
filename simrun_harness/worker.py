"""The entry points `simrun-worker` and `simrun-merge` of a split task.

`python -m simrun_harness.worker` runs `simrun-worker` (the local backend starts it so).
SIGTERM is handled before anything else is imported, so a stop during the start is seen, and
the start of the process is taken for the report (`started`, `prepare_seconds`).
The input ports of `SIMRUN_STAGE` are copied into `SIMRUN_SCRATCH` before the work, and the
task reads them there (`simrun_harness.stage.staged_task`).
Exit codes: 0 done, 3 a unit (or the merge) failed, 4 a configuration error, 137 a process
of the pool died, 143 stopped on SIGTERM; 1 an unexpected error of the harness itself.
"""

from __future__ import annotations

import os
import sys

from simrun_harness.signals import exit_now, harness_started, stop_on_sigterm


def main(started: float | None = None) -> None:
    """Run `simrun-worker`: compute units of the ledger of `SIMRUN_TASK_DIR`; exit with its code.

    `SIMRUN_ROLE=base` is the coordinator: it returns once the ledger is complete (releasing
    stale claims and computing them) and, with `SIMRUN_MERGE=1`, merges. `extra` (the default)
    returns when nothing is pending. `started`: when the process took up its task (a spare,
    `simrun_harness.spare`); else the start of the process.
    """
    stop = stop_on_sigterm()
    started = harness_started() if started is None else started
    from simrun_harness.sources import prepare_sources, sources_prepared

    sources = prepare_sources(os.environ, stop)
    from simrun_harness.entry import run_harness_process
    from simrun_harness.env import (
        Identity,
        launch_from_env,
        sizing_from_env,
        task_from_env,
        timing_from_env,
    )
    from simrun_harness.errors import ConfigurationError
    from simrun_harness.report import EventLog, Tally
    from simrun_harness.split import run_worker
    from simrun_harness.stage import staged_task

    environ = dict(os.environ)

    def work(identity: Identity, log: EventLog, tally: Tally) -> None:
        sources_prepared(sources)
        launch = launch_from_env(environ, identity.worker)
        task = task_from_env(launch, "split")
        timing = timing_from_env(launch)
        # The ports the task stages are copied into scratch before its units: they read the
        # copies (`paths.inputs`), as a command of `simrun-exec` does.
        task = staged_task(task, launch.stage, stop)
        coordinator = launch.role == "base"
        merge = launch.merge
        if merge and not coordinator:
            raise ConfigurationError("SIMRUN_MERGE: only the coordinator (SIMRUN_ROLE=base) merges")
        sizing = sizing_from_env(launch, task.task_type)
        tally.processes = sizing.processes
        tally.memory_limit_bytes = sizing.memory_limit_bytes
        tally.per_worker_gb = sizing.per_worker_gb
        run_worker(
            task,
            identity.worker,
            log=log,
            tally=tally,
            sizing=sizing,
            timing=timing,
            stop=stop,
            coordinator=coordinator,
            merge=merge,
        )

    exit_now(run_harness_process("simrun-worker", environ, work, started=started))


def merge_main() -> None:
    """Run `simrun-merge`: merge the units once the ledger is complete; exit with its code.

    The worker id defaults to `merge`. Exit codes: 0 merged, 3 units are missing (named) or the
    merge failed, 4 a configuration error, 143 stopped on SIGTERM before the merge.
    """
    stop = stop_on_sigterm()
    started = harness_started()
    from simrun_harness.sources import prepare_sources, sources_prepared

    sources = prepare_sources(os.environ, stop)
    from simrun_harness.entry import run_harness_process
    from simrun_harness.env import Identity, launch_from_env, task_from_env
    from simrun_harness.merge import ledger_of, run_merge
    from simrun_harness.report import EventLog, Tally
    from simrun_harness.stage import staged_task

    environ = dict(os.environ)

    def work(identity: Identity, log: EventLog, tally: Tally) -> None:
        sources_prepared(sources)
        launch = launch_from_env(environ, identity.worker)
        task = staged_task(task_from_env(launch, "split"), launch.stage, stop)
        ledger = ledger_of(task)
        tally.work_begins()
        run_merge(task, ledger, identity.worker, log, stop)

    sys.exit(
        run_harness_process("simrun-merge", environ, work, started=started, default_worker="merge")
    )


if __name__ == "__main__":
    main()
