"""simrun_core.argo.status: the attempts of Argo's `status.nodes`, read from the statuses Argo's
controller recorded upstream (reference/argo-workflows/testdata) and from our own DAG names."""

from __future__ import annotations

import json
from typing import Any

import yaml
from reference_schemas import REFERENCE

from simrun_core.argo.status import AttemptStatus, attempts, changes, first_attempts, resolver

TESTDATA = REFERENCE / "argo-workflows" / "testdata"


def recorded(name: str) -> dict[str, Any]:
    return yaml.safe_load((TESTDATA / name).read_text())


def as_named(name: str, item: str | None) -> tuple[str, str]:
    """Upstream names: the DAG task is the task, the fan-out item (or the task) the worker."""
    return (name, item if item is not None else name)


def summary(found: dict[tuple[str, str, int], AttemptStatus]) -> dict[tuple[str, str, int], Any]:
    return {key: (a.phase, a.exit_code, a.oom) for key, a in found.items()}


def test_failed_attempts_then_a_success_of_a_retry_node():
    found = attempts(recorded("dag-retry-succeeded-after-failed-attempts.yaml"), as_named)
    assert summary(found) == {
        ("step1", "step1", 0): ("failed", 1, False),  # the code only in the 2018 message
        ("step1", "step1", 1): ("failed", 1, False),
        ("step1", "step1", 2): ("succeeded", None, False),
    }


def test_the_exit_code_of_the_outputs_wins_over_the_message():
    found = attempts(recorded("steps-retry-expression-error-phase.yaml"), as_named)
    assert summary(found)[("retry", "retry", 0)] == ("failed", 1, False)  # Error, "exit code 2"
    assert summary(found)[("safe-to-retry", "safe-to-retry", 0)] == ("succeeded", 0, False)


def test_an_attempt_without_an_exit_code_is_preempted():
    """`Error` with no exit code (a pod deleted) and `Failed` of a pod that was never created
    are retried by Argo: preemptions for the decider, not failures."""
    deleted = attempts(recorded("retry-attempt-error-no-exit-code.yaml"), as_named)
    assert summary(deleted) == {("echo-wngc4", "echo-wngc4", 0): ("preempted", None, False)}
    quota = summary(attempts(recorded("retry-attempt-pending-exceeded-quota.yaml"), as_named))
    assert quota[("exceeded-quota", "exceeded-quota", 0)] == ("preempted", None, False)
    assert quota[("exceeded-quota", "exceeded-quota", 1)] == ("pending", None, False)


def test_a_fan_out_with_retries_names_item_and_attempt():
    found = summary(
        attempts(recorded("dag-withparam-fanout-retry-attempts-omitted.yaml"), as_named)
    )
    assert [found[("process-tasks", "3", n)] for n in range(3)] == [("failed", 1, False)] * 3
    assert found[("process-tasks", "7", 0)] == ("succeeded", 0, False)
    assert ("process-tasks", "3", 3) not in found


def test_pending_nodes_are_admitted_only_when_the_backend_says_so():
    workflow = recorded("steps-withparam-pending-waiting-for-mutex.yaml")
    assert {a.phase for a in attempts(workflow, as_named).values()} == {"pending"}
    admitted = attempts(workflow, as_named, admitted=lambda node_id: True)
    assert {a.phase for a in admitted.values()} == {"admitted"}


def test_every_recorded_pod_node_reads_without_error():
    for path in sorted(TESTDATA.glob("*.yaml")):
        document = yaml.safe_load(path.read_text())
        if isinstance(document, dict) and "status" in document:
            for found in attempts(document, as_named).values():
                assert found.phase in {"pending", "running", "succeeded", "failed", "preempted"}


# -- our own DAG names ------------------------------------------------------------------------


def node(name: str, phase: str, exit_code: str | None = None, message: str = "") -> dict:
    outputs = {"exitCode": exit_code} if exit_code is not None else {}
    return {
        "id": f"id-{name}",
        "displayName": name,
        "type": "Pod",
        "phase": phase,
        "message": message,
        "outputs": outputs,
        "hostNodeName": "agent-0",
    }


def status(*nodes: dict) -> dict:
    return {"status": {"nodes": {n["id"]: n for n in nodes}}}


OURS = resolver(["squares", "plot"], split=["squares"])


def test_our_names_resolve_to_tasks_workers_and_attempts():
    found = attempts(
        status(
            node("squares-w0(0)", "Failed", "137", "main: OOMKilled (exit code 137)"),
            node("squares-w0(1)", "Running"),
            node("squares-extra(0:1)(0)", "Error", message="pod deleted"),
            node("squares-extra(1:2)(0)", "Pending"),
            node("plot(0)", "Pending"),
            {"id": "dag", "displayName": "simrun-x", "type": "DAG", "phase": "Running"},
            node("unknown-task(0)", "Running"),
        ),
        OURS,
    )
    assert summary(found) == {
        ("squares", "w0", 0): ("failed", 137, True),
        ("squares", "w0", 1): ("running", None, False),
        ("squares", "w1", 0): ("preempted", None, False),
        ("squares", "w2", 0): ("pending", None, False),
        ("plot", "plot", 0): ("pending", None, False),
    }
    assert found[("squares", "w0", 0)].host == "agent-0"


def test_the_attempts_of_a_workflow_created_again_count_from_its_first_attempts():
    """Argo numbers every node's attempts from 0; the Workflow's annotation names where each
    worker starts (one not named at 0, a value that is no attempt ignored)."""
    workflow = status(
        node("squares-w0(0)", "Failed", "143"),
        node("squares-w0(1)", "Running"),
        node("squares-extra(0:1)(0)", "Running"),
        node("squares-extra(1:2)(0)", "Pending"),
        node("plot(0)", "Pending"),
    )
    first = {"squares": {"w0": 3, "w2": 1, "w1": "x"}, "plot": {"plot": -1}}
    workflow["metadata"] = {"annotations": {"simrun/first-attempts": json.dumps(first)}}
    assert first_attempts(workflow) == {("squares", "w0"): 3, ("squares", "w2"): 1}
    assert sorted(attempts(workflow, OURS)) == [
        ("plot", "plot", 0),
        ("squares", "w0", 3),
        ("squares", "w0", 4),
        ("squares", "w1", 0),
        ("squares", "w2", 1),
    ]
    workflow["metadata"]["annotations"]["simrun/first-attempts"] = "not json"
    assert first_attempts(workflow) == {}
    assert first_attempts({}) == {}


def test_changes_report_new_attempts_and_new_phases_in_order():
    before = attempts(status(node("squares-w0(0)", "Pending"), node("plot(0)", "Pending")), OURS)
    after = attempts(
        status(
            node("squares-w0(0)", "Running"),
            node("plot(0)", "Pending"),
            node("squares-extra(0:1)(0)", "Pending"),
        ),
        OURS,
    )
    reported = [(c.task, c.worker, c.attempt, c.phase) for c in changes(before, after)]
    assert reported == [("squares", "w0", 0, "running"), ("squares", "w1", 0, "pending")]
    assert changes(after, after) == []
    ended = attempts(
        status(node("squares-w0(0)", "Failed", "3", "main: Error (exit code 3)")), OURS
    )
    [failure] = changes(after, ended)
    assert (failure.phase, failure.exit_code, failure.oom) == ("failed", 3, False)
    assert failure.message == "main: Error (exit code 3)"
