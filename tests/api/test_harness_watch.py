"""The service's one watcher of harness logs: which logs grew, and the wake-ups of the loop."""

from __future__ import annotations

import asyncio
from pathlib import Path

from simrun_api.harness_logs import HarnessLogs
from simrun_api.harness_watch import HarnessWatch, Watched, grown


def _log(tasks: Path, task: str, name: str, text: str = "") -> Path:
    path = tasks / task / "events" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _append(path: Path, text: str) -> None:
    with open(path, "a") as log:
        log.write(text)


def _nobody(paths: list[Path]) -> None:
    raise AssertionError("not to be woken")


def test_a_first_look_gives_the_logs_not_empty_then_only_those_that_grew(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    a = _log(tasks, "a", "w0.0.jsonl", "x\n")
    _log(tasks, "a", "w1.0.jsonl")
    b = _log(tasks, "b", "w0.0.jsonl", "y\n")
    watched = Watched(HarnessLogs(tasks), _nobody)
    assert grown(watched) == [a, b]
    assert grown(watched) == []
    _append(b, "more\n")
    assert grown(watched) == [b]
    assert grown(watched) == []


def test_a_new_log_is_seen_after_a_pod_change_and_a_log_gone_forgotten(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    a = _log(tasks, "a", "w0.0.jsonl", "x\n")
    watched = Watched(HarnessLogs(tasks), _nobody)
    assert grown(watched) == [a]
    late = _log(tasks, "a", "w0.1.jsonl", "z\n")
    watched.changed()
    assert grown(watched) == [late]
    a.unlink()
    assert grown(watched) == []
    assert list(watched.sizes) == [late]
    assert grown(Watched(HarnessLogs(tmp_path / "none"), _nobody)) == []


def test_look_gives_only_the_registered_runs_whose_logs_grew(tmp_path: Path) -> None:
    async def main() -> None:
        watch = HarnessWatch(tick_s=3600)  # its own looks far off: `look` is called here
        quiet = _log(tmp_path / "r1" / "tasks", "a", "w0.0.jsonl")
        busy = _log(tmp_path / "r2" / "tasks", "a", "w0.0.jsonl")
        try:
            first = watch.register(tmp_path / "r1" / "tasks", _nobody)
            second = watch.register(tmp_path / "r2" / "tasks", _nobody)
            assert (first.slice, second.slice) == (0, 1)
            assert watch.look() == []
            _append(busy, "u\n")
            assert watch.look(0) == []
            assert watch.look(1) == [(second, [busy])]
            _append(quiet, "u\n")
            watch.unregister(first)
            assert watch.look() == []
            assert watch.watching() == 1
        finally:
            watch.stop()

    asyncio.run(main())


def test_the_watcher_wakes_an_actor_on_the_loop_when_its_logs_grow_and_not_after(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        log = _log(tmp_path / "tasks", "a", "w0.0.jsonl")
        woken: asyncio.Queue[list[Path]] = asyncio.Queue()
        watch = HarnessWatch(tick_s=0.01, slices=2)
        try:
            watched = watch.register(tmp_path / "tasks", woken.put_nowait)
            _append(log, "unit\n")
            assert await asyncio.wait_for(woken.get(), 10) == [log]
            _append(log, "unit\n")
            assert await asyncio.wait_for(woken.get(), 10) == [log]
            # a tick without growth wakes nobody: the next wake-up is the next growth's
            other = watch.register(tmp_path / "none", _nobody)
            await _ticks(other, 3)
            assert woken.empty()
            watch.unregister(watched)
            _append(log, "unit\n")
            await _ticks(other, 3)
            assert woken.empty()
            assert watched.sizes[log] == len("unit\n") * 2
        finally:
            watch.stop()

    asyncio.run(main())


async def _ticks(watched: Watched, count: int) -> None:
    """Wait until the watcher looked at a registered run `count` more times."""
    looks = 0
    listing = watched.logs.paths

    def counted() -> list[Path]:
        nonlocal looks
        looks += 1
        return listing()

    watched.logs.paths = counted  # type: ignore[method-assign]
    async with asyncio.timeout(10):
        while looks < count:
            await asyncio.sleep(0.005)
