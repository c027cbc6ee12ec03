"""The bytes of the run store: every hard linked file counted once."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from simrun_core.wire import Usage

# An inode: (device, inode number) -> (bytes, hard links)
Inodes = dict[tuple[int, int], tuple[int, int]]


def inodes(paths: Iterable[Path]) -> tuple[Inodes, dict[tuple[int, int], int]]:
    """The files below `paths` by inode, and how many of their names are below `paths`."""
    found: Inodes = {}
    names: dict[tuple[int, int], int] = {}
    for path in paths:
        for root, _, files in os.walk(path):
            for name in files:
                try:
                    stat = os.lstat(os.path.join(root, name))
                except FileNotFoundError:
                    continue
                key = (stat.st_dev, stat.st_ino)
                found[key] = (stat.st_size, stat.st_nlink)
                names[key] = names.get(key, 0) + 1
    return found, names


def disk_usage(paths: Iterable[Path]) -> int:
    """The bytes of the files below `paths`, every hard linked file once."""
    found, _ = inodes(paths)
    return sum(size for size, _ in found.values())


def freed_bytes(paths: Iterable[Path]) -> int:
    """The bytes removing `paths` frees: of the files none of whose hard links stays."""
    found, names = inodes(paths)
    return sum(size for key, (size, links) in found.items() if names[key] >= links)


def store_usage(runs: Iterable[tuple[str, str | None, Path]]) -> Usage:
    """The bytes of runs `(id, group, directory)` and of their groups (`""` without one); a
    file hard linked in several runs of a group counts once in the group."""
    per_run: dict[str, int] = {}
    groups: dict[str, Inodes] = {}
    for run_id, group, path in runs:
        found, _ = inodes([path])
        per_run[run_id] = sum(size for size, _ in found.values())
        groups.setdefault(group or "", {}).update(found)
    return Usage(
        runs=per_run,
        groups={group: sum(size for size, _ in found.values()) for group, found in groups.items()},
    )
