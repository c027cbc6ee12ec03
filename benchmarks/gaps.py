"""For each goal, what causes a miss and what would close it: printed in RESULTS.md when missed.

The causes were found while building the benchmarks (timelines of runs from their events and
the command's clock, `python -X importtime`, and single changes tried by hand against a running
service); the figures quoted here are from those investigations on this machine, the table's
figures are from the run that wrote RESULTS.md.
"""

from __future__ import annotations

NAGLE = """\
**Found and fixed**: the local service's listening socket lacked `IPPROTO_TCP`, so asyncio never
set TCP_NODELAY (`asyncio.base_events._set_nodelay`) and every answer on a kept-alive connection
waited ~40 ms for the client's delayed ACK (`GET /me` 44 ms before, ~1 ms after). Should this
goal be missed again, first compare the row with `GET /me` on the same connection (its note): a
floor shared with `GET /me` is per-request overhead (the socket, middleware, authentication),
not the work of the route.
"""

CLI_COST = """\
- The `simrun` command runs in the warm command process of the directory
  (`simrun_cli/warm.py`, started by a command that finds the local service running): the
  console script (`simrun_cli/entry.py`) imports only modules built into the interpreter,
  hands its arguments, directory, environment and standard streams to the warm process over
  `.simrun/commands.sock`, and a fork made ahead runs the command with cyclopts, httpx, rich,
  yaml and simrun imported, the local service verified once (`verify_service`: no
  `GET /local/instance` and `GET /me` a command) and its HTTP client built. Measured against a
  running service on this machine (2026-12-02): `status --local RUN --json` 0.26 s by itself
  (`SIMRUN_WARM=0`), 0.10 s warm with every probe, 0.065 s as now, against 0.049 s for
  `python -c pass`; of the warm command ~1 ms is the console script's imports, ~1 ms the hand
  over, ~7 ms cyclopts' parse of the arguments, ~3 ms the request.
- What is left is python's start with this machine's site (~40 ms of `python -c pass`, 10 ms
  with `-I -S`: certifi of `_sandboxing_egress_ca.pth` and the finder of the editable install).
  A row missed again: compare it with the command by itself and `python -c pass` (its note);
  `.simrun/warm.log` says whether the warm process ran it and why one was refused.
  `tests/cli/test_startup.py` keeps the lazy imports of a command by itself lazy.
"""

HARNESS_START = """\
- The start of a task's harness: every harness task, a run's first included, takes up one of
  the warm spares the local backend keeps (`simrun_harness/spare.py`,
  `simrun_api/backends/spares.py`), which takes up its task in a few ms (a new python is ~0.1 s
  of python and imports before its first claim). A harness exits without the interpreter's
  teardown once its report is written.
"""

