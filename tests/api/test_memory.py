"""Locally the memory of a task sizes its pool and nothing kills a process above its share
(spec 06): a unit above the memory per process of its plan runs to its end when the machine holds
it, and the next estimate learns the memory it took. The kill for memory and its retry with more
where a limit is real (a pod) are tested on the fake cluster (tests/cluster/test_take_back.py)."""

from __future__ import annotations

GIB = 1024**3
MB = 10**6


def hungry(memory_mb: int) -> dict:
    """Units of `memory_mb` each, above the 0.25 GiB per process of demo.squares' hint."""
    settings = {"n": 4, "memory_mb": memory_mb}
    return {
        "name": "hungry",
        "tasks": [{"id": "squares", "type": "demo.squares", "settings": settings}],
    }


def test_a_unit_above_its_share_of_memory_runs_to_its_end_and_is_learned(local_service):
    estimate = local_service.client.post("/estimate", json={"workflow": hungry(700)}).json()
    assert estimate["squares"]["resources"]["memory_per_worker_gb"] == 0.25
    run = local_service.submit(hungry(700))
    end = local_service.wait(run["id"], timeout=120)
    assert end["state"] == "succeeded", end
    events = local_service.events(run["id"])
    kinds = [e["type"] for e in events]
    assert "oom-killed" not in kinds and "pod-failed" not in kinds, kinds
    assert [e.get("attempt", 0) for e in events if e["type"] == "pod-started"] == [0]
    report = next(e for e in events if e["type"] == "worker-report")
    assert report.get("oom_kills", 0) == 0
    assert report["peak_memory_bytes"] >= 700 * MB  # above the 0.25 GiB of its share
    assert report["memory_limit_bytes"] is not None  # the plan's memory sized the pool
    summary = local_service.run_dir(run["id"]) / "tasks" / "squares" / "out" / "summary.json"
    assert summary.exists()
    learned = local_service.client.post("/estimate", json={"workflow": hungry(700)}).json()
    resources = learned["squares"]["resources"]
    assert resources["source"].startswith("learned from"), resources
    assert resources["memory_per_worker_gb"] > 0.25
