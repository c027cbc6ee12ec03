"""The events of a run: one tagged union, encoded as one JSON object per line.

The run's actor appends them to `runs/<id>/events.jsonl`; the harness appends its own kinds
(`unit-started`, `units-done`, `worker-report`, `merged`) to a log per worker. Evolution adds
optional fields only; a reader skips a type it does not know.

An event is made without its place in a log: the writer of the log stamps its `seq` and its
`time` when it appends it (`stamped`, with `simrun_core.clock`), so what decides an event
(`simrun_core.decider`) reads no clock and decides alike on equal inputs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Final, TypeVar

import msgspec

from simrun_core.planner import TaskPlan
from simrun_core.provenance import SourceProvenance
from simrun_core.resources import ResolvedResources
from simrun_core.snapshot_types import ProbedType
from simrun_core.states import TaskState
from simrun_core.workflow import Priority, Workflow

UNSTAMPED: Final = datetime(1970, 1, 1, tzinfo=UTC)
"""The `time` of an event not appended yet: its writer stamps the time it appends it at."""


class Event(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True, gc=False):
    """A fact about a run. `seq` counts from 1 without gaps within one log; `seq` and `time`
    are stamped by the log's writer (`stamped`), 0 and `UNSTAMPED` until then.

    Not tracked by the garbage collector (`gc=False`: cheaper to decode a million of): an
    event is a tree of values that never refers back to itself.
    """

    seq: int = 0
    time: datetime = UNSTAMPED


AnyEvent = TypeVar("AnyEvent", bound=Event)


def stamped(events: Iterable[AnyEvent], last_seq: int, time: datetime) -> list[AnyEvent]:
    """The events as their writer appends them: numbered after `last_seq`, and the `time` of
    their append on those not stamped yet (an event copied from another log, a harness's, keeps
    the time it has there)."""
    return [
        msgspec.structs.replace(
            event, seq=last_seq + n, time=time if event.time == UNSTAMPED else event.time
        )
        for n, event in enumerate(events, 1)
    ]


class Writer(enum.StrEnum):
    """Who writes a run's log, the one writer it has (named by its `submitted` event).

    `service`: the run's actor in the service that accepted it, which follows the run to its
    end. `export`: `simrun export`, which writes the log once (its `submitted` event) for a
    runner of another engine (cwltool, Toil) that runs the steps; a service only reads such a
    log, listing the run, and never appends to it.
    """

    SERVICE = "service"
    EXPORT = "export"


class Submitted(Event, tag="submitted"):
    """The run was accepted: its workflow, submitter, priority, sources and plans; `writer`
    who writes the rest of its log (the service, for logs written before the field)."""

    run: str
    workflow: Workflow
    submitted_by: str
    owner: str
    agent: str | None = None
    priority: Priority = Priority.STANDARD
    group: str | None = None
    sources: list[SourceProvenance] = msgspec.field(default_factory=list)
    plans: dict[str, TaskPlan] = msgspec.field(default_factory=dict)
    resources: dict[str, ResolvedResources] = msgspec.field(default_factory=dict)
    reserve: str | None = None
    backend: str = "local"
    local_commands: str | None = None
    snapshot_types: dict[str, ProbedType] = msgspec.field(default_factory=dict)
    """The task types only the run's snapshots have, as the run's environment answered about
    them at the submission (a local run with `--snapshot`, `simrun_core.snapshot_types`)."""
    writer: Writer = Writer.SERVICE


class EnvironmentResolved(Event, tag="environment-resolved"):
    """The environment of the run is known: its image, None for the service's own environment;
    `lock_sha256` the hash of its lock (`environment.lock` of the run), None without one."""

    image: str | None = None
    lock_sha256: str | None = None


class Built(Event, tag="built"):
    """The image of the run is ready: built in `seconds`, or found in the registry (`cached`);
    neither for the service's own environment."""

    image: str | None = None
    seconds: float | None = None
    cached: bool = False


