"""`POST /estimate` and learning: the resources of a task come from its earlier runs."""

from __future__ import annotations

import pytest


def squares(n: int) -> dict:
    return {
        "name": "squares",
        "tasks": [{"id": "squares", "type": "demo.squares", "settings": {"n": n, "sleep_s": 0.01}}],
    }


def test_the_estimate_learns_from_a_finished_run(local_service):
    before = local_service.client.post("/estimate", json={"workflow": squares(40)})
    assert before.status_code == 200, before.text
    task = before.json()["squares"]
    assert task["resources"]["source"] == "plugin hint"
    assert task["resources"]["seconds_per_unit"] is None and task["seconds"] is None
    assert task["plan"]["pods"] == 1 and task["plan"]["units"] == 40
    run = local_service.submit(squares(40))
    assert local_service.wait(run["id"])["state"] == "succeeded"
    record = local_service.client.get(f"/runs/{run['id']}").json()
    assert record["tasks"]["squares"]["plan"]["source"] == "plugin hint"
    after = local_service.client.post("/estimate", json={"workflow": squares(40)}).json()
    learned = after["squares"]["resources"]
    assert learned["source"] == "learned from 1 run"
    assert learned["samples"] == 1
    assert 0.01 <= learned["seconds_per_unit"] < 1.0
    processes = after["squares"]["plan"]["shape"]["processes"]
    rounds = -(-40 // processes)
    assert after["squares"]["seconds"] == pytest.approx(learned["seconds_per_unit"] * rounds)


def test_an_estimate_of_an_invalid_workflow_is_refused(local_service):
    bad = {"name": "x", "tasks": [{"id": "a", "type": "demo.squares", "settings": {"m": 1}}]}
    response = local_service.client.post("/estimate", json={"workflow": bad})
    assert response.status_code == 422
    assert "unknown setting 'm'" in response.json()["detail"]
