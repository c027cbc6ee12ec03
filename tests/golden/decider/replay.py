"""Replay a recorded case through `decide`: the messages of its actors, from its `submitted` on,
must produce exactly the events of its log (their times aside)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from simrun_core import events as ev
from simrun_core.decider import decide
from simrun_core.fold import RunFold
from simrun_core.messages import decode_message
from simrun_core.store import read_log


def replayed(case: Path) -> tuple[list[ev.Event], list[ev.Event]]:
    """The events of a case's log after `submitted`, and those its messages decide now."""
    logged = read_log(case / "events.jsonl")
    state = RunFold()
    state.apply(logged[0])
    produced: list[ev.Event] = []
    for line in (case / "messages.jsonl").read_bytes().splitlines():
        decision = decide(state, decode_message(line))
        assert state.record is not None
        for event in decision.events:
            numbered = msgspec.structs.replace(event, seq=state.record.seq + 1)
            state.apply(numbered)
            produced.append(numbered)
    return logged[1:], produced


def timeless(event: ev.Event) -> dict[str, Any]:
    """An event as plain values, without the time it was decided at."""
    value: dict[str, Any] = msgspec.to_builtins(event)
    value.pop("time", None)
    return value


def replay_problems(case: Path) -> list[str]:
    """Where the replay of a case differs from its log; empty when it decides alike."""
    logged, produced = replayed(case)
    problems = []
    for seq, (old, new) in enumerate(zip(logged, produced, strict=False), start=2):
        if timeless(old) != timeless(new):
            problems.append(f"event {seq}: logged {timeless(old)}, decided {timeless(new)}")
    if len(logged) != len(produced):
        problems.append(f"{len(logged)} events logged after submitted, {len(produced)} decided")
    return problems
