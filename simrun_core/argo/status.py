"""The pods of a run as Argo's `status.nodes` show them, and their changes as decider messages.

Argo writes a node per DAG task and, below a task with a `retryStrategy`, a `Retry` node whose
children are the attempts, `Pod` nodes named `<name>(<attempt>)`; a task over `withSequence` is
a `TaskGroup` whose children are named `<name>(<index>:<item>)` (spec 32,
reference/argo-workflows/testdata/README.md). A `Pod` node's phase becomes the phase of an
attempt (spec 11 findings, spec 38):

- `Pending`: created and waiting (gated by Kueue until it is admitted); `admitted` once the
  backend saw its pod's scheduling gates removed;
- `Running`; `Succeeded`;
- `Failed` or `Error` with an exit code: failed, with `OOMKilled` in the message the evidence
  of a kill for memory (`main: OOMKilled (exit code 137)`);
- `Failed` or `Error` without an exit code (`pod deleted` by Kueue's preemption, a lost node, a
  pod that could not be created): preempted; Argo retries it, and the decider counts it as no
  stop from outside.

Older controllers wrote the exit code only in the message (`failed with exit code 2`); it is
read from there when `outputs.exitCode` is missing. Nodes of other types, `Omitted`, `Skipped`
and nodes without a phase are no attempts.

Argo numbers the attempts of a node from 0; a Workflow created again for a run that ran before
starts its workers later, as its annotation `simrun/first-attempts` says (`first_attempts`), so
an attempt is its worker's first attempt plus Argo's number, as its pod's harness counts it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import msgspec

from simrun_core.argo import labels
from simrun_core.messages import Phase, PodChanged

ATTEMPT_NAME: Final = re.compile(
    r"^(?P<name>.+?)(?:\((?P<index>\d+):(?P<item>[^()]*)\))?(?:\((?P<attempt>\d+)\))?$"
)
"""A node's display name: the DAG task, the item of a fan-out, the attempt of a retry."""
EXIT_IN_MESSAGE: Final = re.compile(r"exit code (?P<code>-?\d+)")
OOM_KILLED: Final = "OOMKilled"
ENDED: Final = {"Failed", "Error"}


class AttemptStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt of a worker of a task, as its `Pod` node shows it."""

    task: str
    worker: str
    attempt: int
    phase: Phase
    node_id: str
    exit_code: int | None = None
    oom: bool = False
    host: str | None = None
    message: str | None = None


Resolver = Callable[[str, str | None], tuple[str, str] | None]
"""(DAG task name, fan-out item) -> (task, worker), None for a node that is no worker's."""


def exit_code_of(node: Mapping[str, Any]) -> int | None:
    """The exit code of a node: `outputs.exitCode` (a string), else one named in its message."""
    outputs = node.get("outputs") or {}
    code = outputs.get("exitCode") if isinstance(outputs, Mapping) else None
    if code is not None and str(code).lstrip("-").isdigit():
        return int(code)
    found = EXIT_IN_MESSAGE.search(str(node.get("message") or ""))
    return int(found["code"]) if found else None


def attempt_phase(node: Mapping[str, Any], admitted: bool = False) -> Phase | None:
    """The phase of the attempt a `Pod` node is; None for one that is no attempt (yet)."""
    phase = node.get("phase")
    if phase == "Pending":
        return "admitted" if admitted else "pending"
    if phase == "Running":
        return "running"
    if phase == "Succeeded":
        return "succeeded"
    if phase in ENDED:
        return "failed" if exit_code_of(node) is not None else "preempted"
    return None


def first_attempts(workflow: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    """The first attempt of each (task, worker) of a Workflow that does not start it at 0, from
    its annotation `simrun/first-attempts`; none when it has none (or one that is no such map)."""
    annotations = (workflow.get("metadata") or {}).get("annotations") or {}
    try:
        given = json.loads(annotations.get(labels.FIRST_ATTEMPTS) or "{}")
    except (TypeError, ValueError):
        return {}
    found: dict[tuple[str, str], int] = {}
    if not isinstance(given, dict):
        return found
    for task, workers in given.items():
        if not isinstance(workers, dict):
            continue
        for worker, attempt in workers.items():
            if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt > 0:
                found[(str(task), str(worker))] = attempt
    return found


def attempts(
    workflow: Mapping[str, Any],
    resolve: Resolver,
    admitted: Callable[[str], bool] = lambda node_id: False,
) -> dict[tuple[str, str, int], AttemptStatus]:
    """Every attempt of the workflow's status by (task, worker, attempt), numbered from each
    worker's first attempt (`first_attempts`); `admitted(node id)` tells whether the pod of a
    pending node was admitted by the queue."""
    first = first_attempts(workflow)
    status = workflow.get("status") or {}
    nodes = status.get("nodes") or {} if isinstance(status, Mapping) else {}
    found: dict[tuple[str, str, int], AttemptStatus] = {}
    for node_id, node in nodes.items():
        if not isinstance(node, Mapping) or node.get("type") != "Pod":
            continue
        named = ATTEMPT_NAME.match(str(node.get("displayName") or node.get("name") or ""))
        if named is None:
            continue
        worker = resolve(named["name"], named["item"])
        phase = attempt_phase(node, admitted(str(node.get("id") or node_id)))
        if worker is None or phase is None:
            continue
        task, worker_id = worker
        attempt = first.get(worker, 0) + int(named["attempt"] or 0)
        message = str(node.get("message") or "") or None
        found[(task, worker_id, attempt)] = AttemptStatus(
            task=task,
            worker=worker_id,
            attempt=attempt,
            phase=phase,
            node_id=str(node.get("id") or node_id),
            exit_code=exit_code_of(node) if phase in ("failed", "succeeded") else None,
            oom=phase == "failed" and OOM_KILLED in (message or ""),
            host=node.get("hostNodeName") or None,
            message=message,
        )
    return found


def changes(
    before: Mapping[tuple[str, str, int], AttemptStatus],
    after: Mapping[tuple[str, str, int], AttemptStatus],
) -> list[PodChanged]:
    """The pod changes from one status of a workflow to the next, attempts in order: an attempt
    seen for the first time, or whose phase changed. An attempt gone from the status (a node
    Argo created again as the same attempt) is not reported gone: its next phase is."""
    found = []
    for key in sorted(after):
        now = after[key]
        then = before.get(key)
        if then is not None and then.phase == now.phase:
            continue
        found.append(
            PodChanged(
                task=now.task,
                worker=now.worker,
                attempt=now.attempt,
                phase=now.phase,
                exit_code=now.exit_code,
                node=now.host,
                oom=now.oom,
                message=now.message,
            )
        )
    return found


def resolver(task_ids: Iterable[str], split: Iterable[str]) -> Resolver:
    """The workers of our own DAG names (simrun_core.argo.workflow): `<task>-w0` the
    coordinator `w0`, `<task>-extra(<i>:<item>)` the extra worker `w<item>`, `<task>-merge` the
    merge, `<task>` the one pod of an unsplit task."""
    names: dict[str, tuple[str, str]] = {}
    for task in task_ids:
        names[task] = (task, task)
    for task in split:
        names[f"{task}-w0"] = (task, "w0")
        names[f"{task}-extra"] = (task, "")
        names[f"{task}-merge"] = (task, "merge")

    def resolve(name: str, item: str | None) -> tuple[str, str] | None:
        found = names.get(name)
        if found is None:
            return None
        task, worker = found
        if worker == "":
            return (task, f"w{item}") if item is not None and item.isdigit() else None
        return found

    return resolve
