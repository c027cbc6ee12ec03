"""The GPUs of a local service, given to its tasks like its cores: those of its own
`CUDA_VISIBLE_DEVICES`, else those a (fake) `nvidia-smi` lists; each task asking N gets N of them
alone, named by its `CUDA_VISIBLE_DEVICES`; a task asking none sees none."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_service import LocalService, command, python, start_service, stop_service, wait_until

RECORD = (
    "import json, os, pathlib, sys, time\n"
    "start = time.time()\n"
    "time.sleep(1.5)\n"
    "seen = os.environ.get('CUDA_VISIBLE_DEVICES')\n"
    "pathlib.Path(sys.argv[1], 'gpus.json').write_text(\n"
    "    json.dumps(dict(devices=seen, start=start, end=time.time())))\n"
)
"""A task that holds its GPU a while and writes what it saw and when to its output."""

FAKE_UUIDS = (
    "GPU-0a0a0a0a-1111-2222-3333-444444444444",
    "GPU-0b0b0b0b-5555-6666-7777-888888888888",
)
FAKE_NVIDIA_SMI = (
    f"#!/bin/sh\nprintf '0, {FAKE_UUIDS[0]}, 81559 MiB\\n1, {FAKE_UUIDS[1]}, 81559 MiB\\n'\n"
)


def service_env(tmp: Path, how: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """The environment of a service with two GPUs (`how`: by `CUDA_VISIBLE_DEVICES`, or listed
    by a fake `nvidia-smi` first on PATH), and the names of its GPUs."""
    env = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}
    if how == "variable":
        env["CUDA_VISIBLE_DEVICES"] = "3,5"
        return env, ("3", "5")
    programs = tmp / "bin"
    programs.mkdir()
    (programs / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (programs / "nvidia-smi").chmod(0o755)
    env["PATH"] = os.pathsep.join([str(programs), env.get("PATH", os.defpath)])
    return env, FAKE_UUIDS


@pytest.fixture(scope="module", params=["variable", "nvidia-smi"])
def gpu_service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LocalService, tuple[str, ...]]]:
    root = tmp_path_factory.mktemp(f"gpus-{request.param}")
    env, devices = service_env(root, request.param)
    service = start_service(root, env=env)
    yield service, devices
    stop_service(service)


def gpu_task(task_id: str, gpus: int) -> dict[str, object]:
    task = command(task_id, [*python(RECORD), "{out}"])
    task["settings"]["gpus"] = gpus  # type: ignore[index]
    return task


def seen(service: LocalService, run_id: str, task: str) -> dict[str, object]:
    path = service.run_dir(run_id) / "tasks" / task / "out" / "gpus.json"
    return json.loads(path.read_text())


def test_each_gpu_task_gets_one_gpu_of_its_own_and_waits_for_a_free_one(gpu_service):
    service, devices = gpu_service
    servers = service.client.get("/servers").json()
    assert [server["gpus"] for server in servers] == [2]
    tasks = [gpu_task(f"g{index}", 1) for index in range(3)] + [gpu_task("none", 0)]
    squares = {"id": "squares", "type": "demo.squares", "settings": {"n": 4}}
    tasks.append({**squares, "resources": {"gpus": 1}})
    run = service.submit({"name": "gpus", "tasks": tasks})

    def gpus_in_use() -> int:
        pods = service.client.get("/servers").json()[0]["pods"]
        return sum(pod["gpus"] for pod in pods if pod["run_id"] == run["id"])

    wait_until(gpus_in_use, timeout=60, what="a GPU task to run and show its GPU in /servers")
    view = service.wait(run["id"], timeout=120)
    assert view["state"] == "succeeded", view
    records = [seen(service, run["id"], f"g{index}") for index in range(3)]
    assert all(record["devices"] in devices for record in records), records
    assert seen(service, run["id"], "none")["devices"] == "", "a task without GPUs sees none"
    for index, first in enumerate(records):
        for second in records[index + 1 :]:
            overlap = first["start"] < second["end"] and second["start"] < first["end"]
            assert not (overlap and first["devices"] == second["devices"]), records
    for record in records:
        at_once = [other for other in records if other["start"] <= record["start"] < other["end"]]
        assert len(at_once) <= 2, records
    pods = {task: pods[0] for task, pods in pods_of(service, run["id"]).items()}
    for index, record in enumerate(records):
        assert pods[f"g{index}"]["gpus"] == [record["devices"]], "the run shows the GPU given"
    assert pods["none"]["gpus"] == []
    reports = [e for e in service.events(run["id"]) if e["type"] == "worker-report"]
    assert [(e["task"], len(e["gpus"])) for e in reports] == [("squares", 1)]
    assert reports[0]["gpus"][0] in devices, "the harness reports the GPU it had"
    assert pods["squares"]["gpus"] == reports[0]["gpus"]


def pods_of(service: LocalService, run_id: str) -> dict[str, list[dict[str, object]]]:
    view = service.client.get(f"/runs/{run_id}").json()
    return {task_id: task["pods"] for task_id, task in view["tasks"].items()}


def test_a_task_asking_more_gpus_than_the_machine_has_is_refused(gpu_service):
    service, _ = gpu_service
    workflow = {"name": "greedy", "tasks": [gpu_task("big", 3)]}
    runs_before = sorted(path.name for path in (service.store / "runs").glob("*"))
    response = service.client.post("/runs", json={"workflow": workflow})
    assert response.status_code == 422, response.text
    assert "task 'big': settings.gpus: a pod of 3 GPUs fits on no node: " in response.text
    assert "the most a node has is 2 GPUs" in response.text
    checked = service.client.post("/validate", json={"workflow": workflow}).json()
    assert checked["ok"] is False
    assert any("3 GPUs" in error for error in checked["errors"]), checked
    assert sorted(path.name for path in (service.store / "runs").glob("*")) == runs_before


def test_tasks_wait_for_the_one_gpu_though_cores_are_free(tmp_path):
    """One GPU and two cores: the GPU, not the cores, makes the tasks of one GPU take turns
    (the check of at most two at once above cannot fail on a machine of two cores)."""
    env = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}
    env["CUDA_VISIBLE_DEVICES"] = "7"
    service = start_service(tmp_path, env=env)
    try:
        if len(os.sched_getaffinity(0)) < 2:
            pytest.skip("needs two cores, so that only the GPU can make the tasks take turns")
        run = service.submit({"name": "one-gpu", "tasks": [gpu_task(f"g{i}", 1) for i in range(3)]})
        view = service.wait(run["id"], timeout=120)
        assert view["state"] == "succeeded", view
        records = sorted(
            (seen(service, run["id"], f"g{index}") for index in range(3)),
            key=lambda record: record["start"],
        )
        assert all(record["devices"] == "7" for record in records), records
        for first, second in itertools.pairwise(records):
            assert second["start"] >= first["end"], records
    finally:
        stop_service(service)
