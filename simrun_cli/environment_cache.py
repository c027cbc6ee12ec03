"""The environment of this process, kept in `.simrun/environment.json` while the installation
stays as it was, so a local command does not scan every installed distribution to compare it
with the one of the service.

`simrun_core.environment.environment()` reads the metadata of every distribution on `sys.path`
(~10 ms with a few hundred of them, plus the imports it needs). The file keeps its answer with a
stamp of what that scan reads: the interpreter, the version of simrun and, for each directory of
`sys.path`, the names of its metadata directories (`*.dist-info`, `*.egg-info`) with the mtimes
of their metadata file and `entry_points.txt` (-1 for one that is missing; of an `*.egg-info`
file, or a file on `sys.path` such as a zip, its own mtime). The directories' own mtimes are
left out: other files come and go in some of them (the directory of the script, the current
one). Installing, removing or upgrading a distribution, or editing those files in place,
changes the stamp, and the environment is computed again. Taking the stamp costs a listing of
each directory and two `stat` calls per distribution (~2 ms). A file changed within the last
`SETTLE_S` seconds may change again without a new mtime (the clock of file times ticks
coarsely), so the environment of such an installation is computed but not kept, as git does
with a racy index.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import msgspec

import simrun_core

CACHE_FILE = "environment.json"
METADATA_SUFFIXES = (".dist-info", ".egg-info")
ENTRY_POINTS = "entry_points.txt"
"""With `METADATA` (`PKG-INFO` of an `*.egg-info`), the name and version of the distribution,
the files of a metadata directory the environment is made of."""
SETTLE_S = 2.0


class Stamp(NamedTuple):
    """The hash of the installation and the newest mtime (ns) it was made of."""

    digest: str
    newest_ns: int


class CachedEnvironment(msgspec.Struct, frozen=True):
    """The environment of the process and the stamp of the installation it was computed from."""

    stamp: str
    environment: dict[str, str]


def _mtime(path: str) -> int:
    """The mtime of a path in ns, -1 when it does not exist."""
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def installation_stamp(paths: Iterable[str]) -> Stamp:
    """The stamp of what the scan of the distributions on `paths` (`sys.path`) reads: see above."""
    parts = [sys.executable, simrun_core.__version__]
    newest = -1
    for entry in paths:
        where = entry or os.curdir
        try:
            listing = os.scandir(where)
        except OSError:  # a file (a zip) or a missing directory: its mtime is all
            mtime = _mtime(where)
            newest = max(newest, mtime)
            parts.append(f"{where} {mtime}")
            continue
        parts.append(where)
        with listing:
            found = sorted(
                (item.path, item.is_dir())
                for item in listing
                if item.name.endswith(METADATA_SUFFIXES)
            )
        for path, is_directory in found:
            if is_directory:
                metadata = "METADATA" if path.endswith(".dist-info") else "PKG-INFO"
                files = [os.path.join(path, name) for name in (metadata, ENTRY_POINTS)]
            else:  # an `*.egg-info` file: the metadata itself
                files = [path]
            mtimes = [_mtime(file) for file in files]
            newest = max(newest, *mtimes)
            parts.append(f"{path} {' '.join(map(str, mtimes))}")
    return Stamp(hashlib.sha256("\n".join(parts).encode()).hexdigest(), newest)


def settled(stamp: Stamp, now_ns: int) -> bool:
    """Whether no file of the stamp changed within `SETTLE_S` before `now_ns` (wall clock)."""
    return now_ns - stamp.newest_ns > SETTLE_S * 1e9


def cached_environment(data: bytes, stamp: str) -> dict[str, str] | None:
    """The environment a cache file holds if it was computed for `stamp`; None otherwise (also
    for a file that is not a cache)."""
    try:
        cached = msgspec.json.decode(data, type=CachedEnvironment)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return cached.environment if cached.stamp == stamp else None


def _compute() -> dict[str, str]:
    from simrun_core.environment import environment

    return environment()


def known_environment(
    directory: Path, compute: Callable[[], dict[str, str]] = _compute
) -> dict[str, str]:
    """The environment of this process: the one of `directory/environment.json` while the
    installation has its stamp, else `compute()`d and written there once the installation has
    settled (atomically: concurrent commands read a whole file or none)."""
    stamp = installation_stamp(sys.path)
    path = Path(directory) / CACHE_FILE
    try:
        found = cached_environment(path.read_bytes(), stamp.digest)
    except OSError:
        found = None
    if found is not None:
        return found
    environment = compute()
    if not settled(stamp, time.time_ns()):
        return environment
    temporary = path.with_name(f".{CACHE_FILE}.{os.getpid()}")
    try:
        temporary.write_bytes(msgspec.json.encode(CachedEnvironment(stamp.digest, environment)))
        os.replace(temporary, path)
    except OSError:  # a cache that cannot be written is computed again next time
        temporary.unlink(missing_ok=True)
    return environment
