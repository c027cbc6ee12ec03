"""events: the run log, its fold, `replay --at`, and `GET /runs/{run}` on a finished and a live run.

- append: `simrun_core.store.LogWriter` with the service's policy (fsync before it returns),
  one event per append (the acknowledged events: `submitted`, `cancel-requested`) and batches
  (the actor appends what one tail of the harness logs found as one batch); baseline: the same
  bytes written with `os.write` and `os.fsync`, encoded beforehand.
- fold: `simrun_core.store.fold_log` of a log of `fold_events` events, what the service does for a
  record without a cache; baseline: decoding the same lines with msgspec alone, no fold.
- replay: `GET /runs/{run}?at=<middle>` of that log on the service; baseline: the same prefix
  folded in this process (so the ratio is what HTTP and the service add).
- finished: `GET /runs/{run}` of a finished run of `finished_units` units (its `run.json`);
  baseline: `GET /runs/{run}?at=<last seq>`, which folds the whole log again.
- live: `GET /runs/{run}` of a live run whose log has `live_units` unit-done events, while its
  worker computes units (the actor's fold); baseline: `?at=<its seq>`, a fold of the whole log.

The logs are written with simrun_core's own events, shaped like the log the actor writes for a
split task: `submitted` (with the service's plan, from `POST /estimate`), the events of the
start, one `unit-done` per unit, the end.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import msgspec

from benchmarks.common import Context, Row, interleaved, median, percentile
from benchmarks.service import BenchService, start_service, stop_service
from simrun_core import events as ev
from simrun_core.fold import RunRecord
from simrun_core.plugins import TaskPaths
from simrun_core.states import TaskState
from simrun_core.store import LogWriter, RunPaths, new_run_id, write_record_cache
from simrun_core.store import fold_log as store_fold_log
from simrun_core.task_types.demo import SquaresSettings, setup
from simrun_core.wire import TaskEstimate
from simrun_core.workflow import Workflow

FOLD_GOAL = 1_500_000.0
FINISHED_GOAL_MS = 20.0
LIVE_REFOLD_SHARE = 0.1
CHUNK = 100_000
BASE_TIME = datetime(2026, 1, 1, tzinfo=UTC)


# -- writing logs --------------------------------------------------------------------------


def estimate(service: BenchService, workflow: dict) -> dict[str, TaskEstimate]:
    """The service's plan and resources of a workflow (`POST /estimate`)."""
    response = service.client.post("/estimate", json={"workflow": workflow})
    response.raise_for_status()
    return msgspec.json.decode(response.content, type=dict[str, TaskEstimate])


def squares(units: int, sleep_s: float = 0.0) -> dict:
    """A workflow of one squares task."""
    settings = {"n": units, "sleep_s": sleep_s}
    return {
        "name": "events",
        "tasks": [{"id": "squares", "type": "demo.squares", "settings": settings}],
    }


def head_events(
    run_id: str, workflow: dict, plan: dict[str, TaskEstimate], user: str
) -> list[ev.Event]:
    """`submitted` and the events of the start of a split task, numbered from 1."""
    submitted = ev.Submitted(
        run=run_id,
        workflow=msgspec.convert(workflow, Workflow),
        submitted_by=user,
        owner=user,
        plans={task: found.plan for task, found in plan.items()},
        resources={task: found.resources for task, found in plan.items()},
        backend="local",
    )
    head: list[ev.Event] = [
        submitted,
        ev.EnvironmentResolved(image=None),
        ev.Built(image=None),
        ev.WorkflowSubmitted(name=f"simrun-{run_id}"),
        ev.TaskStateChanged(task="squares", state=TaskState.QUEUED),
        ev.PodStarted(task="squares", worker="w0", attempt=0, node="bench", pid=1),
        ev.TaskStateChanged(task="squares", state=TaskState.RUNNING),
    ]
    return _numbered(head, 1)


def tail_events(first_seq: int, units: int) -> list[ev.Event]:
    """The end of a split task and of its run, numbered from `first_seq`."""
    tail: list[ev.Event] = [
        ev.Merged(task="squares", worker="w0"),
        ev.WorkerReport(task="squares", worker="w0", processes=2, units_done=units),
        ev.PodSucceeded(task="squares", worker="w0"),
        ev.TaskStateChanged(task="squares", state=TaskState.DONE),
        ev.LogsKept(task="squares"),
        ev.Succeeded(),
    ]
    return _numbered(tail, first_seq)


