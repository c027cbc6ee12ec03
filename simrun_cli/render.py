"""Tables and texts of runs for people: a run with its tasks, lists of runs, events and files."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from simrun_cli.formats import (
    format_bytes,
    format_count,
    format_duration,
    format_time,
    units_text,
)
from simrun_cli.wrapping import Name
from simrun_core.provenance import SourceProvenance
from simrun_core.resources import LEARNED_FROM_RUNS, is_learned
from simrun_core.states import RunState, TaskState
from simrun_core.wire import (
    CleanupRequest,
    CleanupResult,
    CompareTable,
    OutputFile,
    RunItem,
    RunView,
    TaskEstimate,
    Usage,
)

DETAIL_VALUE_MAX = 60
COMPARE_KEY_MAX = 30
SHORT_SNAPSHOT = 12
"""The characters of the tree hash of a snapshot that `status` shows."""
UNBOUNDED_WIDTH = 100_000
NO_GROUP = "(no group)"
EPOCH_FIELDS = frozenset({"started"})
"""The fields of events that hold seconds since the epoch, shown as times."""
STATE_STYLES = {
    RunState.SUCCEEDED: "green",
    RunState.FAILED: "red",
    RunState.CANCELLED: "yellow",
    RunState.RUNNING: "cyan",
    TaskState.DONE: "green",
    TaskState.FAILED: "red",
    TaskState.SKIPPED: "dim",
    TaskState.RUNNING: "cyan",
    TaskState.RETRYING: "yellow",
    TaskState.PREEMPTED: "yellow",
}


class Trimmed:
    """A renderable printed without the spaces at the end of its lines, which rich pads the
    cells of a table with."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        for line in console.render_lines(self.renderable, options, pad=False):
            yield from _rstrip(line)
            yield Segment.line()

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.renderable)


def _rstrip(line: list[Segment]) -> list[Segment]:
    """The segments of a line without the white space at its end (control codes are kept)."""
    kept = list(line)
    end = len(kept)
    while end:
        segment = kept[end - 1]
        if segment.control:
            end -= 1
            continue
        text = segment.text.rstrip()
        if text:
            kept[end - 1] = Segment(text, segment.style, segment.control)
            break
        del kept[end - 1]
        end -= 1
    return kept


def state_text(state: str) -> Text:
    """A state, coloured by what it means."""
    return Text(str(state), style=STATE_STYLES.get(state, ""))


def status_view(run: RunView) -> RenderableType:
    """A run for `status` and `replay`: its summary, a table of its tasks, then one of their
    pods (locally their processes) when they have any."""
    parts: list[RenderableType] = [run_summary(run), Text(""), tasks_table(run)]
    pods = pods_table(run)
    if pods is not None:
        parts += [Text(""), pods]
    return Group(*parts)