class WorkflowSubmitted(Event, tag="workflow-submitted"):
    """The backend took the run under its deterministic workflow name."""

    name: str


class PodEvent(Event):
    """What the events of one pod of a task have: its task, its worker (`w0`, ...) and the
    attempt of that worker (0 first, counted up by each retry). A base, never in a log."""

    task: str
    worker: str
    attempt: int = 0


class PodAdmitted(PodEvent, tag="pod-admitted"):
    """A pod of a task was admitted to its cores and memory."""


class PodStarted(PodEvent, tag="pod-started"):
    """A pod (a local process) of a task started; `gpus` the GPUs the backend gave it (as
    `CUDA_VISIBLE_DEVICES` names them), None when it does not say."""

    node: str | None = None
    pid: int | None = None
    gpus: list[str] | None = None


class PodPreempted(PodEvent, tag="pod-preempted"):
    """A pod was stopped to make room for a higher priority; it is retried."""


class PodFailed(PodEvent, tag="pod-failed"):
    """A pod ended with an error: its exit code and whether the out of memory killer did it."""

    exit_code: int | None = None
    oom: bool = False
    retry: bool = False
    message: str | None = None


class PodSucceeded(PodEvent, tag="pod-succeeded"):
    """A pod ended with exit code 0."""


class OomKilled(PodEvent, tag="oom-killed"):
    """A pod was killed for its memory; the retry gets `retry_memory_gb`."""

    memory_gb: float | None = None
    retry_memory_gb: float | None = None


class UnitStarted(Event, tag="unit-started"):
    """A worker claimed a unit: it computes it or has it waiting for a process of its pool."""

    task: str
    index: int
    worker: str


class UnitDone(Event, tag="unit-done"):
    """A unit is computed; its outputs are written."""

    task: str
    index: int
    worker: str
    seconds: float = 0.0


class UnitsDone(Event, tag="units-done", gc=False):
    """Units are computed, their outputs written: `indices` in the order they completed, each
    with its `seconds` (the same length). The harness writes what completed while it was busy
    (writing, collecting, claiming) as one event, so a run of many units is not a line a unit.

    Tuples and `gc=False` (it can hold no cycle): a log of many batches decodes into objects
    the garbage collector never traverses (lists would make it walk them all, again and
    again, while a big log is read)."""

    task: str
    worker: str
    indices: tuple[int, ...]
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.indices) != len(self.seconds):
            raise ValueError(
                f"units-done has {len(self.indices)} indices but {len(self.seconds)} seconds"
            )


UNITS_EVENTS = (UnitDone, UnitsDone)
"""The events that record units done: one unit (logs written before), or a batch."""


def done_units(event: UnitDone | UnitsDone) -> Iterable[tuple[int, float]]:
    """The units an event records done, as (index, seconds), in the order they completed."""
    if isinstance(event, UnitDone):
        return ((event.index, event.seconds),)
    return zip(event.indices, event.seconds, strict=True)


def units_done_event(task: str, worker: str, units: Sequence[tuple[int, float]]) -> UnitsDone:
    """The event that records `units` (index, seconds) done by a worker, in that order."""
    return UnitsDone(
        task=task,
        worker=worker,
        indices=tuple(index for index, _ in units),
        seconds=tuple(seconds for _, seconds in units),
    )


