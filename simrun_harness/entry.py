"""The life of a harness process: identity, event log, tally, work, one report, exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping

from simrun_harness.env import Identity, identity_from_env, memory_source, usage_cgroup
from simrun_harness.errors import ConfigurationError
from simrun_harness.memory import CpuThrottle, MemorySampler, OomKillCounter
from simrun_harness.report import EventLog, Tally, run_reported

Work = Callable[[Identity, EventLog, Tally], None]


def run_harness_process(
    program: str,
    environ: Mapping[str, str],
    work: Work,
    *,
    started: float,
    default_worker: str | None = None,
    children_cpu: bool = False,
) -> int:
    """Run `work` as the process `program`, which started at `started`; its exit code.

    Without a valid `SIMRUN_TASK_DIR`, `SIMRUN_WORKER` or `SIMRUN_ATTEMPT` there is no log to
    write to: the error goes to stderr only (exit 4). Otherwise the event log
    `<task_dir>/events/<worker>.<attempt>.jsonl` gets exactly one `WorkerReport` at the end,
    whatever happened, a configuration error included. The usage of the report comes from the
    harness's cgroup (`SIMRUN_MEMORY_SOURCE=cgroup`, below `SIMRUN_CGROUP_ROOT`) or from its
    process tree (`process`).
    """
    try:
        identity = identity_from_env(environ, default_worker)
    except ConfigurationError as error:
        print(f"{program}: {error}", file=sys.stderr)
        return ConfigurationError.exit_code
    try:
        source = memory_source(environ)
    except ConfigurationError:
        source = "process"  # the error is raised again by the work, and so reported
    own = usage_cgroup(environ, source)
    tally = Tally(
        MemorySampler(own),
        OomKillCounter(own),
        CpuThrottle(own),
        started=started,
        children_cpu=children_cpu,
    )
    log = EventLog(identity.events_path)
    try:
        outcome = run_reported(identity, log, tally, lambda: work(identity, log, tally))
    finally:
        log.close()
    return outcome.exit_code