GAPS = {
    "local_overhead.squares": (
        "What the run costs beyond the limit, as found (timelines of runs: their events against "
        "the command's clock), and what was done about each:\n\n"
        + CLI_COST
        + HARNESS_START
        + """\
- The feeding of the pool: the coordinator keeps `2 * processes` calls in flight
  (`simrun_harness/split.py` `IN_FLIGHT_PER_PROCESS`), so a pool process finds its next
  call waiting while the coordinator records the last one (with `processes` units the 200
  units spanned 0.2-0.3 s over the ideal); units of 0.05 s go one to a call.

Should the goal be missed again: compare the run's first-to-last-event span (the note of the
row) with the wall; the difference is the command's, the span beyond the limit the service's.
"""
    ),
    "events.get.finished": (
        "The service folds nothing here (it reads `run.json`), but its answer waits on the "
        "connection: `GET /me` on the same connection takes as long (see the note of this "
        "row).\n\n" + NAGLE
    ),
    "events.get.live": (
        "The live record is the actor's fold in memory (`Supervisor.load` returns "
        "`actor.record`), so a GET does not refold the log; a miss of this check means a GET "
        "took much longer than `GET /me` on the same connection.\n\n" + NAGLE
    ),
    "api.post.median": (
        "A submission plans, makes the task directories, writes the settings (fsynced), the "
        "`submitted` event (fsynced) and the index in SQLite: ~4-10 ms beyond `GET /me` here."
        "\n\n" + NAGLE
    ),
    "api.sse.p99": (
        "The lag is the fan-out. Each subscriber's stream used to wake on the actor's change, "
        "open the log, read it from its own offset and decode and encode every new line "
        "itself: with 200 streams every event was read, decoded and encoded 200 times on one "
        "core (p99 72-109 ms in the runs of 2026-12-01). **Done**: the actor keeps its last "
        "appends (`simrun_api/appended.py` `AppendedLines`: 2 KiB of lines a run, with their "
        "seqs and types) and a stream that has read the log up to one of them takes the rest "
        "from there, the messages of a whole append encoded once and shared by every stream "
        "(`simrun_api/streams.py` `run_events`); a stream further behind reads the log as "
        "before. `benchmarks/run api` right after: p99 20-27 ms at 200 subscribers. Should it "
        "be missed again: compare the one-subscriber baseline (the machine) and look for "
        "streams that fall back to the log (their offset older than what is kept).\n\n" + NAGLE
    ),
    "api.me.loaded.p99": (
        "`GET /me` shares the service's one event loop with the actors of the live runs: while "
        "50 runs start their workers and their logs grow by hundreds of events a second, a "
        "request waits for the loop. Compare the idle baseline (the machine) and the load "
        "average of the run (other processes); the loop samples of `many_runs` show where a "
        "loop busy with many live runs spends its time."
    ),
    "api.rss": (
        "The service's memory grew beyond the goal during the benchmark (200 submissions, 200 "
        "SSE streams): compare the number of live actors and open streams; each stream keeps "
        "its own reader of the log."
    ),
    "scale.units": (
        "The cost is the coordinator's: the harness alone (`simrun-worker` run by hand on a task "
        "of 20,000 zero-work units, no service) took as long as the whole run. It used to spend "
        "~315 us of CPU a unit (2026-12-02, 7 s at 20,000 units, against 3.7 s in the limit's "
        "own process): a round trip through `ProcessPoolExecutor` a unit (the limit pays it too, "
        "`pool.map` sends one unit a call), two exclusive creates and a lookup in the ledger, and "
        "its share of the log's writes. Done: units measured short go several to a call of the "
        "pool (`simrun_harness/split.py` `units_per_call`: about `CALL_S` of units a call, at "
        "most `CALL_UNITS`), so the round trip is paid once for up to 64 of them; the ledger's "
        "first pass lists a shard of `done/` once instead of looking up each unit's entry (~43 "
        "us a unit). What is left is the file system's metadata: a unit of simrun makes four "
        "changes (the claim's and the completion's links, the unit's file and its rename) where "
        "the limit makes two, and this virtual disk's latency varies thirtyfold within minutes. "
        "The row's note has each rep's phases (from the run's events and the command's clock) "
        "and the disk probe made just before it (`scale.disk_probe`: those four changes a unit, "
        "in microseconds): a rep whose `units` phase is long while its probe is slow is the "
        "disk's; one whose other phases are long is a stall of the service or the command, to "
        "be read in that run's logs. Next: one create a unit or fewer in the ledger (the "
        "completions in the worker's own append-only log instead of `done/` entries, or a "
        "claim per aligned block of units, so a call of 64 units is one create)."
    ),
    "events.fold": (
        "Where a fold's time goes (instruction counts under valgrind, 10^5 unit-done lines): "
        "~6,200 instructions a line in msgspec's decoding and the reading of the file, and "
        "~2,000 in the fold (3,800 before, and more through the generators of `iter_log`). "
        "Done: `simrun_core/store.py` `iter_blocks` reads 1 MiB at a time and decodes its lines "
        "into a list (no generator step per event); `RunFold.apply_all` checks the numbering of "
        "a whole block at once and folds a run of `unit-done` events of one task in local "
        "variables (a byte per unit in `simrun_core/unit_flags.py`: testing a bit costs three "
        "times as much in Python), writing the task's progress once at its end; events are "
        "not tracked by the garbage collector (`gc=False`). Next: fewer lines (the harness "
        "writes `units-done` batches now, so a new log has ~0.4 lines a unit) and, for the "
        "decoding, `unit-started` lines kept out of the run log (they are already). Right "
        "after the run of RESULTS.md, `benchmarks/run events` alone gave 1.97M events/s "
        "against 2.55M/s for the decoding (the full run's figures were taken while the disk "
        "and the machine were slower: its fsync rows are half of an earlier run's)."
    ),
}

