"""Fault injection at the seams of the store: configured OSErrors instead of real writes.

The store's file operations (the append and the fsync of an event log, `write_atomic`) and the
index's database calls ask `check(op)` before they touch the disk; with a plan installed, a
call the plan picks raises an `OSError` of its errno instead, as a full disk (`ENOSPC`), a
failing device (`EIO`) or a store that became read-only (`EACCES`, `EROFS`) would. Tests
install a plan (`install`, `injected`); a service reads `SIMRUN_FAULTS` when it starts (see
`simrun_api.supervisor`; the processes of its runs get `SIMRUN_RUN_FAULTS` as theirs), and any
other process (a harness) when it first checks.

`SIMRUN_FAULTS` holds rules separated by commas, each `OP:ERRNO[:RATE][:KEY=VALUE...]`:

- `OP`: `append` (a write of a log append; it writes half its bytes before it fails, as a disk
  filling up in the middle of a write does), `fsync` (its fsync), `atomic` (`write_atomic`),
  `index` (a write of the index: rebuild, put, remove), `index-read` (a read of the index).
- `ERRNO`: the name of an errno, e.g. `ENOSPC`, `EIO`, `EACCES`, `EROFS`.
- `RATE`: the chance in [0, 1] that a call fails, drawn from a generator seeded with `seed`
  (default 0), one draw per call of the op; 1 without `nth`.
- `seed=S`: the seed of the rule's generator. `nth=N`: the Nth call of the op (from 1) is the
  first that may fail (with `RATE` 1: exactly the calls N .. N + times - 1). `times=K`: at most
  K failures in all (with `nth` and no `times`: 1). `while=PATH`: only while PATH exists (a test
  makes the disk full by creating it and frees it by removing it).

Examples: `append:ENOSPC:0.3:seed=7` (30 % of the appends), `fsync:EIO:nth=3` (the third
fsync), `append:ENOSPC:while=/tmp/full,index:EIO:0.2:seed=1`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno as errno_names
import os
import random
import threading
from collections.abc import Iterator

ENV = "SIMRUN_FAULTS"
RUNS_ENV = "SIMRUN_RUN_FAULTS"
"""The plan of the processes of runs (harnesses): a service takes `SIMRUN_FAULTS` for itself and
hands this one on to them as their `SIMRUN_FAULTS`, so a test makes a run's disk full alone."""
OPS = ("append", "fsync", "atomic", "index", "index-read")


class FaultSpecError(ValueError):
    """A fault plan that cannot be read; the message names the rule and what is wrong."""


@dataclasses.dataclass
class FaultRule:
    """One rule: which op fails, with which errno, when."""

    text: str
    op: str
    errno: int
    rate: float = 1.0
    seed: int = 0
    nth: int = 1
    times: int | None = None
    while_path: str | None = None
    calls: int = 0
    raised: int = 0

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)

    def fires(self) -> bool:
        """Count a call of the op and say whether it fails (the caller holds the lock)."""
        self.calls += 1
        if self.calls < self.nth:
            return False
        if self.times is not None and self.raised >= self.times:
            return False
        if self.while_path is not None and not os.path.exists(self.while_path):
            return False
        if self.rate < 1.0 and self._random.random() >= self.rate:
            return False
        self.raised += 1
        return True


@dataclasses.dataclass
class FaultPlan:
    """The rules of a process; `check` raises the error of the first rule that fires."""

    rules: list[FaultRule]
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @classmethod
    def parse(cls, text: str) -> FaultPlan:
        """The plan of a `SIMRUN_FAULTS` value; FaultSpecError names a rule that is wrong."""
        rules = [_rule(part.strip()) for part in text.replace(";", ",").split(",")]
        return cls([rule for rule in rules if rule is not None])

    def check(self, op: str, target: object = None) -> None:
        """Raise the OSError of the first rule of `op` that fires for this call."""
        with self._lock:
            fired = next((rule for rule in self.rules if rule.op == op and rule.fires()), None)
        if fired is not None:
            reason = f"{os.strerror(fired.errno)} (injected: {ENV} {fired.text})"
            if target is None:
                raise OSError(fired.errno, reason)
            raise OSError(fired.errno, reason, str(target))

    def raised(self, op: str | None = None) -> int:
        """How many errors the rules (of `op`) raised so far."""
        with self._lock:
            return sum(rule.raised for rule in self.rules if op is None or rule.op == op)