def _numbered(events: list[ev.Event], first_seq: int) -> list[ev.Event]:
    return [
        msgspec.structs.replace(event, seq=first_seq + number, time=BASE_TIME)
        for number, event in enumerate(events)
    ]


def unit_done_lines(first_seq: int, first_index: int, count: int) -> bytes:
    """`count` unit-done events as the actor writes them, one a millisecond apart, as bytes.

    The lines are simrun_core's encoding of a `UnitDone` with its seq, index and time filled in
    (formatting bytes is ten times faster than encoding a struct per line).
    """
    template = ev.encode_event(
        ev.UnitDone(seq=1, time=BASE_TIME, task="squares", index=7, worker="w0", seconds=0.001)
    )
    fields = {
        b"index": (b'"index":7', b'"index":%(index)d'),
        b"seq": (b'"seq":1', b'"seq":%(seq)d'),
        b"time": (b'"time":"2026-01-01T00:00:00Z"', b'"time":"%(time)s"'),
    }
    pattern = template.replace(b"%", b"%%")
    for found, placeholder in fields.values():
        if pattern.count(found) != 1:
            raise AssertionError(f"unexpected encoding of a unit-done event: {template!r}")
        pattern = pattern.replace(found, placeholder)
    lines = []
    for number in range(count):
        seq = first_seq + number
        seconds, milli = divmod(seq % 86_400_000, 1000)
        minutes, second = divmod(seconds, 60)
        hour, minute = divmod(minutes, 60)
        stamp = b"2026-01-01T%02d:%02d:%02d.%03dZ" % (hour, minute, second, milli)
        lines.append(pattern % {b"index": first_index + number, b"seq": seq, b"time": stamp})
    return b"".join(lines)


def write_run_log(path: Path, head: list[ev.Event], units: int, ended: bool) -> int:
    """A log of `head`, `units` unit-done events and (if `ended`) the end; its last seq."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as file:
        file.write(b"".join(ev.encode_event(event) for event in head))
        seq = len(head) + 1
        for start in range(0, units, CHUNK):
            count = min(CHUNK, units - start)
            file.write(unit_done_lines(seq, start, count))
            seq += count
        if ended:
            tail = tail_events(seq, units)
            file.write(b"".join(ev.encode_event(event) for event in tail))
            seq += len(tail)
    return seq - 1


def write_task_dir(paths: RunPaths, settings: dict) -> None:
    """The files the service writes for a task at submission: settings, provenance, out/."""
    task_dir = paths.task_dir("squares")
    task_dir.mkdir(parents=True, exist_ok=True)
    paths.settings("squares").write_bytes(msgspec.json.encode(settings))
    paths.provenance("squares").write_bytes(b"[]")
    paths.out("squares").mkdir(exist_ok=True)
    setup(
        SquaresSettings(**settings),
        TaskPaths(paths.store, paths.dir, task_dir, paths.out("squares"), {}, task_dir),
    )


# -- measuring -----------------------------------------------------------------------------


def fold_log(path: Path, at: int | None = None) -> RunRecord:
    """The record of a log (up to seq `at`), as the service folds one without a cache."""
    record = store_fold_log(path, at).record
    assert record is not None
    return record


def decode_only(path: Path) -> int:
    """Decode every line of a log with msgspec alone; the number of events."""
    decoder = msgspec.json.Decoder(ev.RunEvent)
    count = 0
    with open(path, "rb") as file:
        for line in file:
            decoder.decode(line)
            count += 1
    return count


def get_ms(client: httpx.Client, path: str, params: dict | None = None) -> tuple[float, dict]:
    """The milliseconds of one GET, and its JSON."""
    started = time.perf_counter()
    response = client.get(path, params=params)
    elapsed = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    return elapsed, response.json()


def append_with_writer(path: Path, events: list[ev.Event], batch: int) -> float:
    """events/s of `LogWriter.append` (encode, write, fsync) in batches of `batch`."""
    writer = LogWriter(path)
    try:
        started = time.perf_counter()
        for start in range(0, len(events), batch):
            writer.append(*events[start : start + batch])
        return len(events) / (time.perf_counter() - started)
    finally:
        writer.close()


def append_raw(path: Path, encoded: list[bytes], total: int) -> float:
    """events/s of `os.write` and `os.fsync` of bytes encoded beforehand."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        started = time.perf_counter()
        for data in encoded:
            os.write(fd, data)
            os.fsync(fd)
        return total / (time.perf_counter() - started)
    finally:
        os.close(fd)