LEDGER = """\
simrun's ledger costs one stat and two exclusive creates per unit and lists no directory, so its
cost per unit does not grow with the number of units. What it does depend on is how fast this
disk creates a file in the ledger's directories, and on this virtual machine (ext4 on a virtual
disk, mounted with `discard`) that varies up to 30 times from one directory to another and from
one minute to the next: 0.02 ms to 0.7 ms per create, whatever the process (plain
`os.open(O_CREAT|O_EXCL)` loops, measured by hand while building this benchmark; across six full
runs of the earlier layout, 2 workers at 10^5 units did 2,900 to 25,000 units/s). The note of
the row "per-unit cost ... 1 worker" has this run's control: the create time in a `claim/` shard
directory of each size's ledger. Two workers share the file system's journal and, on this
machine, 2 cores with whatever else runs: when creates are slow, a second worker adds little.
**Done** (`simrun_harness/ledger.py`): (1) the entries are spread over shard directories of
1,000 indices (`claim/<index // 1000>/<index>.<epoch>`, the same for `release/` and `done/`,
made lazily), so no directory grows past 1,000 entries and workers on different parts of the
ledger do not share a directory lock (on NFS, a directory shared by every worker of every host
is the hot spot as well); (2) an entry names its worker as the target of a symbolic link
(created exclusively by `symlink`, kept in the inode on ext4) instead of in a file's data: no 4
KiB data block per file (two written per unit before, and two discards when the run's files are
removed). The per-unit cost at 10^5 units is now that at 10^3 (0.67x to 1.23x in two runs after
the change, the goal met in both); 2 workers at 10^5 units did 2,951 and 5,407 units/s in them,
with the control at 0.10 and 0.03 ms a create; with the same window at every size (since),
1,554 units/s while a plain create took ~0.5 ms and 30,306 units/s at 0.05 ms. What is left of
the throughput goal is this disk's create time and the 2 cores the workers share with the rest
of the machine; the next step would be one create per unit (the completions in the worker's
own append-only log instead of `done/` entries).
"""


CHAIN = """\
Per chained task, as found from the runs' timelines (`python -m benchmarks.chain` prints them:
submitted -> first task start, a task's start -> its first unit, last unit -> its report, its
report -> the next task's start) and what was done about each:

- The start of a task's harness: every harness task, a run's first included, takes up a warm
  spare the local backend keeps ready (`simrun_api/backends/spares.py` `SparePool`, 3 of them,
  refilled after each hand-off) that has python started, the harness imported and the task
  types' entry points scanned (`simrun_core.plugins.scan_task_types`: the scan of ~250
  installed distributions was ~30 ms of every task); it takes its task in ~1 ms.
- The backend held its event loop 30-50 ms at every process start (a `preexec_fn` forces a fork
  of the service and a wait for the child's Python code): processes now start with vfork, the
  SIGTERM of a harness held by the mask of the starting thread, their ends awaited through a
  pidfd (`simrun_api/backends/children.py`). The end of a task to the start of the next: ~2 ms
  in the backend.
- The actor's fsyncs left the event loop (the kept logs' index in a thread, a submission's
  settings files fsynced in threads at once).
- The harness's own start after its order, timed inside it (marks written to a file, 25 tasks
  of 5 chains; the same tasks one at a time on an idle service in brackets): order -> ledger
  ready ~2 ms, pool forked 14 ms (4 ms), first claim and `unit-started` 5-7 ms (5 ms), the
  unit of 20 ms back after 24-27 ms (24 ms), pool closed 1-7 ms (2 ms), merge 3-8 ms (3 ms),
  report < 1 ms: the pool (a fork, its setup, a round trip through `ProcessPoolExecutor`) is
  most of what a one-unit task costs beyond its work, and all of it slower while the service
  and the task's neighbours share the 2 cores. Done: no more pool processes than units (a
  one-unit task forked as many as its cores), the pool closed without waiting for its
  processes to exit, the unit's lines written together. Next: a pool forked by the spare
  while it waits (its processes taking the task's type and settings with the order), or the
  one unit of a task computed in the harness's own process.
- Through the CLI, the command's own start (below).
"""

