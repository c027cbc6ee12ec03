"""Which output files of a task to list, and in which order: the results first.

A split task's `out/` holds a few files its merge wrote (`summary.json`, the merged results)
and, in the directory of a port, one file per unit: thousands of them for a big task. A listing
that shows the results first and stops after `limit` files answers what a person or an agent
asks for without sending the units: `summary.json` comes first, then the files of the directories
that hold the fewest files, then the rest, each directory's files by path (`2.json` before
`10.json`). A `glob` narrows the listing to the paths below `out/` that match it (`fnmatch`:
`*` also crosses `/`, so `*.json` matches in every directory) of at most `GLOB_MAX_CHARS`
characters: a glob becomes a pattern in time that grows with the square of its length.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from fnmatch import translate
from functools import lru_cache
from posixpath import dirname

SUMMARY = "summary.json"
"""The summary of a task below its `out/`, which `compare` reads and every listing shows first."""
OUTPUTS_LIMIT = 50
"""How many output files a listing shows unless asked for another number (0 for all)."""
GLOB_MAX_CHARS = 1024
"""The longest `glob` of a listing (9 KiB of `[a-` take a second to become a pattern)."""
_NUMBERS = re.compile(r"([0-9]+)")


def results_first(paths: Sequence[str]) -> list[str]:
    """Paths below a task's `out/` in the order of a listing: `summary.json`, then the files of
    the least crowded directories (the merged results), then the crowded ones (the units), each
    directory's files by path, numbers by value."""
    crowding = Counter(dirname(path) for path in paths)
    return sorted(
        paths, key=lambda path: (path != SUMMARY, crowding[dirname(path)], _natural(path))
    )


def _natural(path: str) -> tuple[str | int, ...]:
    """A path as it sorts for people: its numbers by value, so `2.json` comes before `10.json`.
    The split alternates text and number (the odd parts), so two keys compare like with like."""
    return tuple(
        int(part) if index % 2 else part for index, part in enumerate(_NUMBERS.split(path))
    )


def matches(path: str, glob: str | None) -> bool:
    """Whether a path below `out/` matches a listing's `glob` (every path matches None)."""
    return glob is None or _pattern(glob).match(path) is not None


@lru_cache(maxsize=64)
def _pattern(glob: str) -> re.Pattern[str]:
    """The pattern of a glob, as `fnmatchcase` matches it; a cache of its own, small, since
    `fnmatch` keeps 32,768 patterns (a client asking new globs would fill the memory)."""
    return re.compile(translate(glob))


def select_outputs(
    paths: Sequence[str], glob: str | None = None, limit: int = OUTPUTS_LIMIT
) -> tuple[list[str], int]:
    """The paths below `out/` a listing shows, results first, and how many it leaves out: those
    matching `glob` (every one without it), at most `limit` of them (all for 0)."""
    if limit < 0:
        raise ValueError(f"a limit of {limit} files: it cannot be negative (0 for all)")
    matching = [path for path in paths if matches(path, glob)]
    ordered = results_first(matching)
    shown = ordered if limit == 0 else ordered[:limit]
    return shown, len(ordered) - len(shown)
