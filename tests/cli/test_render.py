"""The tables and lines people read, at 80 columns."""

from __future__ import annotations

import io
from datetime import timedelta

import msgspec
import pytest
from cli_helpers import RUN_ID, T0, plan, two_task_events, unit_events
from rich.console import Console, RenderableType

from simrun_cli.follow import LiveLines, PlainLines, RunWatch
from simrun_cli.formats import format_bytes, format_count, format_duration
from simrun_cli.render import (
    Trimmed,
    cleanup_view,
    compare_view,
    estimate_table,
    history_table,
    outputs_table,
    runs_table,
    status_view,
    usage_view,
)
from simrun_core import events as ev
from simrun_core.fold import fold
from simrun_core.resources import ResolvedResources
from simrun_core.states import TaskState
from simrun_core.views import run_item, run_view
from simrun_core.wire import (
    CleanupRequest,
    CleanupResult,
    CompareTable,
    OutputFile,
    TaskEstimate,
    Usage,
)


def render(renderable: RenderableType, width: int = 80) -> list[str]:
    """The lines of a renderable on a console of `width` columns, without colours."""
    console = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def fits(lines: list[str], width: int = 80) -> None:
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, "\n".join(too_long)


def test_a_run_shows_its_facts_and_its_tasks_with_units() -> None:
    events = two_task_events(units=10) + unit_events(4, "scan", range(7))
    record = fold(events)
    lines = render(status_view(run_view(record)))
    fits(lines)
    text = "\n".join(lines)
    assert RUN_ID in text and "fit" in text and "running" in text
    scan = next(line for line in lines if line.startswith("scan"))
    assert "demo.squares" in scan and "running" in scan and "7/10" in scan
    report = next(line for line in lines if line.startswith("report"))
    assert "waiting" in report and "/" not in report


def test_a_failed_task_shows_its_message_folded_within_80_columns() -> None:
    message = "w0 attempt 2: exit code 137, killed for its memory; " * 3
    events = [
        *two_task_events(units=10),
        ev.TaskStateChanged(seq=4, time=T0, task="scan", state=TaskState.FAILED, message=message),
        ev.Failed(seq=5, time=T0 + timedelta(seconds=75), message="task 'scan' failed"),
    ]
    lines = render(status_view(run_view(fold(events))))
    fits(lines)
    text = "\n".join(lines)
    assert "failed" in text and "1 min 15 s" in text and "task 'scan' failed" in text
    assert "exit code 137" in text
    assert "skipped" in next(line for line in lines if line.startswith("report"))


def test_text_with_brackets_is_shown_literally() -> None:
    events = [
        *two_task_events(units=10),
        ev.Failed(seq=4, time=T0, message="bad value [red]x[/red] in settings[0]"),
    ]
    text = "\n".join(render(status_view(run_view(fold(events)))))
    assert "bad value [red]x[/red] in settings[0]" in text


def test_the_list_of_runs_keeps_ids_whole_at_80_columns() -> None:
    running = fold(two_task_events(units=10) + unit_events(4, "scan", range(5)))
    items = [
        run_item(running),
        run_item(
            msgspec.structs.replace(
                running, id="20250102-030405-000001", submitted_by="a-long-agent-name"
            )
        ),
    ]
    lines = render(runs_table(items))
    fits(lines)
    assert any(RUN_ID in line for line in lines)
    assert any("20250102-030405-000001" in line for line in lines)
    assert any("25%" in line for line in lines), (
        "the mean of a split task at 5/10 and a waiting one"
    )


def test_the_history_shows_every_event_compactly() -> None:
    events = two_task_events(units=10) + unit_events(4, "scan", range(2))
    rows = [msgspec.to_builtins(event) for event in events]
    lines = render(history_table(rows))
    fits(lines)
    text = "\n".join(lines)
    for name in ("submitted", "workflow-submitted", "task-state", "unit-done"):
        assert name in text
    assert "task=scan state=running" in text
    assert '"tasks"' not in text, "the workflow of `submitted` is named, not dumped"


