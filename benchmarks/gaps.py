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
- The `simrun` command (`simrun_cli`): its imports (only cyclopts and simrun_core at start;
  rich, httpx and the workflow code are imported by the commands that need them), one httpx
  client without an SSL context for the probes of the local service and the command, and no
  wait after the run's end: ~0.2 s from its start to the run's `submitted` (was 0.3-0.6 s).
  `tests/cli/test_startup.py` keeps the lazy imports lazy; `python -X importtime -m simrun_cli
  --help` shows what a new import costs.
"""

HARNESS_START = """\
- The start of a task's harness: the first harness task of a run is a new python (~0.1 s of
  python and imports before its first claim); every later one is a spare started ahead
  (`simrun_harness/spare.py`, `simrun_api/backends/spares.py`), which takes up its task in a
  few ms. A harness exits without the interpreter's teardown once its report is written.
"""

GAPS = {
    "local_overhead.squares": (
        "What the run costs beyond the limit, as found (timelines of runs: their events against "
        "the command's clock), and what was done about each:\n\n"
        + CLI_COST
        + HARNESS_START
        + """\
- The feeding of the pool: the coordinator keeps `2 * processes` units in flight
  (`simrun_harness/split.py` `IN_FLIGHT_PER_PROCESS`), so a pool process finds its next unit
  waiting while the coordinator records the last one (with `processes` units the 200 units
  spanned 0.2-0.3 s over the ideal).

Should the goal be missed again: compare the run's first-to-last-event span (the note of the
row) with the wall; the difference is the command's, the span beyond the limit the service's.
"""
    ),
    "local_overhead.chain": (
        "Per task, as found: the harness start (~0.14 s as a new python), the end of the "
        "harness (its interpreter's teardown, ~25 ms) and the actor's scan of every harness log "
        "at a pod's end; on top, the command's fixed cost spread over the tasks. Done:\n\n"
        + HARNESS_START
        + CLI_COST
        + """
- `simrun_api/actor.py` reads only the ended pod's log at its end; `simrun_harness/env.py` loads
  only the entry point of the task's type.

Should the goal be missed again: the note of the row has the cost per task inside the service
(first to last event); `pod-started` of a task against `pod-succeeded` of the one before is the
backend's share, `prepare_seconds` of the reports the harness's.
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
        "`_follow` yields those bytes; (2) the TCP_NODELAY fix (done, below).\n\n" + NAGLE
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
with the control at 0.10 and 0.03 ms a create; with the same window at every size (since),
1,554 units/s while a plain create took ~0.5 ms and 30,306 units/s at 0.05 ms. What is left of
the throughput goal is this disk's create time and the 2 cores the workers share with the rest
of the machine; the next step would be one create per unit (the completions in the worker's
own append-only log instead of `done/` entries).
"""


def gap(key: str) -> str:
    """The cause and fix of a missed goal, by the key of its row."""
    if key in GAPS:
        return GAPS[key]
    if key.startswith("ledger."):
        return LEDGER
    return ""
