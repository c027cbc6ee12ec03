"""The harness event logs of a run (`tasks/<task>/events/*.jsonl`), listed cheaply enough to be
looked at every few tenths of a second by each of a thousand actors.

A glob of `tasks/*/events/*.jsonl` lists every directory each time (~0.1 ms a run here, and
every system call of the event loop's thread gives the GIL away to the threads appending to the
logs); this looks at the directories again only every `RELIST_S`, or at the next look after
`changed()` (a pod of the run changed: a new pod writes a new log), and lists a directory only
when its modification time changed or is recent (a file created within the same tick of the
file system's clock as the listing before leaves the time unchanged). A look at a run whose
logs did not change then costs a `stat` per log. `grown` gives only the logs longer than the
offsets read so far. A log seen late is read whole then; and the actor reads a pod's own log
at its end by its name, whatever this listed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

RECENT_S = 1.0
"""A directory changed less than this ago (by its modification time) is listed again each time."""
RELIST_S = 1.0
"""The directories are looked at again at least this often (seconds)."""


class HarnessLogs:
    """The harness logs below a run's `tasks/` directory, listings kept between looks."""

    def __init__(self, tasks: Path) -> None:
        self.tasks = tasks
        self._listed: dict[Path, tuple[int, list[Path]]] = {}
        """By directory: its modification time (ns) when listed, and the paths it had."""
        self._logs: list[Path] = []
        self._relist_at = float("-inf")  # time.monotonic() of the next look at the directories
        self._recent = False  # a directory changed recently: look at them again next time

    def changed(self) -> None:
        """Look at the directories again at the next call (a pod started or ended)."""
        self._relist_at = float("-inf")

    def _paths_in(self, directory: Path, suffix: str | None) -> list[Path]:
        """The paths in a directory (of files ending in `suffix`, or of directories), sorted;
        listed (and joined) again only when it changed; [] when it does not exist."""
        try:
            mtime = os.stat(directory).st_mtime_ns
        except OSError:
            self._listed.pop(directory, None)
            return []
        known = self._listed.get(directory)
        recent = time.time_ns() - mtime <= RECENT_S * 1e9
        self._recent = self._recent or recent
        if known is not None and known[0] == mtime and not recent:
            return known[1]
        try:
            with os.scandir(directory) as entries:
                visible = [entry for entry in entries if not entry.name.startswith(".")]
                if suffix is None:
                    names = [entry.name for entry in visible if entry.is_dir()]
                else:
                    names = [entry.name for entry in visible if entry.name.endswith(suffix)]
        except OSError:
            return []
        paths = [directory / name for name in sorted(names)]
        self._listed[directory] = (mtime, paths)
        return paths

    def paths(self) -> list[Path]:
        """Every harness log of the run, in the order of their paths, as the directories were
        at the last look (see the module)."""
        now = time.monotonic()
        if now < self._relist_at and not self._recent:
            return self._logs
        self._recent = False
        found: list[Path] = []
        for task in self._paths_in(self.tasks, None):
            found += self._paths_in(task / "events", ".jsonl")
        self._logs = found
        self._relist_at = now + RELIST_S
        return found

    def grown(self, offsets: dict[Path, int]) -> list[Path]:
        """The logs whose size differs from the offset they were read up to (0 unread)."""
        changed = []
        for path in self.paths():
            try:
                size = os.stat(path).st_size
            except OSError:
                continue
            if size != offsets.get(path, 0):
                changed.append(path)
        return changed