def test_the_list_of_runs_has_a_group_and_progress_only_with_live_runs() -> None:
    ended = fold([*two_task_events(units=10), ev.Succeeded(seq=4, time=T0)])
    grouped = msgspec.structs.replace(ended, group="hctz")
    lines = render(runs_table([run_item(grouped), run_item(ended)]))
    assert lines[0].split() == ["id", "workflow", "group", "state", "submitter", "created"]
    assert lines[2].split()[:4] == [RUN_ID, "fit", "hctz", "succeeded"]
    assert lines[3].split()[:3] == [RUN_ID, "fit", "succeeded"]
    running = fold(two_task_events(units=10))
    live = render(runs_table([run_item(running), run_item(ended)]))
    assert live[0].split() == ["id", "workflow", "group", "state", "submitter", "created", "done"]
    assert live[2].split()[-1] == "0%" and len(live[3].split()) == 6


def test_printed_tables_end_no_line_in_spaces() -> None:
    items = [run_item(fold(two_task_events(units=10)))]
    view = status_view(run_view(fold(two_task_events())))
    padded = render(view)
    assert any(line != line.rstrip() for line in padded), "rich pads the cells"
    assert render(Trimmed(view)) == [line.rstrip() for line in padded]
    events = [msgspec.to_builtins(event) for event in two_task_events(units=10)]
    for view in (status_view(run_view(fold(two_task_events()))), history_table(events)):
        assert all(line == line.rstrip() for line in render(Trimmed(view)))
    terminal = Console(file=io.StringIO(), width=80, force_terminal=True, color_system="standard")
    terminal.print(Trimmed(runs_table(items)))
    text = terminal.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[" in text and not any(line.endswith(" ") for line in text.splitlines())


def test_the_history_breaks_no_value_in_the_middle_and_shows_times_and_sizes() -> None:
    name = "simrun-20261201-164915-55e4af-with-a-suffix-too-long-for-its-column"
    report = ev.WorkerReport(
        seq=4,
        time=T0,
        task="scan",
        worker="w0",
        peak_memory_bytes=48 * 2**20,
        started=T0.timestamp() - 1.5,
        message="stopped from outside (exit code 143); see the log w0-0.log",
    )
    events = [
        msgspec.to_builtins(ev.WorkflowSubmitted(seq=3, time=T0, name=name)),
        msgspec.to_builtins(report),
    ]
    lines = render(history_table(events))
    fits(lines)
    text = "\n".join(lines)
    assert "name=simrun-20261201-164915-55e4af" in text and "…" in text
    assert "too-long-for-its-column" not in text, "a word too long is cut, not folded"
    words = {word for line in lines for word in line.split()}
    for whole in ("(exit", "code", "143);", "w0-0.log", "peak_memory_bytes=48.0", "MiB"):
        assert whole in words, f"{whole} is broken"
    started = (T0 - timedelta(seconds=1.5)).astimezone().strftime("%m-%d %H:%M:%S.500")
    assert f"started={started}" in text and str(int(T0.timestamp())) not in text


def test_outputs_and_sizes() -> None:
    lines = render(
        outputs_table([OutputFile("squares/1.json", 28), OutputFile("summary.json", 2_500_000)])
    )
    fits(lines)
    assert any("squares/1.json" in line and "28 B" in line for line in lines)
    assert any("summary.json" in line and "2.4 MiB" in line for line in lines)


def test_durations_and_sizes_read_naturally() -> None:
    seconds = (0, 0.0004, 0.4, 0.25, 1, 6.2, 42, 59.7, 185, 3600, 7620)
    assert [format_duration(s) for s in seconds] == [
        "0 s",
        "0 s",
        "0.4 s",
        "0.25 s",
        "1 s",
        "6.2 s",
        "42 s",
        "1 min",
        "3 min 5 s",
        "1 h",
        "2 h 7 min",
    ]
    assert [format_bytes(n) for n in (0, 1023, 1024, 12_345_678, 2**20 - 1, 2**40)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "11.8 MiB",
        "1.0 MiB",
        "1.0 TiB",
    ]


def test_counts_are_singular_for_one() -> None:
    assert [format_count(n, "file") for n in (0, 1, 2)] == ["0 files", "1 file", "2 files"]
    assert format_count(2, "process", "processes") == "2 processes"


def watch_of(events: list[ev.Event]) -> RunWatch:
    watch = RunWatch()
    for event in events:
        watch.apply(event)
    return watch


def test_plain_lines_tell_states_and_every_tenth_of_the_units() -> None:
    lines: list[str] = []
    view = PlainLines(lines.append)
    watch = RunWatch()
    events = [
        *two_task_events(units=20),
        *unit_events(4, "scan", range(20)),
        ev.TaskStateChanged(
            seq=24, time=T0 + timedelta(seconds=130), task="scan", state=TaskState.DONE
        ),
    ]
    for event in events:
        watch.apply(event)
        view.show(watch, event)
    assert f"run {RUN_ID}: submitting (2 tasks)" in lines[0]
    assert lines[1].endswith("scan: running")
    units = [line for line in lines if "units" in line]
    assert [line.split()[-3] for line in units] == [f"{n}/20" for n in range(2, 21, 2)]
    assert units[0].endswith("(10%)") and units[-1].endswith("(100%)")
    assert lines[-1].endswith("scan: done after 2 min 8 s")
    assert len(lines) == 13


def test_plain_lines_count_the_units_of_batches_and_singles_once() -> None:
    lines: list[str] = []
    view = PlainLines(lines.append)
    watch = RunWatch()
    batches = [list(range(0, 7)), [3, 7], list(range(8, 20))]  # 7 units, 1 new, 12 new
    events = [
        *two_task_events(units=20),
        *(
            ev.UnitsDone(
                seq=4 + n,
                time=T0 + timedelta(seconds=100 + n),
                task="scan",
                worker="w0",
                indices=tuple(indices),
                seconds=(0.0,) * len(indices),
            )
            for n, indices in enumerate(batches)
        ),
    ]
    for event in events:
        watch.apply(event)
        view.show(watch, event)
    units = [(line.split()[-3], line.split()[-1]) for line in lines if "units" in line]
    assert units == [("7/20", "(35%)"), ("8/20", "(40%)"), ("20/20", "(100%)")], lines


def failed_scan(seq: int) -> ev.TaskStateChanged:
    return ev.TaskStateChanged(
        seq=seq,
        time=T0 + timedelta(seconds=130),
        task="scan",
        state=TaskState.FAILED,
        message="unit 3 failed",
    )


def test_plain_lines_show_the_end_of_the_log_under_a_failed_task() -> None:
    lines: list[str] = []
    asked: list[tuple[str, str]] = []

    def failure(run_id: str, task: str) -> list[str]:
        asked.append((run_id, task))
        return ["  | the end of the log", "  more of its log: simrun logs RUN scan"]

    view = PlainLines(lines.append, failure)
    events = two_task_events(units=20)
    watch = RunWatch()
    for event in [*events, failed_scan(events[-1].seq + 1)]:
        watch.apply(event)
        view.show(watch, event)
    assert asked == [(RUN_ID, "scan")]
    assert lines[-3].endswith("scan: failed after 2 min 8 s: unit 3 failed")
    assert lines[-2:] == ["  | the end of the log", "  more of its log: simrun logs RUN scan"]


def test_live_lines_print_the_end_of_the_log_of_a_failed_task_above_them() -> None:
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, color_system=None)
    view = LiveLines(console, lambda run_id, task: [f"  more: simrun logs {run_id} {task}"])
    events = two_task_events(units=10)
    watch = watch_of(events)
    failed = failed_scan(events[-1].seq + 1)
    watch.apply(failed)
    view.show(watch, failed)
    assert "scan: failed: unit 3 failed" in out.getvalue()
    assert f"  more: simrun logs {RUN_ID} scan" in out.getvalue()


