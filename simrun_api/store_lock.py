"""One service writes a store: the lock it holds on `<store>/service.lock` for its lifetime,
and on `<db>.lock` beside its index (two services of two stores on one index would each
rebuild it from their own store and list the other's runs as none).

The lock is an exclusive `flock` of that file. The kernel releases it when the process ends,
however it ends, so a killed service never blocks the next one; an NFS v4 client takes it as a
lock of the server, so it holds between hosts. Its descriptor is not inherited by the processes
of runs, which may outlive the service. The holder writes its pid and host into the file, so a
second service can name it in the one line it exits with.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

import msgspec

LOCK_FILE = "service.lock"
INDEX_LOCK_SUFFIX = ".lock"
"""The lock of an index is the file of its name with this suffix, beside it."""
HOLDER_WAIT_S = 1.0
"""How long a refused service waits for a holder that took the lock to write its name."""


class Holder(msgspec.Struct, frozen=True):
    """The service that holds a store's lock, as it wrote itself into the lock file."""

    pid: int
    host: str
    since: datetime


class StoreLocked(RuntimeError):
    """Another service holds the lock of the store (or of the index, `what`); the message
    names it."""

    def __init__(self, store: Path, holder: Holder | None, what: str = "store") -> None:
        self.store = store
        self.holder = holder
        if holder is None:
            who = "another service (it did not write its pid)"
        else:
            since = holder.since.strftime("%Y-%m-%d %H:%M:%S UTC")
            who = f"the service of pid {holder.pid} on host {holder.host} (since {since})"
        super().__init__(f"the {what} {store} is in use by {who}: one service writes a {what}")


class StoreLock:
    """The lock of a store, held until `release()` (or the end of a `with`, or of the process)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Release the lock (closing its descriptor releases it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> StoreLock:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()


def lock_store(store: Path) -> StoreLock:
    """Take the lock of a store (created when missing) without waiting.

    Raises:
        StoreLocked: Another process holds it; the message names its pid and host.
        OSError: The lock file cannot be made or locked.
    """
    store.mkdir(parents=True, exist_ok=True)
    return _lock(store / LOCK_FILE, store, "store")


def lock_index(db: Path) -> StoreLock:
    """Take the lock of an index, `<db>.lock` (created when missing), without waiting; as
    `lock_store` (StoreLocked names the index and its holder)."""
    db.parent.mkdir(parents=True, exist_ok=True)
    return _lock(db.with_name(db.name + INDEX_LOCK_SUFFIX), db, "index")


def _lock(path: Path, named: Path, what: str) -> StoreLock:
    """Lock the file `path` of the `what` at `named` and write this service into it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inheritable (PEP 446)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise StoreLocked(named, holder, what) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        me = Holder(pid=os.getpid(), host=socket.gethostname(), since=datetime.now(UTC))
        os.ftruncate(fd, 0)
        os.pwrite(fd, msgspec.json.encode(me) + b"\n", 0)
    except BaseException:
        os.close(fd)
        raise
    return StoreLock(path, fd)


def _holder(fd: int) -> Holder | None:
    """The holder the lock file names; None when it names none within `HOLDER_WAIT_S` (a
    holder that took the lock a moment ago writes its name right after)."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        with contextlib.suppress(OSError, msgspec.DecodeError, msgspec.ValidationError):
            return msgspec.json.decode(os.pread(fd, 4096, 0), type=Holder)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
