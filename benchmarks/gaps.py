"""For each goal, what causes a miss and what would close it: printed in RESULTS.md when missed.

The causes were found while building the benchmarks (timelines of runs from their events and
the command's clock, `python -X importtime`, and single changes tried by hand against a running
service); the figures quoted here are from those investigations on this machine, the table's
figures are from the run that wrote RESULTS.md.
"""

from __future__ import annotations

NAGLE = """\
**Cause: every answer of the local service on a kept-alive connection waits ~40 ms.**
`simrun_api/local.py` `serve_local` makes its listening socket with
`socket.socket(socket.AF_INET, socket.SOCK_STREAM)`, so its `proto` is 0. asyncio sets
TCP_NODELAY on an accepted connection only when `sock.proto == IPPROTO_TCP`
(`asyncio.base_events._set_nodelay`), so the connections of the local service keep Nagle's
algorithm: uvicorn writes the headers and then the body of an answer, Nagle holds the body until
the headers are acknowledged, and the client delays that ACK by 40 ms. The first request of a
connection is quick (Linux acknowledges at once at the start of a connection); every later one
on the same connection (an httpx client, the CLI's client, the web app) takes ~44 ms, `GET /me`
as well. `serve_from_config` (the cluster service) lets uvicorn bind by host and port and is not
affected.

**Fix** (one line in `simrun_api/local.py` `serve_local`):
`socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)` (or
`sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)` on the listening socket, which
Linux passes on to accepted sockets). Tried by hand with exactly that change (a wrapper that
patches `socket.socket` before calling `serve_local`): `GET /me` 1.2 ms, `GET /runs/{run}` of a
finished run 0.8 ms, `POST /runs` of the small workflow 9.8 ms median over 40 submissions.
"""

CLI_COST = """\
- The `simrun` command: ~0.4-0.6 s from its start to the run's `submitted`. Python's start
  0.09 s; the imports of `simrun_cli.main` 0.20 s (rich, cyclopts, httpx, simrun_core.events
  and planner); finding the local service and connecting ~0.2 s: `simrun_cli/local.py`
  `ensure_local` -> `running_service` -> `answers_instance` and `accepts_token` each make a new
  `httpx.Client` (`_probe_client()`), and `simrun_cli/connect.py` a third one for the command;
  each new client builds an SSL context from certifi's CA bundle although the URL is
  http://127.0.0.1 (33 ms each, 0.14 s for the first of a process with the imports of ssl and
  certifi; `httpx.Client(verify=False)` takes 1.2 ms); plus `environment()`, a scan of the entry
  points of every installed distribution (36 ms). At the end the command exits 0.05-0.19 s
  after the run's `succeeded`.
"""

HARNESS_START = """\
- The start of a task's harness: `simrun-worker` is a new `python -m simrun_harness.worker`:
  python 0.09 s, the harness's imports 0.07 s, `simrun_harness/env.py` `task_type_from_env` ->
  `load_task_types()` importing every entry point 0.04 s, the fork of its pool; its
  `prepare_seconds` were 0.11-0.28 s (median 0.14 s) before its first claim.
"""