def test_live_lines_take_a_view_after_units_at_most_a_few_times_a_second() -> None:
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    view = LiveLines(console)
    events = two_task_events(units=10) + unit_events(4, "scan", range(4))
    watch = watch_of(events[:-1])
    view.show(watch, events[-2])
    assert view.run is not None and view.run.tasks["scan"].done == 3
    watch.apply(events[-1])
    view.show(watch, events[-1])  # a unit right after a view: drawn by the next one
    assert view.run.tasks["scan"].done == 3
    report = ev.TaskStateChanged(
        seq=events[-1].seq + 1, time=T0 + timedelta(seconds=200), task="scan", state=TaskState.DONE
    )
    watch.apply(report)
    view.show(watch, report)  # any other event is drawn at once
    assert view.run.tasks["scan"].done == 4 and view.run.tasks["scan"].state == "done"


def test_live_lines_draw_a_line_per_task_with_a_bar() -> None:
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    view = LiveLines(console)
    events = two_task_events(units=10) + unit_events(4, "scan", range(4))
    view.show(watch_of(events), events[-1])
    lines = render(view.render())
    fits(lines)
    assert RUN_ID in lines[0] and "running" in lines[0]
    scan = next(line for line in lines if "scan" in line)
    assert "4/10" in scan and "━" in scan
    assert any("report" in line and "waiting" in line for line in lines)