def _rule(text: str) -> FaultRule | None:
    if not text:
        return None
    fields = text.split(":")
    if len(fields) < 2:
        raise FaultSpecError(f"{ENV}: rule {text!r}: expected OP:ERRNO[:RATE][:KEY=VALUE...]")
    op, name, *rest = fields
    if op not in OPS:
        raise FaultSpecError(f"{ENV}: rule {text!r}: unknown op {op!r} (one of {', '.join(OPS)})")
    number = getattr(errno_names, name.upper(), None)
    if not name.upper().startswith("E") or not isinstance(number, int):
        raise FaultSpecError(f"{ENV}: rule {text!r}: {name!r} is not the name of an errno")
    rule = FaultRule(text=text, op=op, errno=number)
    rate: float | None = None
    try:
        for field in rest:
            key, sep, value = field.partition("=")
            if not sep:
                rate = float(field)
                if not 0.0 <= rate <= 1.0:
                    raise ValueError(f"the rate {field} is not in [0, 1]")
            elif key == "seed":
                rule.seed = int(value)
            elif key == "nth":
                rule.nth = int(value)
                if rule.nth < 1:
                    raise ValueError("nth counts from 1")
            elif key == "times":
                rule.times = int(value)
                if rule.times < 0:
                    raise ValueError("times is negative")
            elif key == "while":
                if not value:
                    raise ValueError("while needs a path")
                rule.while_path = value
            else:
                raise ValueError(f"unknown key {key!r} (seed, nth, times, while)")
    except ValueError as error:
        raise FaultSpecError(f"{ENV}: rule {text!r}: {error}") from None
    if rate is not None:
        rule.rate = rate
    if rule.times is None and any(field.startswith("nth=") for field in rest) and rate is None:
        rule.times = 1
    rule.__post_init__()
    return rule


_plan: FaultPlan | None = None
_installed = False
_install_lock = threading.Lock()


def install(plan: FaultPlan | str | None) -> FaultPlan | None:
    """Install the plan of this process (a `SIMRUN_FAULTS` text, a plan, None for none)."""
    global _plan, _installed
    parsed = FaultPlan.parse(plan) if isinstance(plan, str) else plan
    with _install_lock:
        _plan, _installed = parsed, True
    return parsed


def install_from_env(environ: dict[str, str] | os._Environ[str] | None = None) -> FaultPlan | None:
    """Install the plan of `SIMRUN_FAULTS` (none when unset or empty); FaultSpecError if bad."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    return install(value if value.strip() else None)


def current() -> FaultPlan | None:
    """The plan of this process; read from `SIMRUN_FAULTS` the first time when none is
    installed."""
    if not _installed:
        install_from_env()
    return _plan


def check(op: str, target: object = None) -> None:
    """Raise the configured OSError if the plan has one for this call of `op`; the fast path
    (no plan) is one global read."""
    plan = _plan if _installed else current()
    if plan is not None:
        plan.check(op, target)


def write(fd: int, data: bytes, target: object = None) -> int:
    """`os.write` through the op `append`. A failing call writes a part of the data first and
    then raises, as a disk that fills up in the middle of a write does."""
    plan = _plan if _installed else current()
    if plan is not None:
        try:
            plan.check("append", target)
        except OSError:
            if len(data) > 1:
                os.write(fd, data[: len(data) // 2])
            raise
    return os.write(fd, data)


def fsync(fd: int, target: object = None) -> None:
    """`os.fsync` through the op `fsync`."""
    check("fsync", target)
    os.fsync(fd)


@contextlib.contextmanager
def injected(plan: FaultPlan | str) -> Iterator[FaultPlan]:
    """Install a plan for the body of a `with` (a test); no plan after it."""
    installed = install(plan)
    assert installed is not None
    try:
        yield installed
    finally:
        install(None)
