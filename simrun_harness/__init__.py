"""The harness of simrun: what runs inside a pod (or a local process) of a task.

- `simrun-worker` (`worker.main`, also `python -m simrun_harness.worker`) computes the units of
  a split task from its ledger (`ledger.Ledger`) in a pool of processes (`pool.UnitPool`) and,
  as the coordinator (`SIMRUN_ROLE=base`, `SIMRUN_MERGE=1`), merges them (`merge.run_merge`).
- `simrun-merge` (`worker.merge_main`) merges a complete ledger.
- `simrun-exec` (`exec.main`, also `python -m simrun_harness.exec`) runs the `command` of an
  unsplit plugin task (`command.run_command`).

Each first installs the snapshots of `SIMRUN_EDITABLE` (a pod's sources, mounted read-only) as
editable packages from writable shadow trees and starts again in a fresh interpreter
(`sources.install_sources`); the local backend sets none (its venv of a run has them).

Each writes its own event log, `<task_dir>/events/<worker>.<attempt>.jsonl` (`report.EventLog`),
ending with exactly one `WorkerReport` (with when the process started, how long it prepared, its
CPU, peak memory, kills for memory and CPU throttling); the run's actor tails it. SIGTERM is
handled from the first instant of each entry point (`signals`). The usage comes from the
harness's own cgroup (`SIMRUN_MEMORY_SOURCE=cgroup`, read below `SIMRUN_CGROUP_ROOT`) or from its
process tree (`process`); in the latter, where the backend declares the limit real
(`SIMRUN_MEMORY_ENFORCED=1`, a Slurm job), the harness itself kills a process above its memory
(`memory.MemoryGuard`), as the kernel would in a pod, so a kill for memory is retried alike.
Locally the limit only sizes the pool of processes: nothing kills a process above its share.

The configuration comes from the environment the backend sets (`env`); `SIMRUN_TASK_TYPE` is a
registered task type name or a `module:ATTRIBUTE` reference to a `TaskType`. Exit codes: 0
done, 3 a unit, the merge or the command failed, 4 a configuration error, 137 killed (for its
memory when the report counts `oom_kills`), 143 stopped on SIGTERM, 1 a harness bug.

The harness imports `simrun_core` only and never renames a state file. Importing the package
has no side effects.
"""
