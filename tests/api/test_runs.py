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
        ([command("a", ["true"]), command("a", ["true"])], "task 'a': id: used twice"),
        ([{"id": "a", "type": "no.such", "settings": {}}], "unknown task type 'no.such'"),
        (
            [{"id": "a", "type": "demo.squares", "settings": {"n": 3, "sleep": 1}}],
            "unknown setting 'sleep'",
        ),
        ([command("a", ["true"], inputs={"x": "ghost.out"})], "unknown task 'ghost'"),
        ([command("Bad_Id", ["true"])], "task 'Bad_Id': id: must match"),
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
    assert response.status_code == 422
    assert response.json()["errors"] == ["task 'a': type: missing, it is required"]


def test_a_wrong_resource_is_refused_with_the_wrong_settings(local_service):
    """A field of a task that does not decode keeps the checks of its type from nothing: the
    wrong settings (a quoted number too) are listed with the wrong resource, in one answer."""
    task = {
        "id": "sq",
        "type": "demo.squares",
        "settings": {"n": "100", "sleep_s": "fast", "memry_mb": 1},
        "resources": {"workers": "two"},
    }
    expected = [
        "task 'sq': resources.workers: expected `int | null`, got `str`",
        "task 'sq': settings: unknown setting 'memry_mb'",
        "task 'sq': settings.n: expected `int`, got `str`",
        "task 'sq': settings.sleep_s: expected `float`, got `str`",
    ]
    body = {"workflow": {"name": "bad", "tasks": [task]}}
    response = local_service.client.post("/runs", json=body)
    assert response.status_code == 422
    assert response.json()["errors"] == expected
    check = local_service.client.post("/validate", json=body)
    assert check.json() == {"ok": False, "errors": expected}


INVALID_TWICE = {
    "name": "bad",
    "tasks": [
        {"id": "a", "type": "demo.squares", "settings": {"n": 2, "nn": 1}},
        {
            "id": "b",
            "type": "demo.squares",
            "settings": {"n": "many"},
            "inputs": {"x": "a.squares"},
        },
        command("c", ["true"], inputs={"x": "d.out"}),
        command("d", ["echo", "{output}"], inputs={"y": "c.out"}),
        command("e", []),
        {**command("f", ["true"]), "settings": {"image": "i", "args": ["true"], "cores": 1000}},
    ],
}
TOO_BIG = [
    {"image": "i", "args": ["true"], "cores": 1000, "memory_gb": 1},
    {"image": "i", "args": ["true"], "cores": 1, "memory_gb": 1e6},
]
EVERY_ERROR = [
    "the inputs of tasks 'c', 'd' form a cycle",
    "task 'a': settings: unknown setting 'nn'",
    "task 'b': settings.n: expected `int`, got `str`",
    "task 'b': inputs.x: no input port of 'demo.squares' (its input ports: after)",
    "task 'd': settings.args[1]: unknown placeholder {output}, expected {settings}, {out} or "
    "{input}; write {{ and }} for a literal brace, e.g. ${{HOME}} for ${HOME}",
    "task 'e': settings.args: empty: a command needs at least the program to run",
    "task 'f': settings.memory_gb: missing, it is required",
]


def test_every_refusal_of_a_workflow_is_422_listing_every_error(local_service):
    """A cycle, unknown and invalid settings, a port, argv placeholders and an empty argv,
    through each route of workflows: one status, every error, each located one way."""
    client = local_service.client
    for path in ("/runs", "/estimate"):
        response = client.post(path, json={"workflow": INVALID_TWICE})
        assert response.status_code == 422, (path, response.text)
        assert response.json()["errors"] == EVERY_ERROR, path
        assert response.json()["detail"] == "\n".join(EVERY_ERROR)
    check = client.post("/validate", json={"workflow": INVALID_TWICE})
    assert check.status_code == 200
    assert check.json() == {"ok": False, "errors": EVERY_ERROR}
    assert not list((local_service.store / "runs").glob("*"))


def test_a_task_too_big_for_every_node_names_the_field_written_and_the_largest_node(
    local_service,
):
    tasks = [
        {"id": f"t{i}", "type": "command", "settings": settings}
        for i, settings in enumerate(TOO_BIG)
    ]
    response = local_service.client.post("/runs", json={"workflow": {"name": "w", "tasks": tasks}})
    assert response.status_code == 422, response.text
    cores, memory = response.json()["errors"]
    assert cores.startswith(
        "task 't0': settings.cores: 1000 cores and 1 GiB fits on no node: the largest has "
    ), cores
    assert memory.startswith(
        "task 't1': settings.memory_gb: 1 core and 1,000,000 GiB fits on no node: the largest has "
    ), memory
    assert "memory_per_worker_gb" not in response.text


NO_JSON = [
    (b"name: w", ["the body is not JSON: JSON is malformed: invalid character (byte 4)"]),
    (
        b'{"workflow": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        ["the JSON body is nested too deeply"],
    ),
]
NO_SUBMISSION = [
    (b"", ["the body is empty: a JSON object with the workflow is expected"]),
    (b"[1, 2]", ["the body is no JSON object with the workflow"]),
    (b'{"workflow": "hello"}', ["a workflow is a mapping with 'name' and 'tasks'"]),
    (b'{"workflw": {}}', ["workflw: unknown field", "workflow: missing, it is required"]),
    (
        b'{"workflow": {"name": 1, "split": "slow", '
        b'"tasks": [7, {"id": "a", "type": "command", "x": 1}]}}',
        [
            "name: expected `str`, got `int`",
            "split: invalid enum value 'slow'",
            "tasks[0]: a task is a mapping with 'id' and 'type', got int 7",
            "task 'a': x: unknown field",
        ],
    ),
    (
        b'{"workflow": {"name": "w", "tasks": ' + b"[" * 100 + b"]" * 100 + b"}}",
        ["not a workflow: nested deeper than 64 levels"],
    ),
]


@pytest.mark.parametrize(("body", "errors"), NO_JSON + NO_SUBMISSION)
def test_a_body_that_is_no_submission_is_422_with_every_error(local_service, body, errors):
    """`/runs` and `/estimate` refuse it with 422; `/validate` answers `ok: false` with the same
    errors, and refuses only a body that is no JSON (422)."""
    for path in ("/runs", "/estimate", "/validate"):
        response = local_service.client.post(
            path, content=body, headers={"content-type": "application/json"}
        )
        if path == "/validate" and (body, errors) in NO_SUBMISSION:
            assert response.status_code == 200, (path, response.text)
            assert response.json() == {"ok": False, "errors": errors}, path
        else:
            assert response.status_code == 422, (path, response.text)
            assert response.json()["errors"] == errors, path
    assert not list((local_service.store / "runs").glob("*"))


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
    listed = f"runs/{run['id']}/tasks/w/out/out/x.txt"  # relative to the store
    assert local_service.client.get(base).json() == {
        "files": [{"path": listed, "bytes": 2}],
        "left_out": 0,
    }
    assert local_service.client.get(base + "/out/x.txt").text == "42"
    assert local_service.client.get(f"{base}/{listed}").text == "42"  # the path as listed
    escape = f"runs/{run['id']}/tasks/w/out/../../settings.json"
    assert local_service.client.get(f"{base}/{escape}").status_code in (400, 404)
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