def console_of(width: int = 80) -> Console:
    return Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False)


def compare_lines(table: CompareTable, width: int = 80) -> list[str]:
    console = console_of(width)
    console.print(compare_view(table, console))
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


RUNS = ["20250102-030405-abcdef", "20250102-030406-bcdefa", "20250102-030407-cdefab"]


def columns_text(lines: list[str]) -> dict[str, str]:
    """The text of every column of transposed blocks, by header: its cells top to bottom, each
    line's slice stripped and joined, so a value wrapped over lines reads whole again."""
    texts: dict[str, str] = {}
    starts: list[tuple[str, int]] = []
    for line in lines:
        if line.startswith("run ") and any(run in line for run in RUNS):
            heads = ["run", *(run for run in RUNS if run in line)]
            starts = [(head, line.index(head)) for head in heads]
            continue
        if not starts or set(line) <= {"─", " "}:
            continue
        for number, (head, start) in enumerate(starts):
            end = starts[number + 1][1] if number + 1 < len(starts) else None
            texts[head] = texts.get(head, "") + line[start:end].strip()
    return texts


def test_a_narrow_comparison_is_a_row_per_run_with_numbers_to_the_right() -> None:
    table = CompareTable(
        columns=["run", "state", "squares.sum"],
        rows=[
            {"run": RUNS[0], "state": "succeeded", "squares.sum": 2470},
            {"run": RUNS[1], "state": "failed", "squares.sum": None},
            {"run": RUNS[2], "state": "succeeded", "squares.sum": 12345678},
        ],
    )
    lines = compare_lines(table)
    fits(lines)
    assert lines[0].split() == ["run", "state", "squares.sum"]
    assert set(lines[1]) == {"─"}, "a rule under the header"
    rows = {line.split()[0]: line for line in lines[2:]}
    assert rows[RUNS[0]].endswith(" 2470") and rows[RUNS[2]].endswith("12345678")
    assert rows[RUNS[0]].index("2470") > rows[RUNS[2]].index("12345678"), "right-aligned"


