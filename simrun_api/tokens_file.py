"""The tokens of a running service: its tokens file, read again when the file changes.

A token added to the file works, and one removed stops working, within `CHECK_S` of the
change, without a restart. Whether the file changed is one `stat` (its inode, size, and
modification and change times), done every `CHECK_S` by `watch` (a task of the service's
lifespan), never on the path of a request. A change the service cannot use (broken YAML, a
confusion of identities, a mode others may read) keeps the tokens it had and is logged at
once, naming lines but no content.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from simrun_api.auth import TokensError, load_tokens
from simrun_core.wire import Identity

CHECK_S = 1.0
"""How often the tokens file is looked at, at most."""

log = logging.getLogger(__name__)

Signature = tuple[int, int, int, int, int]


def _signature(path: Path) -> Signature | None:
    """What changes when the file does (also when a mount swaps it for another, or a chmod);
    None for no file."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


class TokensFile:
    """The identities by token of the tokens file, as of the last version that could be used.

    The first read raises TokensError (a service does not start on a file it cannot use).
    """

    def __init__(self, path: Path, check_s: float = CHECK_S) -> None:
        self.path = path
        self.check_s = check_s
        self._signature = _signature(path)
        self._tokens = load_tokens(path)

    def current(self) -> dict[str, Identity]:
        """The tokens as `watch` last read them."""
        return self._tokens

    async def watch(self) -> None:
        """Look at the file every `check_s` until cancelled: a change is read, or its problem
        logged."""
        while True:
            await asyncio.sleep(self.check_s)
            # In a thread: a stat or read of a slow (network) file system holds no request.
            await asyncio.to_thread(self._reload_if_changed)

    def _reload_if_changed(self) -> None:
        # Looked at before it is read: a change while it is read is seen at the next check.
        signature = _signature(self.path)
        if signature == self._signature:
            return
        self._signature = signature
        try:
            tokens = load_tokens(self.path)
        except TokensError as error:
            log.error("%s; the service keeps the %d tokens it had", error, len(self._tokens))
            return
        self._tokens = tokens
        log.warning("tokens file %s read again: %d tokens", self.path, len(tokens))
