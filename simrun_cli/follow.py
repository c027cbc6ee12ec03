"""Following a run to its end: its events folded as they come, drawn from the view of the run
(`simrun_core.views`) as live or plain lines.

On a terminal `LiveLines` redraws one line per task (id, state, a bar of the units of a split
task, elapsed time); elsewhere `PlainLines` prints a line when a task changes state and about
every tenth of its units, then a line with the end of the run. Under the line of a task that
failed both print the last lines of its log and the command that shows more (`failure_lines`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from simrun_cli.formats import format_count, format_duration, units_text
from simrun_core import events as ev
from simrun_core.fold import RunFold, RunRecord
from simrun_core.states import TaskState
from simrun_core.views import run_view, task_view
from simrun_core.wire import RunView, TaskView

if TYPE_CHECKING:  # rich is imported by `LiveLines` only: plain lines need none of it
    from rich.console import Console, RenderableType

    from simrun_cli.client import Client

BAR_WIDTH = 20
REFRESH_PER_SECOND = 4
FAILED_LOG_LINES = 10
"""The last lines of the log of each pod of a failed task shown under its line."""
FAILED_LOG_MAX = 20
"""The most lines of logs shown under the line of a failed task (of all its pods)."""

Failure = Callable[[str, str], list[str]]
"""The lines shown under the line of a failed task, of a run id and a task id."""


def failure_lines(client: Client, run_id: str, task: str, local: bool = False) -> list[str]:
    """The last lines of the log of a failed task (`FAILED_LOG_LINES` of each of its pods, at
    most `FAILED_LOG_MAX`), indented, then the command that shows more; the command alone when
    the log cannot be read."""
    from simrun_cli.client import ServiceError, ServiceUnreachable

    command = f"simrun logs {run_id} {task}{' --local' if local else ''}"
    try:
        text = client.logs(run_id, task, tail_lines=FAILED_LOG_LINES)
    except (ServiceError, ServiceUnreachable):
        return [f"  its log: {command}"]
    lines = [line for line in text.splitlines() if line.strip()]
    shown = [f"  | {line}" for line in lines[:FAILED_LOG_MAX]]
    if len(lines) > FAILED_LOG_MAX:
        shown.append(f"  | ... ({len(lines) - FAILED_LOG_MAX} more lines)")
    return [*shown, f"  more of its log: {command}"]


class RunWatch:
    """The fold of a followed run and when each of its tasks started running and ended."""

    def __init__(self) -> None:
        self.fold = RunFold()
        self.started: dict[str, datetime] = {}
        self.ended: dict[str, datetime] = {}

    @property
    def record(self) -> RunRecord | None:
        """The run as folded so far; None before its `submitted` event."""
        return self.fold.record

    @property
    def view(self) -> RunView | None:
        """The view of the run so far, as `GET /runs/{run}` answers it; None before it began."""
        record = self.fold.record
        return None if record is None else run_view(record)

    def task(self, task: str) -> TaskView | None:
        """The view of one task so far; None before the run began or for an unknown task."""
        record = self.fold.record
        if record is None or task not in record.tasks:
            return None
        return task_view(record, task)

    def apply(self, event: ev.Event) -> None:
        """Fold one event and note the start and end of tasks."""
        self.fold.apply(event)
        if isinstance(event, ev.TaskStateChanged):
            if event.state is TaskState.RUNNING:
                self.started.setdefault(event.task, event.time)
            if event.state.final:
                self.ended.setdefault(event.task, event.time)
        elif isinstance(event, ev.TERMINAL_EVENTS) and self.record is not None:
            for task in self.record.tasks:
                self.ended.setdefault(task, event.time)

    def elapsed(self, task: str, now: datetime | None = None) -> float | None:
        """Seconds a task ran (until now while it runs); None before it started."""
        started = self.started.get(task)
        if started is None:
            return None
        end = self.ended.get(task) or now or datetime.now(UTC)
        return max(0.0, (end - started).total_seconds())


class Display(Protocol):
    """What draws a followed run: a context around the following, shown every event."""

    def __enter__(self) -> Display: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...

    def show(self, watch: RunWatch, event: ev.Event) -> None:
        """Draw the run after an event was folded."""


class PlainLines:
    """Lines for logs and pipes: a task that changes state, every tenth of its units, the end."""

    def __init__(self, write: Callable[[str], None], failure: Failure | None = None) -> None:
        self.write = write
        self.failure = failure
        self._tenths: dict[str, int] = {}

    def __enter__(self) -> PlainLines:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def show(self, watch: RunWatch, event: ev.Event) -> None:
        """Print the line an event asks for, if any."""
        if watch.record is None:
            return
        clock = event.time.astimezone().strftime("%H:%M:%S")
        if isinstance(event, ev.Submitted) and (view := watch.view) is not None:
            tasks = format_count(len(view.tasks), "task")
            self.write(f"{clock} run {view.id}: {view.state} ({tasks})")
        elif isinstance(event, ev.TaskStateChanged):
            line = f"{clock} {event.task}: {event.state}"
            elapsed = watch.elapsed(event.task, event.time)
            if event.state.final and elapsed is not None:
                line += f" after {format_duration(elapsed)}"
            if event.message:
                line += f": {event.message}"
            self.write(line)
            if event.state is TaskState.FAILED and self.failure is not None:
                for note in self.failure(watch.record.id, event.task):
                    self.write(note)
        elif isinstance(event, ev.UNITS_EVENTS):
            progress = watch.record.progress.get(event.task)  # the fold's count: O(1) a unit
            if progress is None or not progress.units:
                return
            done, total = progress.done, progress.units
            tenth = done * 10 // total
            if tenth > self._tenths.get(event.task, 0):
                self._tenths[event.task] = tenth
                units = format_count(total, "unit")
                self.write(f"{clock} {event.task}: {done}/{units} ({done / total:.0%})")


class LiveLines:
    """A line per task on a terminal, redrawn while the run goes on."""

    def __init__(self, console: Console, failure: Failure | None = None) -> None:
        from rich.live import Live

        self.console = console
        self.failure = failure
        self.watch: RunWatch | None = None
        self._drawn = float("-inf")  # time.monotonic() of the last view taken
        self.run: RunView | None = None
        """The view drawn, taken in `show`: rich redraws from a thread of its own too, which
        reads this view and never the fold that changes meanwhile."""
        self._live = Live(
            console=console,
            get_renderable=self.render,
            refresh_per_second=REFRESH_PER_SECOND,
            redirect_stderr=False,
        )

    def __enter__(self) -> LiveLines:
        self._live.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._live.refresh()
        self._live.stop()

    def show(self, watch: RunWatch, event: ev.Event) -> None:
        """Redraw with the run after an event; after units done at most `REFRESH_PER_SECOND`
        times a second (a view of the run costs more than folding a unit)."""
        self.watch = watch
        failed = isinstance(event, ev.TaskStateChanged) and event.state is TaskState.FAILED
        if failed and self.failure is not None and watch.record is not None:
            assert isinstance(event, ev.TaskStateChanged)
            line = f"{event.task}: failed" + (f": {event.message}" if event.message else "")
            for note in [line, *self.failure(watch.record.id, event.task)]:
                self.console.print(note, markup=False, highlight=False)  # above the live lines
        now = time.monotonic()
        if isinstance(event, ev.UNITS_EVENTS) and now - self._drawn < 1 / REFRESH_PER_SECOND:
            return
        self._drawn = now
        self.run = watch.view
        self._live.refresh()

    def render(self) -> RenderableType:
        """The lines of the tasks: id, state, bar and units of a split task, elapsed time."""
        from rich import box
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        from simrun_cli.render import state_text

        view = self.run
        if self.watch is None or view is None:
            return Text("waiting for the run…", style="dim")
        table = Table(box=box.SIMPLE, show_header=False, pad_edge=False)
        table.add_column("task", no_wrap=True)
        table.add_column("state", no_wrap=True)
        table.add_column("bar", no_wrap=True, width=BAR_WIDTH)
        table.add_column("units", justify="right", no_wrap=True)
        table.add_column("elapsed", justify="right", no_wrap=True)
        now = datetime.now(UTC)
        for task_id, task in view.tasks.items():
            bar: RenderableType = ""
            if task.units:
                bar = ProgressBar(total=task.units, completed=task.done, width=BAR_WIDTH)
            elapsed = self.watch.elapsed(task_id, now)
            table.add_row(
                task_id,
                state_text(task.state),
                bar,
                units_text(task),
                "" if elapsed is None else format_duration(elapsed),
            )
        title = Text.assemble(("run ", "bold"), (view.id, "bold"), "  ")
        title.append_text(state_text(view.state))
        return Group(title, table)


def follow_run(
    client: Client, run_id: str, timeout_s: float | None, view: Display | None = None
) -> RunWatch:
    """Fold the events of a run until its end or `timeout_s`, showing each on `view`."""
    watch = RunWatch()
    for event in client.follow(run_id, timeout_s=timeout_s):
        watch.apply(event)
        if view is not None:
            view.show(watch, event)
    return watch
