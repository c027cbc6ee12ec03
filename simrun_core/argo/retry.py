"""The retries of a pod on Argo: its `retryStrategy` and the `podSpecPatch` of every attempt.

Argo retries a pod when its `retryStrategy.expression` holds for the attempt that failed
(`retryPolicy: Always` must be set with it, docs/retries.md "Conditional retries"). The
expression knows only that last attempt: `lastRetry.exitCode` is a string, "-1" when the pod
has no exit code (a pod deleted, e.g. preempted by Kueue, or lost with its node; spec 11
findings), and expr compares strings with strings only (`"3" != 3`), so codes are compared as
strings or through `asInt` (spec 32).

How `RETRY_EXPRESSION` mirrors `simrun_core.decider.decide_retry`:

- an exit code at most 128 is never retried: 0 (done, Argo retries no success anyway), 1 (a
  bug of the harness), 3 (a unit, the merge or the command failed), 4 (a configuration
  error) and any other exit of a command: `decide_retry` fails those at once;
- an exit code above 128 (a signal's: 137 killed, for its memory or after its grace period,
  143 stopped on SIGTERM; `exits.stopped_from_outside`) is retried: `decide_retry` retries a
  first kill for memory (with the retry memory) and the first `STOP_RETRIES` stops;
- no exit code ("-1") is retried: an eviction, a stop from outside that left no code (spec 11:
  "Only a pod which was stopped is retried: without an exit code, killed (137) or stopped on
  SIGTERM (143)"). `decide_retry` has no case for it: the decider reads a failure without an
  exit code as exit 1, so the Argo backend must report such an attempt as a preemption.

What needs more than the last attempt, Argo cannot know: that a kill for memory followed one
already (the attempt ran with the retry memory), or that a worker was stopped more than
`STOP_RETRIES` times. There Argo retries and `decide_retry` does not: the decider fails the task
and stops the workflow (`StopPods`), which ends the retried attempt, waiting for admission or
running. `RETRY_LIMIT` bounds what remains, the evictions by Kueue, each of which counts.

The attempt after an exit 137 gets the retry memory (`podSpecPatch`, a strategic merge patch of
the pod spec, in which `{{=...}}` expressions see `lastRetry` of the attempt, spec 32); every
other attempt the first memory. So an attempt after a preemption that followed a kill for memory
has the first memory again (spec 11, "The retry memory after a preemption").

A Workflow created again for a run whose workers were killed for memory before (the decider's
`retry_memory`) gives every attempt of those workers the retry memory, as the decider retries
them: an unsplit task's or a merge's template has its retry values only, and the template of a
split task's workers tests the worker's input parameter too (`retry_condition`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Final

from simrun_core import exits

RETRY_LIMIT: Final = 100
"""The retries of a pod (spec 11): every eviction by Kueue counts as one."""
RETRY_POLICY: Final = "Always"
"""Retry attempts that are `Failed` and `Error` alike; `expression` decides (spec 32)."""
NO_EXIT_CODE: Final = "-1"
"""`lastRetry.exitCode` of an attempt whose pod has no exit code."""
SIGNAL_BASE: Final = 128
"""An exit code above this is a signal's, 128 + the signal (`exits.stopped_from_outside`)."""
GRACE_MARGIN_S: Final = 30
"""Seconds a pod gets beyond the grace of its worker, for the executor to finish (as 0.1.0)."""

RETRY_EXPRESSION: Final = (
    f"lastRetry.exitCode == '{NO_EXIT_CODE}' || asInt(lastRetry.exitCode) > {SIGNAL_BASE}"
)
"""Whether Argo retries the attempt that failed; see the module for how it mirrors the decider."""


def retry_strategy() -> dict[str, Any]:
    """The `retryStrategy` of every pod template: limit 100, policy `Always`, the expression.

    The limit is a string: an int-or-string, which Argo's `schema.json` types as a string and
    its CRD as either (tests/upstream/README.md).
    """
    return {"limit": str(RETRY_LIMIT), "retryPolicy": RETRY_POLICY, "expression": RETRY_EXPRESSION}


AFTER_MEMORY_KILL: Final = f"lastRetry.exitCode == '{exits.KILLED}'"
"""The condition of an attempt after an exit 137 of the one before (the first attempt sees
`lastRetry.exitCode` "0")."""


def retry_condition(variable: str | None = None, workers: Iterable[str] = ()) -> str:
    """The condition of an attempt with the retry memory: after an exit 137, or of one of
    `workers`, the values of the template's input `variable` (`inputs.parameters.worker`)
    whose every attempt has it."""
    parts = [AFTER_MEMORY_KILL]
    for worker in sorted(workers):
        if variable is None:
            raise ValueError("the workers of a condition need the variable that names them")
        parts.append(f"{variable} == {_quoted(worker)}")
    return " || ".join(parts)


def after_memory_kill(retry: str, first: str, condition: str = AFTER_MEMORY_KILL) -> str:
    """An Argo expression of an attempt: `retry` where `condition` holds (after an exit 137 of
    the one before), else `first`; the value itself when both are the same."""
    if retry == first:
        return first
    return f"{{{{={condition} ? {_quoted(retry)} : {_quoted(first)}}}}}"


def _quoted(value: str) -> str:
    if "'" in value or "}}" in value or "\\" in value:
        raise ValueError(f"{value!r} cannot be quoted in an Argo expression")
    return f"'{value}'"


def pod_spec_patch(
    container: str,
    memory: tuple[str, str],
    env: dict[str, tuple[str, str]],
    grace_period_s: int,
    condition: str = AFTER_MEMORY_KILL,
) -> str:
    """The `podSpecPatch` of a template: the memory (request and limit) and the variables of
    `env` of the container, each a pair of its first and its retry value (the retry one where
    `condition` holds, `retry_condition`), and the pod's `terminationGracePeriodSeconds`,
    which a template has no field for (spec 32).

    JSON, as Argo takes it: a strategic merge patch, containers and env merged by name.
    """
    first, retry = memory
    quantity = after_memory_kill(retry, first, condition)
    patch = {
        "terminationGracePeriodSeconds": grace_period_s,
        "containers": [
            {
                "name": container,
                "resources": {"requests": {"memory": quantity}, "limits": {"memory": quantity}},
                "env": [
                    {"name": name, "value": after_memory_kill(values[1], values[0], condition)}
                    for name, values in env.items()
                ],
            }
        ],
    }
    return json.dumps(patch, separators=(",", ":"))
