"""The workers of a task: from the pod events and the reports of its run log, and its claims."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

from simrun_core import events as ev
from simrun_core import ledger_layout as layout
from simrun_core.wire import WorkerView

GIB = 1024**3
LIVE_PHASES = ("pending", "running")


@dataclasses.dataclass
class _Worker:
    attempts: int = 0
    pod_attempt: int = -1
    pod_phase: str = "pending"
    pod_node: str | None = None
    node: str | None = None
    report: ev.WorkerReport | None = None
    units: set[int] = dataclasses.field(default_factory=set)


def worker_views(events: Iterable[ev.Event], task: str, claims: dict[str, int]) -> list[WorkerView]:
    """The workers of a task from the events of its run, in the order they first appeared.

    A worker is `running` while a pod of an attempt without a report lives (pending or
    running), else `failed` when its last report says so or was killed for memory, else `done`.
    `claims` are the units each worker holds claimed now, counted for live workers only.
    """
    workers: dict[str, _Worker] = {}
    for event in events:
        if getattr(event, "task", None) != task:
            continue
        if isinstance(event, ev.UNITS_EVENTS):
            units = workers.setdefault(event.worker, _Worker()).units
            units.update(index for index, _ in ev.done_units(event))
            continue
        if not isinstance(
            event,
            ev.PodStarted | ev.PodFailed | ev.PodSucceeded | ev.PodPreempted | ev.WorkerReport,
        ):
            continue
        worker = workers.setdefault(event.worker, _Worker())
        if isinstance(event, ev.WorkerReport):
            worker.attempts = max(worker.attempts, event.attempt + 1)
            if worker.report is None or event.attempt >= worker.report.attempt:
                worker.report = event
            continue
        attempt, phase, node = _pod(event)
        worker.attempts = max(worker.attempts, attempt + 1)
        if attempt >= worker.pod_attempt:
            worker.pod_attempt, worker.pod_phase = attempt, phase
            if node is not None:
                worker.node = node
            worker.pod_node = node
    return [_view(name, worker, claims) for name, worker in workers.items()]


def _pod(event: ev.PodStarted | ev.PodFailed | ev.PodSucceeded | ev.PodPreempted) -> tuple:
    """The attempt, phase and node of the pod an event leaves: a retried one is pending."""
    if isinstance(event, ev.PodStarted):
        return event.attempt, "running", event.node
    if isinstance(event, ev.PodSucceeded):
        return event.attempt, "succeeded", None
    if isinstance(event, ev.PodPreempted) or event.retry:
        return event.attempt + 1, "pending", None
    return event.attempt, "failed", None


def _view(name: str, worker: _Worker, claims: dict[str, int]) -> WorkerView:
    report = worker.report
    reported = report is not None and report.attempt >= worker.pod_attempt
    live = worker.pod_phase in LIVE_PHASES and not reported
    if live:
        state = "running"
        node = worker.pod_node
    else:
        failed = worker.pod_phase == "failed" or (
            report is not None and (report.failed or report.oom_kills > 0)
        )
        state = "failed" if failed else "done"
        node = report.node if report is not None and report.node else worker.node
    return WorkerView(
        worker=name,
        node=node,
        state=state,
        attempts=worker.attempts,
        processes=report.processes if report is not None else None,
        units_done=len(worker.units),
        units_claimed=claims.get(name, 0) if live else 0,
        peak_memory_gb=_gb(report.peak_memory_bytes) if report is not None else None,
        memory_limit_gb=_gb(report.memory_limit_bytes) if report is not None else None,
        oom_killed=report is not None and report.oom_kills > 0,
    )


def _gb(value: int | None) -> float | None:
    return None if value is None else round(value / GIB, 4)


def claims_by_worker(ledger: Path) -> dict[str, int]:
    """The units each worker holds claimed and not done in a ledger (see DESIGN.md and
    `simrun_core.ledger_layout`): per unit the claim of the highest epoch without a release.
    The entries are in shard directories (`claim/<shard>/<index>.<epoch>`), each a link whose
    target names the worker (read with `readlink`, never followed)."""
    claims = _entries(ledger / layout.CLAIM)
    if not claims:
        return {}
    released = _entries(ledger / layout.RELEASE)
    done = _entries(ledger / layout.DONE)
    live: dict[str, tuple[int, str]] = {}  # index -> the epoch and path of its live claim
    for name, path in claims.items():
        index, dot, epoch = name.partition(".")
        if not (dot and epoch.isdigit()) or name in released or index in done:
            continue
        if int(epoch) > live.get(index, (-1, ""))[0]:
            live[index] = (int(epoch), path)
    held: dict[str, int] = {}
    for _, path in live.values():
        try:
            worker = os.readlink(path) or "?"
        except FileNotFoundError:
            continue
        except OSError:  # no link: it names no worker
            worker = "?"
        held[worker] = held.get(worker, 0) + 1
    return held


def _entries(directory: Path) -> dict[str, str]:
    """The entries of a ledger's directory by name (`<index>` or `<index>.<epoch>`), each with
    its path: those in the shard directory of their index, none when there is no directory."""
    try:
        with os.scandir(directory) as found:
            shards = [e for e in found if e.name.isdigit() and e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return {}
    entries = {}
    for shard in shards:
        try:
            names = os.listdir(shard.path)
        except FileNotFoundError:
            continue
        for name in names:
            if layout.in_its_shard(name, shard.name):
                entries[name] = os.path.join(shard.path, name)
    return entries