GAPS = {
    "local_overhead.squares": (
        "simrun took ~0.6-1.0 s more than the limit of ~5.3 s (the table has this run's "
        "figures); the goal allows 0.53 s. Where "
        "it goes (timelines of runs: their events against the command's clock):\n\n"
        + CLI_COST
        + HARNESS_START
        + """\
- The feeding of the pool: the coordinator keeps exactly `processes` units in flight
  (`simrun_harness/split.py` `_UnitLoop._fill`), so after every unit a pool process waits while
  the coordinator creates `done/<i>`, appends `unit-done`, creates the next claim, appends
  `unit-started` and submits the next unit: the 200 units spanned 5.36-5.51 s for 10.24-10.35 s
  of unit seconds on 2 processes, 0.2-0.3 s over the ideal; the plain pool, fed ahead by `map`,
  hardly waits.

**Proposed changes**: (1) `simrun_harness/split.py` `_UnitLoop._fill`: keep `2 * processes`
units in flight (claim one ahead per process; a claimed unit not yet started is released on
SIGTERM like the others): about -0.2 s here. (2) `simrun_cli/local.py` `_probe_client` /
`ensure_local` and `simrun_cli/connect.py`: one `httpx.Client` for the probes and the command,
made with `verify=False` for an http://127.0.0.1 URL (no SSL context), `environment()` computed
once per process, and the imports only rendering needs (rich tables, cyclopts help) made lazy in
`simrun_cli/main.py`: about -0.2 to -0.3 s. (3) The harness start of the chain below: about
-0.1 s. Together about 1.05-1.10 x the limit (an estimate from the parts, not measured).
"""
    ),
    "local_overhead.chain": (
        "Per task inside the service (median over the events of 3 chains of 5): the harness "
        "start 144 ms; the unit's dispatch 8 ms beyond its 20 ms; from the end of the harness "
        "process to `pod-succeeded` 44 ms (the interpreter's exit ~25 ms, then "
        "`simrun_api/actor.py` `_on_pod` runs `_tail()`, a glob over every task's harness logs, "
        "and an fsync'd append); the next task `queued` 12 ms later: ~0.21 s per task (the "
        "note of this row has the figure of this run). On top, the command's fixed cost spread "
        "over the 5 tasks, ~0.09 s per task:\n\n"
        + HARNESS_START
        + CLI_COST
        + """
**Proposed changes**: (1) `simrun_api/backends/local.py` `LocalBackend._run_process` / `_argv`:
start harness processes from a warm zygote, a process started once per service that has
imported `simrun_harness` and the task types and forks a harness per task (new session,
environment and log file as now; like multiprocessing's forkserver with preload) instead of
exec'ing a new python: about -0.13 s per task. (2) `simrun_harness/env.py` `task_type_from_env`:
load only the entry point `SIMRUN_TASK_TYPE` names (`entry_points(group=..., name=...)`), not
all of them. (3) `simrun_api/actor.py` `_on_pod`: at a pod's end read only that pod's log
(`tasks/<task>/events/<worker>.<attempt>.jsonl`, known from the change) instead of `_tail()`
over every log. (4) The command's changes of the squares run. With (1)-(4) a task would cost
about 0.1 s beyond its work here (an estimate from the parts, not measured).
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
        "About 44 ms of it is the wait of a kept-alive connection, which `GET /me` (the "
        "baseline) pays as well; what remains (planning, the task directories, the fsync'd "
        "`submitted` event, the index in SQLite: the ratio's excess, ~4-10 ms) is within the "
        "goal.\n\n" + NAGLE
    ),
    "api.sse.p99": (
        "The lag is the fan-out: each subscriber's stream (`simrun_api/app.py` `_follow`) wakes "
        "on the actor's change, opens the log, reads it from its own offset and decodes every "
        "new line itself, and litestar encodes an SSE message per event per stream; with 200 "
        "streams every event is read, decoded and encoded 200 times on one core, so the last "
        "subscriber gets a batch tens of ms after the first (one subscriber: a few ms). On "
        "top, a message written while the one before it on that connection is unacknowledged "
        "waits for the client's delayed ACK (below). Tried by hand while other processes kept "
        "the machine busy (load ~3), 3 runs each with 200 subscribers: p99 75-190 ms as is, "
        "66-105 ms with TCP_NODELAY. **Proposed**: (1) `simrun_api/actor.py` `_append`: publish "
        "the appended lines, encoded once as SSE messages, to a bounded queue per subscriber "
        "(a subscriber that falls behind reads the log from its offset, as now), and "
        "`_follow` yields those bytes; (2) the TCP_NODELAY fix below.\n\n" + NAGLE
    ),
    "api.rss": (
        "The service's memory grew beyond the goal during the benchmark (200 submissions, 200 "
        "SSE streams): compare the number of live actors and open streams; each stream keeps "
        "its own reader of the log."
    ),
    "events.fold": (
        "The fold decodes each line with msgspec (~0.45 us an event here) and spends the rest "
        "in Python around it: `simrun_core/store.py` `iter_lines` (a generator yielding a "
        "tuple per line, with a try per line in `decode_event`) and `RunFold.apply` (dispatch "
        "and handler per event). Proposed: decode chunks of lines at once "
        "(`msgspec.json.Decoder.decode_lines`) in `iter_log` and fold runs of `unit-done` "
        "events in one loop."
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
with the control at 0.10 and 0.03 ms a create: what is left of the throughput goal is this
disk's create time and the 2 cores the workers share with the rest of the machine.
"""


def gap(key: str) -> str:
    """The cause and fix of a missed goal, by the key of its row."""
    if key in GAPS:
        return GAPS[key]
    if key.startswith("ledger."):
        return LEDGER
    return ""
