"""What a run's actor tells the decider (messages) and what the decider asks of it (commands).

Messages are facts the actor observed: the run resumed, its environment was resolved and its
image built (or not), its node was reserved (or refused) or released, the backend took it, a
pod changed, the run's workflow was deleted under it, the harness wrote events, somebody asked
to cancel, the pods of a stopped run are gone, the store can be written again. They are msgspec
structs of one tagged union (tag field `kind`), so a run's messages can be recorded and replayed
through `decide` (tests/golden/decider/). The I/O behind a message (reading a harness log,
looking for a merge marker) is done by the actor before it sends it: the decider reads nothing.

Commands are what the actor carries out after it appended the decision's events: resolve the
environment and build its image, reserve or release the run's node, submit the run to the
backend, start a task whose inputs are done, retry an attempt, stop the pods, settle (read every
harness log, then tell the decider that nothing runs), wait for a merge marker, keep a task's
logs, learn resources from a task, answer a cancel.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from simrun_core import events as ev

Phase = Literal["pending", "admitted", "running", "preempted", "succeeded", "failed"]
"""The phases of a pod attempt: created (waiting for admission, or cores locally), admitted by
the cluster's queue, running, then one end: preempted (deleted by the queue for a higher
priority, without an exit code of its own), succeeded or failed. Local pods are never admitted
nor preempted."""
ENDED_PHASES: frozenset[Phase] = frozenset({"preempted", "succeeded", "failed"})
"""The phases that end an attempt (its harness log is complete then)."""

HarnessEvent = ev.UnitStarted | ev.UnitDone | ev.UnitsDone | ev.WorkerReport | ev.Merged
"""The events a harness process writes to its own log, which the actor copies to the run's."""


class Message(msgspec.Struct, tag_field="kind", kw_only=True, frozen=True):
    """A fact the actor of a run observed."""


class Resume(Message, tag="resume", frozen=True):
    """The actor started on the folded log: a new run, or one an earlier service left.

    `pods_survive`: the backend's pods outlive the service (a cluster's), so the pods an
    earlier service saw running still run and are taken over, not failed."""

    pods_survive: bool = False
    builds_images: bool = False
    """The backend runs the images of environments (`Capabilities.images`): a run whose model
    has a snapshot gets its environment resolved and its image built before its submission."""


class EnvironmentReady(Message, tag="environment-ready", frozen=True):
    """The environment of the run was resolved: the image it needs (None: the service's own,
    the model has no `pyproject.toml`) and the hash of its lock."""

    image: str | None = None
    lock_sha256: str | None = None


class ImageReady(Message, tag="image-ready", frozen=True):
    """The image of the run is in the registry: built in `seconds`, or found there (`cached`)."""

    image: str
    seconds: float | None = None
    cached: bool = False


class EnvironmentFailed(Message, tag="environment-failed", frozen=True):
    """The environment of the run cannot be resolved or its image not built, for good."""

    reason: str


class NodeReservation(Message, tag="node-reservation", frozen=True):
    """The backend was asked to reserve the run's node: `taken`, or refused for good
    (`reason`: the node does not exist, another run holds it). A backend that cannot be reached
    raises instead, and the actor tries again."""

    node: str
    taken: bool
    reason: str = ""


class NodeRelease(Message, tag="node-release", frozen=True):
    """The backend released the reservation of the run's node (or found nothing of it left:
    the node is gone, or holds another run's reservation now)."""

    node: str


class WorkflowAccepted(Message, tag="workflow-accepted", frozen=True):
    """The backend took the run under its deterministic workflow name."""

    name: str


class SubmissionRefused(Message, tag="submission-refused", frozen=True):
    """The backend refused the run for good (its manifests cannot be built, the cluster
    rejects them): `reason` says why. A backend that cannot be reached raises instead, and the
    actor tries again."""

    reason: str


class PodChanged(Message, tag="pod-changed", frozen=True):
    """A pod (a local process) of a task changed its phase.

    `harness` holds the new events of that pod's own harness log (read at its end, so its
    report and last units precede it); `merged_marker` whether the task's output has the merge
    marker (read when the pod succeeded); `message` the backend's detail (where its log is);
    `on_retry_memory` the memory the attempt really had, when the backend reports it.
    """

    task: str
    worker: str
    attempt: int
    phase: Phase
    exit_code: int | None = None
    pid: int | None = None
    node: str | None = None
    oom: bool = False
    message: str | None = None
    harness: list[HarnessEvent] = msgspec.field(default_factory=list)
    merged_marker: bool = False
    gpus: list[str] | None = None
    """The GPUs the backend gave a running attempt, as `CUDA_VISIBLE_DEVICES` names them (the
    local backend); None when it does not say."""
    on_retry_memory: bool | None = None
    """Whether the attempt ran with the retry memory, when the backend knows it (a pod's spec);
    None: as the decider asked. On Argo an attempt after a preemption that followed a kill for
    memory gets the first memory again (spec 11 findings)."""


class WorkflowGone(Message, tag="workflow-gone", frozen=True):
    """The backend's workflow of the live run is gone while nothing asked to stop it (deleted
    by hand, or by its time to live on a cluster): the pods it held went with it. `name` is the
    workflow's. The decider ends the attempts the run had live as preempted and submits the run
    again, every worker after its attempts so far, as at a `Resume`."""

    name: str = ""


class HarnessRead(Message, tag="harness-read", frozen=True):
    """New events of the run's harness logs, read by the actor's timer."""

    events: list[HarnessEvent] = msgspec.field(default_factory=list)


