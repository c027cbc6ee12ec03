"""The tables and lines people read, at 80 columns."""

from __future__ import annotations

import io
from datetime import timedelta

import msgspec
from cli_helpers import RUN_ID, T0, two_task_events, unit_events
from rich.console import Console, RenderableType

from simrun_cli.follow import LiveLines, PlainLines, RunWatch
from simrun_cli.render import (
    format_bytes,
    format_duration,
    history_table,
    outputs_table,
    run_view,
    runs_table,
)
from simrun_core import events as ev
from simrun_core.fold import fold
from simrun_core.states import TaskState
from simrun_core.views import run_item
from simrun_core.wire import OutputFile


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
    lines = render(run_view(record))
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
    lines = render(run_view(fold(events)))
    fits(lines)
    text = "\n".join(lines)
    assert "failed" in text and "1m15s" in text and "task 'scan' failed" in text
    assert "exit code 137" in text
    assert "skipped" in next(line for line in lines if line.startswith("report"))


def test_text_with_brackets_is_shown_literally() -> None:
    events = [
        *two_task_events(units=10),
        ev.Failed(seq=4, time=T0, message="bad value [red]x[/red] in settings[0]"),
    ]
    assert "bad value [red]x[/red] in settings[0]" in "\n".join(render(run_view(fold(events))))


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


def test_outputs_and_sizes() -> None:
    lines = render(
        outputs_table([OutputFile("squares/1.json", 28), OutputFile("summary.json", 2_500_000)])
    )
    fits(lines)
    assert any("squares/1.json" in line and "28 B" in line for line in lines)
    assert any("summary.json" in line and "2.5 MB" in line for line in lines)


def test_durations_and_sizes_read_naturally() -> None:
    assert [format_duration(s) for s in (0, 42, 185, 7620)] == ["0s", "42s", "3m05s", "2h07m"]
    assert [format_bytes(n) for n in (0, 999, 1000, 12_345_678)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "12.3 MB",
    ]


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
    assert lines[-1].endswith("scan: done after 2m08s")
    assert len(lines) == 13


def test_live_lines_draw_a_line_per_task_with_a_bar() -> None:
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    view = LiveLines(console)
    view.watch = watch_of(two_task_events(units=10) + unit_events(4, "scan", range(4)))
    lines = render(view.render())
    fits(lines)
    assert RUN_ID in lines[0] and "running" in lines[0]
    scan = next(line for line in lines if "scan" in line)
    assert "4/10" in scan and "━" in scan
    assert any("report" in line and "waiting" in line for line in lines)