def test_a_wide_comparison_is_transposed_and_keeps_every_value_whole_at_80() -> None:
    sha = "0123456789abcdef" * 4
    long_path = "src/models/a_very_long_module_name/with/deep/folders/kinetics.py"
    columns = [
        "run",
        "group",
        "agent",
        "state",
        "model.changed_files",
        "model.diff_sha256",
        "fit.objective_value_at_the_optimum_found",
        "fit.iterations",
    ]
    rows = [
        {
            "run": run,
            "group": "hctz-study-with-a-long-name",
            "agent": f"subagent-{index}",
            "state": "succeeded",
            "model.changed_files": [long_path, "b.py"] if index == 0 else [],
            "model.diff_sha256": sha if index == 0 else None,
            "fit.objective_value_at_the_optimum_found": 0.1 + 0.2 * index,
            "fit.iterations": 10**index,
        }
        for index, run in enumerate(RUNS)
    ]
    lines = compare_lines(CompareTable(columns=columns, rows=rows))
    fits(lines)
    cells = columns_text(lines)
    assert cells[RUNS[0]].startswith("hctz-study-with-a-long-namesubagent-0succeeded")
    for value in (sha, long_path, "0.1"):
        assert value in cells[RUNS[0]], f"{value} is cut"
    assert "0.30000000000000004" in cells[RUNS[1]] and "100" in cells[RUNS[2]]
    for key in columns[1:]:
        assert key in cells["run"], f"{key} is cut"
    for run in RUNS:
        assert sum(run in line for line in lines) == 1, "each run heads one column once"
    header = next(line for line in lines if RUNS[0] in line)
    assert header.split()[0] == "run" and RUNS[1] in header, "a column per run"
    assert any(line.startswith("state") for line in lines), "a row per column"
    iterations = [line for line in lines if line.startswith("fit.iterations")]
    assert len(iterations) == 2, "two blocks: the third run does not fit beside the others"
    assert iterations[0].rstrip().endswith("10"), "numbers to the right of their column"


def test_usage_per_group_and_run_in_human_sizes_right_aligned() -> None:
    usage = Usage(
        runs={RUNS[0]: 12_345_678, RUNS[1]: 999, RUNS[2]: 2_000_000_000},
        groups={"hctz": 12_346_677, "": 2_000_000_000},
    )
    lines = render(usage_view(usage, {RUNS[0]: "hctz", RUNS[1]: "hctz", RUNS[2]: None}))
    fits(lines)
    [hctz] = [line for line in lines if line.startswith("hctz ")]
    [none] = [line for line in lines if line.startswith("(no group) ")]
    assert hctz.endswith("11.8 MiB") and none.endswith("1.9 GiB")
    runs = {line.split()[0]: line for line in lines if line.startswith("2025")}
    assert runs[RUNS[0]].split()[1] == "hctz" and runs[RUNS[0]].endswith("11.8 MiB")
    assert runs[RUNS[1]].endswith("999 B") and runs[RUNS[2]].endswith("1.9 GiB")
    assert len({len(line) for line in runs.values()}) == 1, "sizes end in one column"
    assert render(usage_view(Usage(runs={}, groups={}), {})) == ["the store holds no runs"]


def test_cleanup_lists_what_it_removed_and_the_bytes() -> None:
    snapshot = "snapshots/model/" + "f" * 64
    runs = [f"runs/{run}" for run in RUNS[:2]]
    result = CleanupResult(runs=runs, snapshots=[snapshot], bytes_freed=5_500_000, dry_run=True)
    lines = render(cleanup_view(result))
    fits(lines)
    text = "\n".join(lines)
    assert all(run in text for run in runs) and "f" * 40 in text.replace("\n", "")
    assert lines[-1] == "would remove 2 runs and 1 snapshot, 5.2 MiB"
    done = render(cleanup_view(msgspec.structs.replace(result, dry_run=False)))
    assert done[-1] == "removed 2 runs and 1 snapshot, 5.2 MiB"
    nothing = CleanupResult(runs=[], snapshots=[], bytes_freed=0, dry_run=False)
    assert render(cleanup_view(nothing)) == ["nothing to remove"]


