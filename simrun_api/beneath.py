"""Opening a file of a run's directory without following a link anywhere on the way: a run's
files are written by its processes, so any of them may be a link that leads out of the store."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def open_beneath(directory: Path, parts: Sequence[str], *, is_dir: bool) -> int:
    """A descriptor of `directory/parts...` opened one part at a time without following a link
    at any part, so no link (nor a directory swapped for one meanwhile) leads out of
    `directory`. OSError else: ELOOP for a link, ENOENT, ENOTDIR. A file is opened
    non-blocking, so a FIFO does not hang the caller."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for number, part in enumerate(parts):
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            last = number == len(parts) - 1
            flags |= os.O_DIRECTORY if is_dir or not last else os.O_NONBLOCK
            opened = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = opened
    except BaseException:
        os.close(fd)
        raise
    return fd
