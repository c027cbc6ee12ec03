"""Runs of `command` tasks through the real local service: order, inputs, refusals, cancel."""

from __future__ import annotations

import httpx
import msgspec
import pytest
from live_service import READ, WRITE, command, python, run_processes, wait_until

from simrun_core.wire import PlanView, PodView, RunView, TaskView


def test_a_task_reads_the_output_of_the_task_before_it(local_service):
    workflow = {
        "name": "chain",
        "tasks": [
            command("second", [*python(READ), "{input}"], inputs={"data": "first.out"}),
            command("first", [*python(WRITE), "{out}"]),
        ],
    }
    run = local_service.submit(workflow)
    assert run["state"] == "submitting"
    end = local_service.wait(run["id"])
    assert end["state"] == "succeeded", end
    assert end["tasks"] == {"first": "done", "second": "done"}
    logs = local_service.client.get(f"/runs/{run['id']}/logs/second").text
    assert "read 42" in logs
    events = local_service.events(run["id"])
    started = [e["task"] for e in events if e["type"] == "pod-started"]
    assert started == ["first", "second"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "submitted" and events[-1]["type"] == "succeeded"


@pytest.mark.parametrize(
    ("tasks", "needle"),
    [
        (
            [
                command("a", ["true"], inputs={"x": "b.out"}),
                command("b", ["true"], inputs={"x": "a.out"}),
            ],
            "cycle",
        ),
        ([command("a", ["true"]), command("a", ["true"])], "'a': the id is used twice"),
        ([{"id": "a", "type": "no.such", "settings": {}}], "unknown task type 'no.such'"),
        (
            [{"id": "a", "type": "demo.squares", "settings": {"n": 3, "sleep": 1}}],
            "unknown setting 'sleep'",
        ),
        ([command("a", ["true"], inputs={"x": "ghost.out"})], "unknown task 'ghost'"),
        ([command("Bad_Id", ["true"])], "'Bad_Id': the id must match"),
    ],
)
def test_an_invalid_workflow_is_refused_and_writes_nothing(local_service, tasks, needle):
    response = local_service.client.post(
        "/runs", json={"workflow": {"name": "bad", "tasks": tasks}}
    )
    assert response.status_code == 422, response.text
    assert needle in response.json()["detail"]
    assert not list((local_service.store / "runs").glob("*"))
    check = local_service.client.post(
        "/validate", json={"workflow": {"name": "bad", "tasks": tasks}}
    )
    assert check.json()["ok"] is False
    assert any(needle in error for error in check.json()["errors"])


def test_a_malformed_body_is_refused_naming_the_field(local_service):
    response = local_service.client.post(
        "/runs", json={"workflow": {"name": "x", "tasks": [{"id": "a"}]}}
    )
    assert response.status_code == 400
    assert "type" in response.text


def test_an_unknown_run_is_404(local_service):
    for path in ("/runs/20260101-000000-abcdef", "/runs/../../etc", "/runs/x/progress"):
        assert local_service.client.get(path).status_code == 404, path


def test_a_failing_command_fails_the_run_naming_the_task(local_service):
    run = local_service.submit(
        {"name": "f", "tasks": [command("boom", python("raise SystemExit(7)"))]}
    )
    end = local_service.wait(run["id"])
    assert end["state"] == "failed"
    assert "task 'boom' failed" in end["message"] and "exit code 7" in end["message"]


def test_a_cancelled_run_leaves_no_process(local_service):
    sleeper = python("import time; time.sleep(600)")
    run = local_service.submit({"name": "c", "tasks": [command("sleep", sleeper)]})
    wait_until(lambda: run_processes(run["id"]), what="the process of the run")
    response = local_service.client.post(f"/runs/{run['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["cancel_requested"] == local_service.client.get("/me").json()["name"]
    end = local_service.wait(run["id"])
    assert end["state"] == "cancelled"
    assert run_processes(run["id"]) == []
    again = local_service.client.post(f"/runs/{run['id']}/cancel")
    assert again.status_code == 409


def test_history_replay_and_sse_resume(local_service):
    run = local_service.submit({"name": "h", "tasks": [command("one", ["true"])]})
    end = local_service.wait(run["id"])
    assert end["state"] == "succeeded"
    history = local_service.client.get(f"/runs/{run['id']}/history").json()
    assert [e["seq"] for e in history] == list(range(1, end["seq"] + 1))
    first = local_service.client.get(f"/runs/{run['id']}", params={"at": 1}).json()
    assert first["state"] == "submitting" and first["seq"] == 1
    last = local_service.client.get(f"/runs/{run['id']}").json()
    assert last["state"] == "succeeded"
    with local_service.client.stream(
        "GET", f"/runs/{run['id']}/events", headers={"Last-Event-ID": "3"}
    ) as stream:
        ids = [int(line[3:]) for line in stream.iter_lines() if line.startswith("id:")]
    assert ids == list(range(4, end["seq"] + 1))


def test_outputs_are_listed_and_served_but_not_outside(local_service):
    run = local_service.submit({"name": "o", "tasks": [command("w", [*python(WRITE), "{out}"])]})
    assert local_service.wait(run["id"])["state"] == "succeeded"
    base = f"/runs/{run['id']}/outputs/w"
    assert local_service.client.get(base).json() == [{"path": "out/x.txt", "bytes": 2}]
    assert local_service.client.get(base + "/out/x.txt").text == "42"
    for bad in ("/../settings.json", "/..%2Fsettings.json", "/out/../../settings.json"):
        response = local_service.client.get(base + bad)
        assert response.status_code in (400, 404), (bad, response.status_code)
        assert "image" not in response.text
    assert local_service.client.get(f"/runs/{run['id']}/outputs/nope").status_code == 404


def test_a_request_without_token_gets_no_run(local_service):
    response = httpx.get(local_service.info["url"] + "/runs")
    assert response.status_code == 401


def _keys_are_the_view(data: dict) -> None:
    """The keys of a run's JSON are the fields of RunView, TaskView, PlanView and PodView: none
    of the fold's record (`plans`, `pods` by task, `oom_kills`, `logs_kept`, ...)."""
    assert set(data) == set(RunView.__struct_fields__)
    for task in data["tasks"].values():
        assert set(task) == set(TaskView.__struct_fields__)
        assert task["plan"] is None or set(task["plan"]) == set(PlanView.__struct_fields__)
        for pod in task["pods"]:
            assert set(pod) == set(PodView.__struct_fields__)


def test_a_run_is_answered_as_its_public_view(local_service):
    workflow = {
        "name": "viewed",
        "tasks": [
            {"id": "squares", "type": "demo.squares", "settings": {"n": 6}},
            command("after", ["true"], inputs={"data": "squares.squares"}),
        ],
    }
    submitted = local_service.submit(workflow)
    _keys_are_the_view(submitted)
    assert submitted["state"] == "submitting" and submitted["tasks"]["squares"]["units"] == 6
    end = local_service.wait(submitted["id"])
    assert end["state"] == "succeeded", end
    for params in ({}, {"at": 1}, {"at": end["seq"] // 2}):
        response = local_service.client.get(f"/runs/{submitted['id']}", params=params)
        assert response.status_code == 200, response.text
        _keys_are_the_view(response.json())
        msgspec.json.decode(response.content, type=RunView)
    run = msgspec.json.decode(
        local_service.client.get(f"/runs/{submitted['id']}").content, type=RunView
    )
    assert run.ended and run.progress is None and run.seq == end["seq"]
    squares = run.tasks["squares"]
    assert (squares.type, squares.state, squares.units, squares.done) == (
        "demo.squares",
        "done",
        6,
        6,
    )
    assert squares.plan is not None and squares.plan.source == "plugin hint"
    assert squares.pods and all(pod.state == "succeeded" for pod in squares.pods)
    assert all(pod.node and pod.exit_code == 0 for pod in squares.pods)
    assert sum(pod.units_done for pod in squares.pods) == 6
    assert [task.state for task in run.tasks.values()] == ["done", "done"]
    first = local_service.client.get(f"/runs/{submitted['id']}", params={"at": 1}).json()
    assert first["tasks"]["squares"]["pods"] == [] and first["tasks"]["squares"]["done"] == 0
