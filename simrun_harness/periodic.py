"""A daemon thread that calls a function every few seconds: heartbeats, memory samples."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import TracebackType


class Periodic:
    """Call `action` now and then every `interval_s` seconds until stopped.

    An error of the action is printed to stderr (once per kind) and does not stop the thread:
    a heartbeat lost to a glitch of the file server must not end the worker. Use as a context
    manager: entering starts the thread, leaving stops and joins it.
    """

    def __init__(self, interval_s: float, action: Callable[[], object], name: str) -> None:
        self.interval_s = interval_s
        self.action = action
        self.name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._reported: set[str] = set()

    def _loop(self) -> None:
        while True:
            try:
                self.action()
            except Exception as error:
                kind = type(error).__name__
                if kind not in self._reported:
                    self._reported.add(kind)
                    print(f"simrun harness: {self.name} failed: {kind}: {error}", file=sys.stderr)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Periodic:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
