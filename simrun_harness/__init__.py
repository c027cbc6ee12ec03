"""The harness of simrun: what runs inside a pod (or a local process) of a task.

- `simrun-worker` (`worker.main`, also `python -m simrun_harness.worker`) computes the units of
  a split task from its ledger (`ledger.Ledger`) in a pool of processes (`pool.UnitPool`) and,
  as the coordinator (`SIMRUN_ROLE=base`, `SIMRUN_MERGE=1`), merges them (`merge.run_merge`).
- `simrun-merge` (`worker.merge_main`) merges a complete ledger.
- `simrun-exec` (`exec.main`, also `python -m simrun_harness.exec`) runs the `command` of an
  unsplit plugin task (`command.run_command`).

Each writes its own event log, `<task_dir>/events/<worker>.<attempt>.jsonl` (`report.EventLog`),
ending with exactly one `WorkerReport`; the run's actor tails it. The configuration comes from
the environment the backend sets (`env`); `SIMRUN_TASK_TYPE` is a registered task type name or a
`module:ATTRIBUTE` reference to a `TaskType`. Exit codes: 0 done, 3 a unit, the merge or the
command failed, 4 a configuration error, 137 killed, 143 stopped on SIGTERM, 1 a harness bug.

The harness imports `simrun_core` only and never renames a state file. Importing the package
has no side effects.
"""