def append_rows(ctx: Context) -> list[Row]:
    """Append throughput of the run log with fsync, single events and batches."""
    size = ctx.size
    directory = ctx.scratch / "append"
    directory.mkdir()
    rows = []
    for label, batch, appends in (
        ("1 event per append", 1, size.append_single),
        (f"batches of {size.append_batch_size}", size.append_batch_size, size.append_batches),
    ):
        events: list[ev.Event] = [
            ev.UnitDone(task="squares", index=index, worker="w0", seconds=0.001, seq=index + 1)
            for index in range(batch * appends)
        ]
        encoded = [
            b"".join(ev.encode_event(e) for e in events[k : k + batch])
            for k in range(0, len(events), batch)
        ]
        total = len(events)
        ours, theirs = interleaved(
            size.reps,
            lambda rep, events=events, batch=batch: append_with_writer(
                directory / f"simrun-{batch}-{rep}.jsonl", events, batch
            ),
            lambda rep, encoded=encoded, batch=batch, total=total: append_raw(
                directory / f"raw-{batch}-{rep}.jsonl", encoded, total
            ),
        )
        rows.append(
            Row(
                key=f"events.append.{batch}",
                benchmark=f"events: append with fsync, {label}",
                simrun=median(ours),
                baseline=median(theirs),
                unit="events/s",
                note=(
                    "LogWriter.append (encode, write, fsync) of unit-done events; baseline: "
                    "os.write + os.fsync of the same bytes encoded beforehand"
                    if batch == 1
                    else ""
                ),
            )
        )
    return rows


def run(ctx: Context) -> list[Row]:
    """Measure the log, the fold, replay and the record of finished and live runs."""
    size = ctx.size
    rows = append_rows(ctx)
    project = ctx.scratch / "project"
    service = start_service(project)
    try:
        user = service.client.get("/me").json()["name"]
        fold_units = size.fold_events - 13
        plans = {
            "fold": estimate(service, squares(fold_units)),
            "finished": estimate(service, squares(size.finished_units)),
            "live": estimate(service, squares(2 * size.live_units, 0.01)),
        }
        store = service.store
        # the log of fold_events events, a finished run
        big = RunPaths(store, new_run_id())
        head = head_events(big.run_id, squares(fold_units), plans["fold"], user)
        started = time.perf_counter()
        last = write_run_log(big.events, head, fold_units, ended=True)
        ctx.log(f"wrote a log of {last:,} events in {time.perf_counter() - started:.1f} s")
        if last != size.fold_events:
            raise AssertionError(f"the log has {last} events, not {size.fold_events}")
        records: list[RunRecord] = []

        def timed_fold(rep: int) -> float:
            began = time.perf_counter()
            record = fold_log(big.events)
            seconds = time.perf_counter() - began
            records.append(record)
            return last / seconds

        def timed_decode(rep: int) -> float:
            began = time.perf_counter()
            count = decode_only(big.events)
            return count / (time.perf_counter() - began)

        folds, decodes = interleaved(size.reps, timed_fold, timed_decode)
        record = records[-1]
        if record.progress["squares"].done != fold_units or not record.ended:
            raise AssertionError("the fold of the log does not show every unit done")
        write_record_cache(big, record)
        rows.append(
            Row(
                key="events.fold",
                benchmark=f"events: fold of a {last:,}-event log",
                simrun=median(folds),
                baseline=median(decodes),
                unit="events/s",
                goal=f">= {FOLD_GOAL:,.0f} events/s",
                met=median(folds) >= FOLD_GOAL,
                note=(
                    "simrun_core.store.fold_log(path) in one process (what the service does "
                    "for a record without a cache); baseline: msgspec decoding of each line, "
                    "no fold"
                ),
            )
        )

        middle = last // 2

        def replay(rep: int) -> float:
            elapsed, body = get_ms(service.client, f"/runs/{big.run_id}", {"at": middle})
            if body["seq"] != middle:
                raise AssertionError(f"replay answered seq {body['seq']}, not {middle}")
            return elapsed

        def replay_here(rep: int) -> float:
            began = time.perf_counter()
            fold_log(big.events, middle)
            return (time.perf_counter() - began) * 1000

        replays, local = interleaved(size.reps, replay, replay_here)
        rows.append(
            Row(
                key="events.replay",
                benchmark=f"events: replay --at {middle:,} (GET /runs/{{run}}?at=) of that log",
                simrun=median(replays),
                baseline=median(local),
                unit="ms",
                note=(
                    f"{middle / median(replays) * 1000:,.0f} events/s through the service; "
                    "baseline: the same prefix folded in this process"
                ),
            )
        )

        # a finished run of finished_units units with the run.json its actor writes at its end
        finished = RunPaths(store, new_run_id())
        head = head_events(finished.run_id, squares(size.finished_units), plans["finished"], user)
        last_finished = write_run_log(finished.events, head, size.finished_units, ended=True)
        write_record_cache(finished, fold_log(finished.events))
        rows.append(
            record_row(
                ctx,
                service,
                finished.run_id,
                last_finished,
                key="events.get.finished",
                label=(
                    f"events: GET /runs/{{run}}, finished run of {size.finished_units:,} units "
                    "(median)"
                ),
                goal=f"<= {FINISHED_GOAL_MS:g} ms",
                threshold=FINISHED_GOAL_MS,
            )
        )

        # a live run: its log has live_units unit-done events; its worker computes the rest
        live = RunPaths(store, new_run_id())
        settings = {"n": 2 * size.live_units, "sleep_s": 0.01}
        head = head_events(live.run_id, squares(2 * size.live_units, 0.01), plans["live"], user)
        write_run_log(live.events, head, size.live_units, ended=False)
        write_task_dir(live, settings)
    finally:
        stop_service(service)

    service = start_service(project)
    try:
        deadline = time.monotonic() + 60
        while not list(live.worker_events("squares").glob("*.1.jsonl")):
            if time.monotonic() > deadline:
                raise AssertionError("the live run's worker did not start")
            time.sleep(0.05)
        rows.append(
            record_row(
                ctx,
                service,
                live.run_id,
                None,
                key="events.get.live",
                label=(
                    f"events: GET /runs/{{run}}, live run, log of {size.live_units:,}+ units "
                    "(median)"
                ),
                goal=f"no refold: excess over GET /me <= {LIVE_REFOLD_SHARE:g} x refold",
                threshold=None,
            )
        )
        state = service.client.get(f"/runs/{live.run_id}").json()["state"]
        if state != "running":
            raise AssertionError(f"the live run is {state}, not running")
    finally:
        stop_service(service)
    return rows


