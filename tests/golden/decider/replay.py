"""Replay a recorded case through `decide`: the messages of its actors, from its `submitted` on,
must produce exactly the events of its log, compared whole.

A decision's events carry no time (the decider reads no clock); the actor stamps each with its
`seq` and the time it appended it at. The replay stamps them alike: `seq` from the fold, and the
time of the append from the recording (the log), as temporalio replays the recorded time of an
activation. An event the decider copied from a harness log keeps the harness's time, which the
message recorded: that time is compared like every other field.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import msgspec

from simrun_core import events as ev
from simrun_core.decider import decide
from simrun_core.fold import RunFold
from simrun_core.messages import decode_message
from simrun_core.store import read_log


def replayed(case: Path) -> tuple[list[ev.Event], list[ev.Event]]:
    """The events of a case's log after `submitted`, and those its messages decide now, stamped
    as the actor stamped them."""
    logged = read_log(case / "events.jsonl")
    state = RunFold()
    state.apply(logged[0])
    produced: list[ev.Event] = []
    for line in (case / "messages.jsonl").read_bytes().splitlines():
        decision = decide(state, decode_message(line))
        assert state.record is not None
        for event in decision.events:
            seq = state.record.seq + 1
            numbered = ev.stamped([event], seq - 1, appended_at(logged, seq))[0]
            state.apply(numbered)
            produced.append(numbered)
    return logged[1:], produced


def appended_at(logged: list[ev.Event], seq: int) -> datetime:
    """The time the recorded actor appended the event `seq` at (none past the log's end)."""
    return logged[seq - 1].time if seq <= len(logged) else ev.UNSTAMPED


def replay_problems(case: Path) -> list[str]:
    """Where the replay of a case differs from its log; empty when it decides alike."""
    logged, produced = replayed(case)
    problems = []
    for seq, (old, new) in enumerate(zip(logged, produced, strict=False), start=2):
        if old != new:
            problems.append(
                f"event {seq}: logged {msgspec.to_builtins(old)}, "
                f"decided {msgspec.to_builtins(new)}"
            )
    if len(logged) != len(produced):
        problems.append(f"{len(logged)} events logged after submitted, {len(produced)} decided")
    return problems