SLURM_UNITS = """\
Where the time goes beside the hand-written jobs (a service on the benchmark's cluster,
`poll_s` 2 s, runs of 200 x 0.05 s, three jobs of 2 CPUs as the baseline's): the service
writes the run and submits its three jobs (~0.1 s); the jobs start as the hand-written ones
do; the coordinator merges within tens of milliseconds of the last unit (it looks at the
ledger after 0.02 s, doubling up to `Timing.poll_s`); the actor sees the `merged` event in
the harness log within the `HarnessWatch` tick (0.2 s) and hints the backend, whose poller
then runs `squeue` every 0.1 s until the coordinator's job is COMPLETED (~0.1-0.2 s after the
merge). Should this be missed on a loaded machine: the run's event log and the harness logs
give each step's time (`pod-started`, the last `worker-report`s, `merged`, `pod-succeeded`);
a plan of fewer than three jobs means the units learned are not 0.05 s (the squares task has
one key of learned resources whatever its settings) or `slurm.pod_start_s` is too high.
"""

GAPS["slurm.units"] = SLURM_UNITS
GAPS["slurm.first_unit"] = (
    "From the POST to the first unit: the service plans and writes the run (~0.1 s), the "
    "backend writes the batch script and runs `sbatch`, Slurm schedules and starts the job "
    "as it does the bare one, then the harness's python starts, imports and claims its first "
    "unit (~0.3-0.5 s here). Should this be missed: the run's events (`workflow-submitted`) "
    "and the harness's own log (`unit-started`) against the bare job's start split the gap."
)
GAPS["slurm.polls"] = (
    "The backend runs ONE `squeue` of every run's jobs per `poll_s` (`SlurmBackend.poll`); a "
    "miss means a call per run or per job crept in: the note of the row counts them by command."
)


CLIENTS = """\
What 2,000 reading subscribers of one live run cost, as found (the service's loop sampled every 5
ms, its objects counted by type and `sys._debugmallocstats()` during and after the phase), and
what was done about each:

- `GET /me` waited behind bursts: each append (about 10 a second) woke every stream, and each
  sent the append's messages through litestar, uvicorn and h11. A stream that caught up with the
  log of a live run now joins the run's broadcast (`simrun_api/broadcast.py`): each append is
  encoded and framed once as a chunk of an HTTP/1.1 body and written by one task to every
  follower's connection, the loop let run every 64 writes; a follower costs no wake per append
  (it leaves for the run's end, its deadline, its client gone or too far behind, or back to the
  log when a line the actor did not write came). `GET /me` p99 441 ms before, 86 ms (load 6-8 on
  the 2 shared cores) and 27 ms (load 2.5-3.6) after; the service's CPU for the phase ~7.8 s
  before, ~5 s after, most of it now the 2,000 connects (a request each, every middleware).
- Per subscriber ~48 KiB: a run's stream is now sent by `simrun_api/event_response.py` on the
  service's server, without litestar's task group of two tasks per stream (one waiting for the
  disconnect: a stream learns that its client went away from its connection) and without the
  exception and traceback litestar's SSE iterator holds for as long as a stream lasts: ~39 KiB.
- Kept after they left: the C heap's free pages are given back after the ended streams' cycles
  are collected (`malloc_trim` in `simrun_api/subscribers.py`): ~25 MiB less. What is left is
  pymalloc's: the subscribers' objects filled ~57 new 1 MiB arenas, and after they left about
  half of those still hold a few live blocks (objects the service made meanwhile and keeps:
  the actor's last appends, timers and futures of its tasks, the caches litestar and msgspec
  fill at the first stream request), so they stay mapped although 1,716 of their 16 KiB pools
  are free (`_debugmallocstats` after the phase: 54 arenas, 26.5 MB in blocks as before it).
  They are given back as that churn moves on: the RSS goes on falling for ~30 s (the next
  phase starts 10-20 MiB lower). Next: fewer small objects per connection (a stream request
  holds 13 coroutines of the middleware chain, a RunPaths of 6 paths, the request's
  headers and state), so that fewer arenas fill; or a run's streams served below the ASGI
  app (the connection handed to the broadcast once the response started).
"""


def gap(key: str) -> str:
    """The cause and fix of a missed goal, by the key of its row."""
    if key in GAPS:
        return GAPS[key]
    if key.startswith("local_overhead.chain."):
        return CHAIN + ("\n" + CLI_COST if key.endswith(".cli") else "")
    if key.startswith("ledger."):
        return LEDGER
    if key.startswith("cli."):
        return CLI_COST
    if key.startswith("clients."):
        return CLIENTS
    return ""