@pytest.mark.parametrize(
    ("request_", "why"),
    [
        (CleanupRequest(), "no run you may remove ended 30 days ago or earlier (--older-than 30)"),
        (
            CleanupRequest(older_than_days=1, group="study", failed_only=True),
            "no failed run of group 'study' you may remove ended 1 day ago or earlier "
            "(--older-than 1)",
        ),
        (CleanupRequest(older_than_days=0.5), "ended 0.5 days ago or earlier (--older-than 0.5)"),
        (CleanupRequest(older_than_days=0), "no run you may remove has ended (--older-than 0)"),
    ],
)
def test_a_cleanup_that_removes_nothing_says_why(request_: CleanupRequest, why: str) -> None:
    nothing = CleanupResult(runs=[], snapshots=[], bytes_freed=0, dry_run=True)
    lines = render(cleanup_view(nothing, request_))
    fits(lines)
    text = " ".join(" ".join(lines).split())
    assert text.startswith("nothing to remove (dry run): ")
    assert why in text
    assert text.endswith("no snapshot is unreferenced (one written within the last hour is kept)")


def test_every_list_table_fits_80_columns_with_long_values() -> None:
    long = "a-rather-long-name-that-keeps-going-" * 3
    running = fold(two_task_events(units=10))
    item = msgspec.structs.replace(
        run_item(running), workflow=f"workflow-{long}", submitted_by=f"agent-{long}"
    )
    estimate = TaskEstimate(
        resources=ResolvedResources(
            memory_base_gb=1.5, memory_per_worker_gb=0.25, source=f"learned from 12 runs {long}"
        ),
        plan=plan(f"task-{long}", 1000),
        seconds=12345.0,
    )
    usage = Usage(runs={RUN_ID: 10**12}, groups={f"group-{long}": 10**12})
    tables = {
        "list": runs_table([item]),
        "outputs": outputs_table([OutputFile(f"dir-{long}/file-{long}.json", 10**9)]),
        "estimate": estimate_table({f"task-{long}": estimate}),
        "usage": usage_view(usage, {RUN_ID: f"group-{long}"}),
    }
    for name, table in tables.items():
        lines = render(table)
        fits(lines)
        joined = "".join(line.strip() for line in lines)
        if name == "list":  # three columns fold side by side: read the workflow's alone
            start, end = lines[0].index("workflow"), lines[0].index("group")
            joined = "".join(line[start:end].strip() for line in lines[2:])
            assert joined == item.workflow, "the workflow is shown whole"
        assert "keeps-going" in joined, f"{name}: the long value is shown"
    assert RUN_ID in "\n".join(render(tables["list"])), "an id is never wrapped"
    assert "931.3 GiB" in "\n".join(render(tables["usage"]))


def test_a_run_with_pods_shows_each_worker_with_its_node_and_exit() -> None:
    events = [
        *two_task_events(units=10),
        ev.PodStarted(seq=4, time=T0, task="scan", worker="w0", node="node-1"),
        ev.PodStarted(seq=5, time=T0, task="scan", worker="w1", node="node-2"),
        ev.PodFailed(seq=6, time=T0, task="scan", worker="w1", exit_code=137, oom=True),
    ]
    lines = render(status_view(run_view(fold(events))))
    fits(lines)
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["task", "worker"])
    assert lines[header].split() == ["task", "worker", "attempt", "state", "node", "exit"]
    assert lines[header + 2].split() == ["scan", "w0", "0", "running", "node-1"]
    assert lines[header + 3].split() == ["scan", "w1", "0", "failed", "node-2", "137", "oom"]
    without = render(status_view(run_view(fold(two_task_events(units=10)))))
    assert not any(line.split()[:2] == ["task", "worker"] for line in without)