class CancelAsked(Message, tag="cancel-asked", frozen=True):
    """Somebody asked to cancel the run."""

    by: str


class PodsGone(Message, tag="pods-gone", frozen=True):
    """No pod of the run runs any more (after `StopPods` or `Settle`); `harness` holds what
    every harness log had left."""

    harness: list[HarnessEvent] = msgspec.field(default_factory=list)


class MergeMarker(Message, tag="merge-marker", frozen=True):
    """The merge marker of a split task whose coordinator succeeded without a `merged` event
    was looked for (`AwaitMergeMarker`): found, or not within the backend's grace."""

    task: str
    found: bool


class StoreWritable(Message, tag="store-writable", frozen=True):
    """The store takes appends again after `error`, which stopped the run: `changes` are the
    pod changes reported meanwhile, `harness` what every harness log had left."""

    error: str
    changes: list[PodChanged] = msgspec.field(default_factory=list)
    harness: list[HarnessEvent] = msgspec.field(default_factory=list)


AnyMessage = (
    Resume
    | EnvironmentReady
    | ImageReady
    | EnvironmentFailed
    | NodeReservation
    | NodeRelease
    | WorkflowAccepted
    | SubmissionRefused
    | PodChanged
    | WorkflowGone
    | HarnessRead
    | CancelAsked
    | PodsGone
    | MergeMarker
    | StoreWritable
)

BackendReport = PodChanged | WorkflowGone
"""What a backend reports of a run it runs (through the callback given to its `submit`): a
pod changed, or the run's workflow is gone."""


class Command(msgspec.Struct, tag_field="kind", kw_only=True, frozen=True):
    """Something the actor carries out once the events of its decision are durable."""


class ResolveEnvironment(Command, tag="resolve-environment", frozen=True):
    """Resolve the environment of the run from its snapshots (in the background: the mailbox is
    not held), then send `EnvironmentReady` or `EnvironmentFailed`."""


class BuildImage(Command, tag="build-image", frozen=True):
    """Make sure the registry has `image`, building it when it lacks it (once per image for
    every run that asks), in the background; then send `ImageReady` or `EnvironmentFailed`."""

    image: str


class ReserveNode(Command, tag="reserve-node", frozen=True):
    """Reserve `node` for the run (taint and label it), then send `NodeReservation`."""

    node: str


class ReleaseNode(Command, tag="release-node", frozen=True):
    """Release the run's reservation of `node`, then send `NodeRelease` (a failure is retried
    by the actor's restart)."""

    node: str


class SubmitRun(Command, tag="submit", frozen=True):
    """Submit the run to the backend (again, after a restart: it takes it as submitted): the
    tasks done, the tasks to start now (`ready`: every task they read from is done), the next
    attempt of each (task, worker), those with the retry memory."""

    done: frozenset[str] = frozenset()
    ready: frozenset[str] = frozenset()
    next_attempts: dict[tuple[str, str], int] = msgspec.field(default_factory=dict)
    retry_memory: frozenset[tuple[str, str]] = frozenset()


class RetryPod(Command, tag="retry", frozen=True):
    """Start `attempt` of a worker of a task (with the retry memory when `retry_memory`)."""

    task: str
    worker: str
    attempt: int
    retry_memory: bool = False


class StartTask(Command, tag="start-task", frozen=True):
    """Start the pods of a task of the submitted run: every task it reads from is done now
    (idempotent: a task started already is not started twice)."""

    task: str


class StopPods(Command, tag="stop-pods", frozen=True):
    """Stop every pod of the run and start none; then read every harness log and send
    `PodsGone`."""


class Settle(Command, tag="settle", frozen=True):
    """Nothing runs any more: read every harness log and send `PodsGone`."""


class AwaitMergeMarker(Command, tag="await-merge-marker", frozen=True):
    """Look for the merge marker of a task (listing its output directory, which defeats the
    negative lookup cache of NFS) until it is there or the backend's grace passed; then send
    `MergeMarker`. The mailbox is not held meanwhile."""

    task: str


class KeepLogs(Command, tag="keep-logs", frozen=True):
    """Keep the logs of the pods of a final task in the store (idempotent)."""

    task: str


class Learn(Command, tag="learn", frozen=True):
    """Learn the resources of a final task from the reports of its pods."""

    task: str


class AnswerCancel(Command, tag="answer-cancel", frozen=True):
    """Answer the cancel being decided: accepted (`cancel-requested` is durable) or refused
    because the run ended or is ending (`state` says how)."""

    accepted: bool
    state: str = ""


AnyCommand = (
    ResolveEnvironment
    | BuildImage
    | ReserveNode
    | ReleaseNode
    | SubmitRun
    | RetryPod
    | StartTask
    | StopPods
    | Settle
    | AwaitMergeMarker
    | KeepLogs
    | Learn
    | AnswerCancel
)


class Decision(msgspec.Struct, frozen=True):
    """What the decider decided on one message: events to append, then commands to carry out."""

    events: list[ev.Event] = msgspec.field(default_factory=list)
    commands: list[AnyCommand] = msgspec.field(default_factory=list)


_message_encoder = msgspec.json.Encoder()
_message_decoder = msgspec.json.Decoder(AnyMessage)


def encode_message(message: Message) -> bytes:
    """A message as one JSON line (for recording a run's messages)."""
    return _message_encoder.encode(message) + b"\n"


def decode_message(line: bytes | str) -> AnyMessage:
    """The message of a recorded line."""
    return _message_decoder.decode(line)
