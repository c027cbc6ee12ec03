"""One watcher of the harness logs for the whole service: one task of the event loop that looks
at every live run's harness logs each `TICK_S` and wakes only the actors whose logs grew.

A timer in each actor (five wake-ups a second of each, with a listing and a `stat` per log)
made a thousand live runs five thousand task switches and timers a second on the loop, idle or
not, and starved the routes. Here one task looks at the runs in `SLICES` slices spread over the
tick (`HarnessLogs` listing rules, one listing per registered run: a `stat` per log of a run
whose directories did not change) and calls the wake of an actor only when its logs grew.

The looks are made on the loop's thread, not on a thread of their own: measured (benchmarks/
many_runs.py, 300 live runs), a watcher thread contending for the GIL with the loop made the
routes and the streams slower than the timers it replaced (GET p50 ~38 ms against ~14 ms on the
loop), while the same looks on the loop cost less than the timers.

An actor registers its run's `tasks/` directory while it is live (`register`, which gives back
the `Watched` to unregister), and is told the paths of its logs whose size changed since the
watcher's last look (a fresh registration has seen nothing: its first look reports every log
that is not empty). What it was told is only a hint of where to read: the actor reads each log
from its own offset to the end, reads a pod's own log at the pod's end by its name, and every
log (its own listing) when its pods are gone, so a log seen late by the watcher loses nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path

from simrun_api.harness_logs import HarnessLogs

log = logging.getLogger(__name__)

TICK_S = 0.2
"""How often the watcher looks at every registered run's logs (seconds)."""
SLICES = 10
"""The runs are looked at in this many slices spread over a tick (each run in the same slice
every tick): the actors woken at once, and the appends and SSE writes they make then, are a
tenth of the live runs, not all of them in one burst each tick."""

Wake = Callable[[list[Path]], None]
"""Called on the event loop's thread with the paths of a run's logs that grew."""


@dataclasses.dataclass(eq=False)
class Watched:
    """A registered run: its logs' listing, the sizes last seen, whom to wake."""

    logs: HarnessLogs
    wake: Wake
    slice: int = 0
    sizes: dict[Path, int] = dataclasses.field(default_factory=dict)

    def changed(self) -> None:
        """Look at the run's directories again at the next tick (a pod started or ended)."""
        self.logs.changed()


def grown(watched: Watched) -> list[Path]:
    """The logs of a run whose size differs from the size last seen (a new log: from 0),
    remembering the sizes seen now; a log gone is forgotten."""
    found = []
    sizes: dict[Path, int] = {}
    for path in watched.logs.paths():
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        sizes[path] = size
        if size != watched.sizes.get(path, 0):
            found.append(path)
    watched.sizes = sizes
    return found


class HarnessWatch:
    """The service's one watcher of harness logs: a task of the running loop, started by a
    `register` when none runs, ended when no run is watched (an idle service wakes for
    nothing) or by `stop`."""

    def __init__(self, tick_s: float = TICK_S, slices: int = SLICES) -> None:
        self.tick_s = tick_s
        self._slices: list[dict[int, Watched]] = [{} for _ in range(slices)]
        self._registered = 0  # registrations so far: the next one's slice
        self._task: asyncio.Task[None] | None = None

    def register(self, tasks: Path, wake: Wake) -> Watched:
        """Watch the logs below a run's `tasks/` directory (from the loop's thread); `wake` is
        called with the logs that grew. Starts the watcher's task if it is not running."""
        watched = Watched(HarnessLogs(tasks), wake, self._registered % len(self._slices))
        self._registered += 1
        self._slices[watched.slice][id(watched)] = watched
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="harness-watch")
        return watched

    def unregister(self, watched: Watched) -> None:
        """Stop watching a run (its actor ended): it is woken no more."""
        self._slices[watched.slice].pop(id(watched), None)

    def watching(self) -> int:
        """How many runs are watched."""
        return sum(len(part) for part in self._slices)

    def stop(self) -> None:
        """Stop the watcher's task."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def look(self, part: int | None = None) -> list[tuple[Watched, list[Path]]]:
        """One look at the watched runs of a slice (None: every run): those whose logs grew,
        with the logs."""
        slices = self._slices if part is None else [self._slices[part]]
        found = []
        for run in [run for watched in slices for run in watched.values()]:
            try:
                paths = grown(run)
            except Exception:  # one run's odd directory must not stop the others' wake-ups
                log.exception("the harness logs below %s not looked at", run.logs.tasks)
                continue
            if paths:
                found.append((run, paths))
        return found

    async def _watch(self) -> None:
        """Look at a slice every `tick_s / slices` and wake the actors whose logs grew."""
        loop = asyncio.get_running_loop()
        step = self.tick_s / len(self._slices)
        due = loop.time()
        part = 0
        while self.watching():
            due = max(due + step, loop.time())  # late after a slow look: not to catch up
            await asyncio.sleep(due - loop.time())
            for run, paths in self.look(part):
                try:
                    run.wake(paths)
                except Exception:
                    log.exception("the wake-up of %s failed", run.logs.tasks)
            part = (part + 1) % len(self._slices)
