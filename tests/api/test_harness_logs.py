"""The harness logs of a run, listed again only when their directories change."""

from __future__ import annotations

import os
import time
from pathlib import Path

from simrun_api import harness_logs
from simrun_api.harness_logs import HarnessLogs


def _log(tasks: Path, task: str, name: str, text: str = "") -> Path:
    path = tasks / task / "events" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _age(directory: Path, seconds: float) -> int:
    """Set a directory's modification time `seconds` back; the time set (ns)."""
    mtime = time.time_ns() - int(seconds * 1e9)
    os.utime(directory, ns=(mtime, mtime))
    return mtime


def test_every_log_of_every_task_in_path_order_hidden_and_other_files_left_out(
    tmp_path: Path,
) -> None:
    tasks = tmp_path / "tasks"
    b = _log(tasks, "b", "w0.0.jsonl")
    a1 = _log(tasks, "a", "w1.0.jsonl")
    a0 = _log(tasks, "a", "w0.0.jsonl")
    _log(tasks, "a", ".w2.0.jsonl")
    _log(tasks, "a", "w0.0.log")
    (tasks / "c").mkdir()  # a task without an events directory yet
    assert HarnessLogs(tasks).paths() == [a0, a1, b]
    assert HarnessLogs(tmp_path / "none").paths() == []


def test_a_directory_unchanged_since_its_listing_is_not_listed_again(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    first = _log(tasks, "a", "w0.0.jsonl")
    events = first.parent
    logs = HarnessLogs(tasks)
    _age(tasks, 10)
    mtime = _age(events, 10)
    assert logs.paths() == [first]
    hidden = _log(tasks, "a", "w1.0.jsonl")
    os.utime(events, ns=(mtime, mtime))  # as if created within the same tick of the clock
    logs.changed()
    assert logs.paths() == [first]  # looked at, but the listing kept: the time is the same
    os.utime(events, ns=(mtime + 1, mtime + 1))
    logs.changed()
    assert logs.paths() == [first, hidden]


def test_the_directories_are_looked_at_again_after_a_change_or_a_while(
    tmp_path: Path, monkeypatch
) -> None:
    tasks = tmp_path / "tasks"
    first = _log(tasks, "a", "w0.0.jsonl")
    _age(tasks, 10)
    _age(first.parent, 10)
    logs = HarnessLogs(tasks)
    assert logs.paths() == [first]
    second = _log(tasks, "a", "w1.0.jsonl")
    assert logs.paths() == [first]  # not looked at within RELIST_S
    _age(second.parent, 10)
    logs.changed()
    assert logs.paths() == [first, second]
    third = _log(tasks, "b", "w0.0.jsonl")
    _age(tasks, 10)
    _age(third.parent, 10)
    assert logs.paths() == [first, second]
    monkeypatch.setattr(harness_logs, "RELIST_S", 0.0)
    logs.changed()  # the next look is due now; from then on every look is due at once
    logs.paths()
    fourth = _log(tasks, "c", "w0.0.jsonl")
    assert logs.paths() == [first, second, third, fourth]


def test_a_directory_changed_recently_is_listed_each_time(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    first = _log(tasks, "a", "w0.0.jsonl")
    events = first.parent
    logs = HarnessLogs(tasks)
    mtime = _age(events, 0.1)
    assert logs.paths() == [first]
    second = _log(tasks, "a", "w1.0.jsonl")
    os.utime(events, ns=(mtime, mtime))  # the same time as at the listing, but recent
    assert logs.paths() == [first, second]


def test_grown_gives_the_logs_longer_than_their_offsets(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    read = _log(tasks, "a", "w0.0.jsonl", "x\n")
    more = _log(tasks, "a", "w1.0.jsonl", "x\ny\n")
    new = _log(tasks, "b", "w0.0.jsonl", "z\n")
    empty = _log(tasks, "b", "w1.0.jsonl")
    offsets = {read: 2, more: 2}
    assert HarnessLogs(tasks).grown(offsets) == [more, new]
    assert empty not in HarnessLogs(tasks).grown({})