def run_summary(run: RunView) -> Table:
    """The facts of a run, one per line: id, workflow, state, who, when, sources, message and
    each warning of the service about the run (e.g. a damaged log)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    _add_row(grid, "run", run.id)
    _add_row(grid, "workflow", run.workflow.name)
    _add_row(grid, "state", state_text(run.state))
    _add_row(grid, "seq", str(run.seq))
    who = run.submitted_by
    if run.agent is not None or run.owner != run.submitted_by:
        who = f"{who} (for {run.owner})"
    _add_row(grid, "submitted by", who)
    if run.group:
        _add_row(grid, "group", run.group)
    _add_row(grid, "created", format_time(run.created))
    if run.finished is not None:
        took = format_duration((run.finished - run.created).total_seconds())
        _add_row(grid, "finished", f"{format_time(run.finished)} ({took})")
    for source in run.sources:
        _add_row(grid, f"source {source.name}", source_text(source))
    if run.message:
        _add_row(grid, "message", run.message)
    for warning in run.warnings:
        _add_row(grid, "warning", Text(warning, style="yellow"))
    return grid


def source_text(source: SourceProvenance) -> str:
    """A source as `where @ branch commit` and its uncommitted changes, `where` the working tree
    of a source recorded without a snapshot, else `snapshot <first 12 of its tree hash>` (its
    directory below the store is in `--json`)."""
    if source.snapshot:
        parts = ["snapshot", source.snapshot.rstrip("/").rsplit("/", 1)[-1][:SHORT_SNAPSHOT]]
    else:
        parts = [source.path or "?"]
    if source.branch or source.commit:
        parts.append("@")
        parts.extend(part for part in (source.branch, (source.commit or "")[:10]) if part)
    if source.dirty:
        parts.append(f"+{len(source.changed)} changed")
    return " ".join(parts)


def tasks_table(run: RunView) -> Table:
    """The tasks of a run: id, type, state, units done/total and the message of a failure.
    Types wrap at their word boundaries."""
    table = _table()
    table.add_column("task", no_wrap=True)
    table.add_column("type")
    table.add_column("state", no_wrap=True)
    table.add_column("units", justify="right", no_wrap=True)
    table.add_column("message", overflow="fold")
    for task_id, task in run.tasks.items():
        _add_row(
            table,
            task_id,
            Name(task.type),
            state_text(task.state),
            units_text(task),
            task.message or "",
        )
    return table


def pods_table(run: RunView) -> Table | None:
    """The pods of a run's tasks, each worker at its last attempt: task, worker, attempt,
    state, the node (server) it runs or ran on, the GPUs it was given (when any pod has
    some) and its exit code (`oom` when killed for its memory); None when no task has a pod
    yet."""
    rows = [(task_id, pod) for task_id, task in run.tasks.items() for pod in task.pods]
    if not rows:
        return None
    gpus = any(pod.gpus for _, pod in rows)
    table = _table()
    table.add_column("task", no_wrap=True)
    table.add_column("worker", no_wrap=True)
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("node", overflow="fold")
    if gpus:
        table.add_column("GPUs", overflow="fold")
    table.add_column("exit", justify="right", no_wrap=True)
    for task_id, pod in rows:
        code = "" if pod.exit_code is None else str(pod.exit_code)
        if pod.oom:
            code = f"{code} oom".strip()
        cells: list[RenderableType] = [
            task_id,
            pod.worker,
            str(pod.attempt),
            state_text(pod.state),
            pod.node or "",
        ]
        cells += [",".join(pod.gpus or [])] if gpus else []
        _add_row(table, *cells, code)
    return table


def runs_table(items: Iterable[RunItem]) -> Table:
    """Runs in a list: id, workflow, group, state, submitter, creation and, when a run is live,
    the share of the units the live ones have done. Names wrap at their word boundaries."""
    items = list(items)
    live = any(item.progress is not None for item in items)
    table = _table()
    table.add_column("id", no_wrap=True)
    table.add_column("workflow")
    table.add_column("group")
    table.add_column("state", no_wrap=True)
    table.add_column("submitter")
    table.add_column("created", no_wrap=True)
    if live:
        table.add_column("done", justify="right", no_wrap=True)
    for item in items:
        cells: list[RenderableType] = [
            item.id,
            Name(item.workflow),
            Name(item.group or ""),
            state_text(item.state),
            Name(item.submitted_by),
            item.created.astimezone().strftime("%m-%d %H:%M"),
        ]
        if live:
            cells.append("" if item.progress is None else f"{item.progress:.0%}")
        _add_row(table, *cells)
    return table


def estimate_view(estimates: dict[str, TaskEstimate]) -> RenderableType:
    """The estimate of `simrun estimate`: its table, and what N counts when a task's resources
    are `learned from N runs`."""
    table = estimate_table(estimates)
    if not any(is_learned(found.resources.source) for found in estimates.values()):
        return table
    return Group(table, Text(""), Text(LEARNED_FROM_RUNS, style="dim"))


def estimate_table(estimates: dict[str, TaskEstimate]) -> Table:
    """Per task: its pods and processes, memory per pod and per process, the GPUs of a pod
    (when a task asks for some), where the memory comes from, the seconds of a unit and the
    expected seconds."""
    gpus = any(found.plan.shape.gpus for found in estimates.values())
    table = _table()
    table.add_column("task", overflow="fold")
    table.add_column("pods", justify="right", no_wrap=True)
    table.add_column("procs", justify="right", no_wrap=True)
    table.add_column("GiB/pod", justify="right", no_wrap=True)
    table.add_column("GiB/proc", justify="right", no_wrap=True)
    if gpus:
        table.add_column("GPUs/pod", justify="right", no_wrap=True)
    table.add_column("resources", overflow="fold")
    table.add_column("s/unit", justify="right", no_wrap=True)
    table.add_column("expected", justify="right", no_wrap=True)
    for task, found in estimates.items():
        shape = found.plan.shape
        per_unit = found.resources.seconds_per_unit
        cells = [
            task,
            str(found.plan.pods),
            str(shape.processes),
            str(shape.memory_gb),
            f"{shape.per_worker_gb:.3g}",
        ]
        cells += [str(shape.gpus)] if gpus else []
        _add_row(
            table,
            *cells,
            found.resources.source,
            "" if per_unit is None else f"{per_unit:.3g}",
            "" if found.seconds is None else format_duration(found.seconds),
        )
    return table


def history_table(events: Iterable[dict[str, Any]]) -> Table:
    """The events of a run: seq, time, type and the other fields as `key=value`, wrapped at
    spaces; a word wider than the column is cut with an ellipsis (`--json` has it whole)."""
    table = _table()
    table.add_column("seq", justify="right", no_wrap=True)
    table.add_column("time", no_wrap=True)
    table.add_column("type", no_wrap=True)
    table.add_column("details", overflow="ellipsis")
    for event in events:
        _add_row(
            table,
            str(event.get("seq", "")),
            _event_time(event.get("time")),
            str(event.get("type", "")),
            event_details(event),
        )
    return table


def event_details(event: dict[str, Any]) -> str:
    """The fields of an event but seq, time and type, compact, long values shortened; times
    since the epoch as local times, bytes as sizes."""
    parts = []
    for key, value in event.items():
        if key in ("seq", "time", "type"):
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and key in EPOCH_FIELDS:
            text = _epoch_clock(value)
        elif number and key.endswith("_bytes"):
            text = format_bytes(int(value))
        else:
            text = value if isinstance(value, str) else _compact(key, value)
        if len(text) > DETAIL_VALUE_MAX:
            text = text[: DETAIL_VALUE_MAX - 1] + "…"
        parts.append(f"{key}={text}")
    return " ".join(parts)


def _compact(key: str, value: Any) -> str:
    """A nested value in a few characters: a workflow by its name, a mapping by its keys."""
    if key == "workflow" and isinstance(value, dict) and "name" in value:
        return str(value["name"])
    if isinstance(value, dict) and any(isinstance(v, dict | list) for v in value.values()):
        return "{" + ",".join(map(str, value)) + "}"
    return json.dumps(value, separators=(",", ":"))


def outputs_table(files: Iterable[OutputFile]) -> Table:
    """The output files of a task: path and size."""
    table = _table()
    table.add_column("path", overflow="fold")
    table.add_column("bytes", justify="right", no_wrap=True)
    for file in files:
        _add_row(table, file.path, format_bytes(file.bytes))
    return table


def compare_view(table: CompareTable, console: Console) -> RenderableType:
    """Runs side by side as `compare` prints them, within the width of `console`.

    A row per run and a column per column of the table when that fits without wrapping; else
    transposed, a row per column and a column per run (headed by the run id), in blocks of as
    many runs as fit. Values are never cut: a long one wraps within its cell, numbers are
    aligned to the right, a missing value is blank.
    """
    if not table.rows:
        return Text("no runs to compare")
    wide = _compare_wide(table)
    if _natural_width(console, wide) <= console.width:
        return wide
    keys = [column for column in table.columns if column != "run"]
    runs = [str(row.get("run", "")) for row in table.rows]
    key_width = min(COMPARE_KEY_MAX, max([len("run"), *map(len, keys)]))
    blocks: list[list[int]] = []
    for index in range(len(runs)):
        if blocks and _fits(console, key_width, [runs[i] for i in [*blocks[-1], index]]):
            blocks[-1].append(index)
        else:
            blocks.append([index])
    parts: list[RenderableType] = []
    for block in blocks:
        if parts:
            parts.append(Text(""))
        parts.append(_compare_block(table, keys, block, key_width))
    return Group(*parts)


def _compare_wide(table: CompareTable) -> Table:
    wide = _table()
    for column in table.columns:
        numeric = all(_is_number(row.get(column)) for row in table.rows)
        wide.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for row in table.rows:
        wide.add_row(*(value_text(row.get(column)) for column in table.columns))
    return wide


def _compare_block(table: CompareTable, keys: list[str], block: list[int], key_width: int) -> Table:
    rows = [table.rows[index] for index in block]
    transposed = _table()
    transposed.add_column("run", overflow="fold", style="bold", max_width=key_width)
    for row in rows:
        run = str(row.get("run", ""))
        transposed.add_column(run, overflow="fold", min_width=len(run))
    for key in keys:
        transposed.add_row(Text(key), *(value_text(row.get(key)) for row in rows))
    return transposed


def _fits(console: Console, key_width: int, runs: list[str]) -> bool:
    """Whether a transposed block of these runs fits: the key column and every run id whole."""
    probe = _table()
    probe.add_column("run", width=key_width)
    for run in runs:
        probe.add_column(run, width=len(run))
    return _natural_width(console, probe) <= console.width


def _natural_width(console: Console, renderable: RenderableType) -> int:
    """The width a renderable takes without wrapping anything."""
    unbounded = console.options.update(width=UNBOUNDED_WIDTH)
    return Measurement.get(console, unbounded, renderable).maximum


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def value_text(value: Any) -> Text:
    """A value of a compare table: blank for None, numbers to the right, JSON for lists."""
    if value is None:
        return Text("")
    if isinstance(value, bool):
        return Text("true" if value else "false")
    if isinstance(value, int | float):
        return Text(str(value), justify="right")
    if isinstance(value, str):
        return Text(value)
    if isinstance(value, list) and value and not any(isinstance(v, dict | list) for v in value):
        return Text(", ".join(str(item) for item in value))
    return Text(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def usage_view(usage: Usage, groups: dict[str, str | None]) -> RenderableType:
    """The bytes of the store per group, then per run with its group (`groups`: run -> group)."""
    if not usage.runs and not usage.groups:
        return Text("the store holds no runs")
    by_group = _table()
    by_group.add_column("group", overflow="fold")
    by_group.add_column("size", justify="right", no_wrap=True)
    for group, size in sorted(usage.groups.items(), key=lambda item: (item[0] == "", item[0])):
        _add_row(by_group, group or NO_GROUP, format_bytes(size))
    by_run = _table()
    by_run.add_column("run", no_wrap=True)
    by_run.add_column("group", overflow="fold")
    by_run.add_column("size", justify="right", no_wrap=True)
    for run, size in sorted(usage.runs.items()):
        _add_row(by_run, run, groups.get(run) or "", format_bytes(size))
    return Group(by_group, Text(""), by_run)


def cleanup_view(result: CleanupResult, request: CleanupRequest | None = None) -> RenderableType:
    """What a cleanup removed (or would, with --dry-run): runs, snapshots and the bytes; when
    nothing, why: the runs it looked for (`request`) and the snapshots it keeps."""
    verb = "would remove" if result.dry_run else "removed"
    if not result.runs and not result.snapshots:
        nothing = f"nothing to remove{' (dry run)' if result.dry_run else ''}"
        return Text(nothing if request is None else f"{nothing}: {_cleanup_reason(request)}")
    table = _table()
    table.add_column("removed" if not result.dry_run else "to remove", no_wrap=True)
    table.add_column("path", overflow="fold")
    for run in result.runs:
        _add_row(table, "run", run)
    for snapshot in result.snapshots:
        _add_row(table, "snapshot", snapshot)
    runs = format_count(len(result.runs), "run")
    snapshots = format_count(len(result.snapshots), "snapshot")
    freed = format_bytes(result.bytes_freed)
    summary = f"{verb} {runs} and {snapshots}, {freed}"
    return Group(table, Text(""), Text(summary))


def _cleanup_reason(request: CleanupRequest) -> str:
    """Why a cleanup found nothing: no run of what it asked for, no snapshot unreferenced."""
    failed = " failed" if request.failed_only else ""
    group = f" of group {request.group!r}" if request.group is not None else ""
    days = request.older_than_days
    age = f"ended {days:g} day{'' if days == 1 else 's'} ago or earlier" if days else "has ended"
    return (
        f"no{failed} run{group} you may remove {age} (--older-than {days:g}), and no "
        "snapshot is unreferenced (one written within the last hour is kept)"
    )


def _add_row(table: Table, *cells: RenderableType) -> None:
    """Add a row; text cells are taken literally, never as rich markup."""
    table.add_row(*(Text(cell) if isinstance(cell, str) else cell for cell in cells))


def _table() -> Table:
    """A table with a rule under its header and no frame, as the commands print them."""
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)


def _event_time(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    return _clock(when)


def _epoch_clock(seconds: float) -> str:
    """Seconds since the epoch as `_clock` shows a time; the number for one no date has."""
    try:
        return _clock(datetime.fromtimestamp(seconds, UTC))
    except (OverflowError, OSError, ValueError):
        return str(seconds)


def _clock(when: datetime) -> str:
    """A time of an event in the local zone, `MM-DD HH:MM:SS.mmm`."""
    return when.astimezone().strftime("%m-%d %H:%M:%S.%f")[:-3]
