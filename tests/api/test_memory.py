"""A task killed for its memory is retried with more, and the next estimate has learned it."""

from __future__ import annotations


def hungry(memory_mb: int) -> dict:
    settings = {"n": 4, "sleep_s": 1.0, "memory_mb": memory_mb}
    return {
        "name": "hungry",
        "tasks": [{"id": "squares", "type": "demo.squares", "settings": settings}],
    }


def test_a_kill_for_memory_is_retried_with_more_memory_and_learned(local_service):
    run = local_service.submit(hungry(300))
    end = local_service.wait(run["id"], timeout=120)
    assert end["state"] == "succeeded", end
    events = local_service.events(run["id"])
    kills = [e for e in events if e["type"] == "oom-killed"]
    assert len(kills) == 1 and kills[0].get("attempt", 0) == 0
    failed = [e for e in events if e["type"] == "pod-failed"]
    assert failed[0]["exit_code"] == 137 and failed[0]["oom"] and failed[0]["retry"]
    assert "retried with 0.375 GiB per process" in failed[0]["message"]
    assert [e.get("attempt", 0) for e in events if e["type"] == "pod-started"] == [0, 1]
    estimate = local_service.client.post("/estimate", json={"workflow": hungry(300)}).json()
    learned = estimate["squares"]["resources"]
    assert learned["source"].startswith("learned from")
    assert learned["memory_per_worker_gb"] > 0.25


def test_a_second_kill_for_memory_fails_the_run_naming_the_retry_memory(local_service):
    run = local_service.submit(hungry(600))
    end = local_service.wait(run["id"], timeout=120)
    assert end["state"] == "failed"
    assert (
        "killed for memory again with the retry memory of 0.375 GiB per process" in (end["message"])
    )
    kinds = [e["type"] for e in local_service.events(run["id"])]
    assert kinds.count("oom-killed") == 2