class WorkerReport(PodEvent, tag="worker-report"):
    """What a worker (or `simrun-exec`) did: processes, units, memory, seconds.

    `started` is when the harness process started (seconds since the epoch), `prepare_seconds`
    the seconds from then to the start of its work (imports, ledger, pool, staging; all its
    seconds when the work never began),
    `throttled_seconds` the seconds its cgroup waited for its CPU quota (`cpu.stat`
    `throttled_usec` over its life; None without a cgroup of its own), `gpus` the GPUs it had.
    `oom_kills` counts the
    kills for memory: by the kernel in its cgroup (`memory.events` `oom_kill`), or by the
    harness itself for a process above its memory (`SIMRUN_MEMORY_SOURCE=process`).
    """

    node: str | None = None
    processes: int = 1
    units_done: int = 0
    seconds: float = 0.0
    unit_seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    per_worker_gb: float = 0.0
    oom_kills: int = 0
    failed: bool = False
    exit_code: int | None = None
    message: str | None = None
    started: float | None = None
    prepare_seconds: float = 0.0
    throttled_seconds: float | None = None
    gpus: list[str] | None = None
    """The GPUs it had, as its `CUDA_VISIBLE_DEVICES` (or the device plugin's
    `NVIDIA_VISIBLE_DEVICES`) named them; None when its environment did not say."""


class TaskStateChanged(Event, tag="task-state"):
    """A task entered a state; `message` says why for a failure."""

    task: str
    state: TaskState
    message: str | None = None


class Merged(Event, tag="merged"):
    """The coordinator of a split task merged its units."""

    task: str
    worker: str | None = None


class LogsKept(Event, tag="logs-kept"):
    """The logs of the pods of a task are in the store."""

    task: str


class NodeReserved(Event, tag="node-reserved"):
    """A node was reserved for the run."""

    node: str


class NodeReleased(Event, tag="node-released"):
    """The reservation of a node was released."""

    node: str


class CancelRequested(Event, tag="cancel-requested"):
    """Somebody asked to cancel the run."""

    by: str


class Succeeded(Event, tag="succeeded"):
    """The run ended: every task is done."""

    message: str | None = None


class Failed(Event, tag="failed"):
    """The run ended: a task failed, or the run could not be carried out; the message says why."""

    message: str


class Cancelled(Event, tag="cancelled"):
    """The run ended: it was cancelled."""

    message: str | None = None


RunEvent = (
    Submitted
    | EnvironmentResolved
    | Built
    | WorkflowSubmitted
    | PodAdmitted
    | PodStarted
    | PodPreempted
    | PodFailed
    | PodSucceeded
    | OomKilled
    | UnitStarted
    | UnitDone
    | UnitsDone
    | WorkerReport
    | TaskStateChanged
    | Merged
    | LogsKept
    | NodeReserved
    | NodeReleased
    | CancelRequested
    | Succeeded
    | Failed
    | Cancelled
)

TERMINAL_EVENTS = (Succeeded, Failed, Cancelled)
KNOWN_TYPES: frozenset[str] = frozenset(cls.__struct_config__.tag for cls in RunEvent.__args__)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RunEvent)


class EventDecodeError(ValueError):
    """A line of a log that is not an event; the message says why."""


def encode_event(event: Event) -> bytes:
    """One line of a log: the event as JSON and a newline."""
    return _encoder.encode(event) + b"\n"


class UnknownEvent(Event, tag="unknown"):
    """An event of a type this version does not know: it keeps its place (`seq`) in the log."""

    kind: str = ""


def decode_event(line: bytes | str) -> Event:
    """The event of a line, an `UnknownEvent` for a type this version does not know.

    EventDecodeError for a line that is no event.
    """
    try:
        return _decoder.decode(line)
    except (msgspec.DecodeError, RecursionError) as error:
        unknown = _unknown(line)
        if unknown is not None:
            return unknown
        raise EventDecodeError(str(error) or type(error).__name__) from None


def _unknown(line: bytes | str) -> UnknownEvent | None:
    try:
        value: object = msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    kind, seq = value.get("type"), value.get("seq")
    if not isinstance(kind, str) or kind in KNOWN_TYPES or type(seq) is not int or seq < 1:
        return None
    try:
        when = msgspec.convert(value.get("time"), datetime)
    except msgspec.ValidationError:
        when = datetime.fromtimestamp(0, UTC)
    return UnknownEvent(seq=seq, time=when, kind=kind)