def record_row(
    ctx: Context,
    service: BenchService,
    run_id: str,
    last: int | None,
    *,
    key: str,
    label: str,
    goal: str,
    threshold: float | None,
) -> Row:
    """GET latency of a run's record against a refold of its log (`?at=` its last seq).

    With a `threshold` (ms) the goal is the median below it; without, the goal is "no refold":
    what a GET takes beyond `GET /me` on the same connection (the floor of any answer) is below
    `LIVE_REFOLD_SHARE` of what a fold of the log adds.
    """
    size = ctx.size
    samples: list[float] = []
    floors: list[float] = []

    def record(rep: int) -> float:
        for _ in range(size.get_samples):
            samples.append(get_ms(service.client, f"/runs/{run_id}")[0])
            floors.append(get_ms(service.client, "/me")[0])
        return median(samples[-size.get_samples :])

    def refold(rep: int) -> float:
        at = last if last is not None else service.client.get(f"/runs/{run_id}").json()["seq"]
        return get_ms(service.client, f"/runs/{run_id}", {"at": at})[0]

    _, refolds = interleaved(size.reps, record, refold)
    value, refolded, floor = median(samples), median(refolds), median(floors)
    if threshold is not None:
        met = value <= threshold
    else:
        met = value - floor <= LIVE_REFOLD_SHARE * max(0.0, refolded - floor)
    p99 = percentile(samples, 0.99)
    ctx.log(
        f"{key}: median {value:.2f} ms, p99 {p99:.2f}, GET /me {floor:.2f}, refold {refolded:.0f}"
    )
    return Row(
        key=key,
        benchmark=label,
        simrun=value,
        baseline=refolded,
        unit="ms",
        goal=goal,
        met=met,
        note=(
            f"{len(samples)} GETs, p99 {p99:.2f} ms, GET /me on the same connection "
            f"{floor:.2f} ms; baseline: GET ?at=<its last seq>, a fold of its whole log"
        ),
    )
