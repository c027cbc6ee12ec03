"""`local_commands: docker` on the real local service (issue 15): a `command` task runs in its
image through `docker run` (`podman run` where docker is missing), the store and the scratch
mounted at their paths, as the user, with the variables of the launch contract; refused at the
submission when neither is installed, never recorded and ignored.

No engine is installed here: the service finds a fake `docker` (or `podman`) first on its
`PATH`, a script that records its argv in `$FAKE_ENGINE_LOG` and runs the command of `run`
with the variables of its `--env` options in its `--workdir` (what a container of an image
with python would do), and records `kill`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_engine import calls, fake_engine, without_engines
from live_service import LocalService, command, start_service, stop_service, wait_until

SEEN = (
    "import json, os, sys; out = sys.argv[1]; os.makedirs(out, exist_ok=True); "
    "keys = ['SIMRUN_TASK_DIR', 'SIMRUN_RUN', 'SIMRUN_WORKER', 'SIMRUN_SCRATCH', 'FAKE_IMAGE']; "
    "seen = dict((key, os.environ.get(key)) for key in keys); seen['cwd'] = os.getcwd(); "
    "open(os.path.join(out, 'seen.json'), 'w').write(json.dumps(seen))"
)


def engine_service(root: Path, engine: str | None, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A local service whose PATH has the fake `engine` first (None: no engine at all)."""
    path = without_engines()
    if engine is not None:
        bin_dir = root / "bin"
        fake_engine(bin_dir, engine)
        path = os.pathsep.join([str(bin_dir), path])
    monkeypatch.setenv("PATH", path)
    monkeypatch.setenv("FAKE_ENGINE_LOG", str(root / "engine.jsonl"))
    return start_service(root)


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalService]:
    service = engine_service(tmp_path, "docker", monkeypatch)
    try:
        yield service
    finally:
        stop_service(service)


def seen_task(task_id: str = "seen") -> dict[str, Any]:
    task = command(task_id, ["python", "-c", SEEN, "{out}"])
    task["settings"]["image"] = "python:3.12-slim"
    return task


def test_a_command_task_runs_in_its_image_with_docker(docker: LocalService) -> None:
    run = docker.submit({"name": "d", "tasks": [seen_task()]}, local_commands="docker")
    end = docker.wait(run["id"])
    assert end["state"] == "succeeded", end
    assert docker.client.get(f"/runs/{run['id']}").json()["local_commands"] == "docker"

    [call] = calls(docker.root)
    argv = call["argv"]
    assert Path(argv[0]).name == "docker" and argv[1:3] == ["run", "--rm"]
    name = argv[argv.index("--name") + 1]
    assert name == f"simrun-{run['id']}-seen-seen-0"
    assert argv[argv.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    store = docker.store.absolute()
    task_dir = store / "runs" / run["id"] / "tasks" / "seen"
    scratch = docker.root / ".simrun" / "scratch" / run["id"] / "seen" / "seen-0"
    volumes = [argv[i + 1] for i, part in enumerate(argv) if part == "--volume"]
    assert volumes == [f"{store}:{store}", f"{scratch.absolute()}:{scratch.absolute()}"]
    assert argv[argv.index("--workdir") + 1] == str(task_dir)
    env = dict(argv[i + 1].split("=", 1) for i, part in enumerate(argv) if part == "--env")
    assert env["SIMRUN_TASK_DIR"] == str(task_dir) and env["SIMRUN_RUN"] == run["id"]
    assert env["OMP_NUM_THREADS"] == "1"
    image = argv.index("python:3.12-slim")
    assert argv[image + 1 : image + 3] == ["python", "-c"]
    assert argv[-1] == str(task_dir / "out"), "the argv expanded as when it runs directly"

    seen = json.loads((task_dir / "out" / "seen.json").read_text())
    assert seen["SIMRUN_TASK_DIR"] == str(task_dir) and seen["SIMRUN_WORKER"] == "seen"
    assert seen["FAKE_IMAGE"] == "python:3.12-slim" and seen["cwd"] == str(task_dir)
    assert seen["SIMRUN_SCRATCH"] == str(scratch.absolute())


def test_without_docker_a_run_runs_its_commands_directly(docker: LocalService) -> None:
    run = docker.submit({"name": "d", "tasks": [seen_task()]})
    assert docker.wait(run["id"])["state"] == "succeeded"
    assert docker.client.get(f"/runs/{run['id']}").json()["local_commands"] is None
    assert calls(docker.root) == [], "no engine ran"


def test_a_cancel_kills_the_container(docker: LocalService) -> None:
    sleeper = command("sleep", ["python", "-c", "import time; time.sleep(600)"])
    run = docker.submit({"name": "c", "tasks": [sleeper]}, local_commands="docker")
    wait_until(lambda: calls(docker.root), what="the container to start")
    assert docker.client.post(f"/runs/{run['id']}/cancel").status_code == 200
    assert docker.wait(run["id"])["state"] == "cancelled"
    kills = [call["argv"][1:] for call in calls(docker.root) if call["argv"][1] == "kill"]
    name = f"simrun-{run['id']}-sleep-sleep-0"
    assert ["kill", "--signal", "TERM", name] in kills


def test_podman_runs_the_commands_where_docker_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = engine_service(tmp_path, "podman", monkeypatch)
    try:
        run = service.submit({"name": "p", "tasks": [seen_task()]}, local_commands="docker")
        assert service.wait(run["id"])["state"] == "succeeded"
    finally:
        stop_service(service)
    [call] = calls(tmp_path)
    assert Path(call["argv"][0]).name == "podman" and "--userns=keep-id" in call["argv"]


def test_docker_is_refused_where_no_engine_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = engine_service(tmp_path, None, monkeypatch)
    assert shutil.which("docker") is None and shutil.which("podman") is None
    try:
        body = {"workflow": {"name": "n", "tasks": [seen_task()]}, "local_commands": "docker"}
        refused = service.client.post("/runs", json=body)
        assert refused.status_code == 422, refused.text
        [error] = refused.json()["errors"]
        assert error.startswith("local_commands: neither docker nor podman is installed")
        estimate = service.client.post("/estimate", json=body)
        assert estimate.status_code == 422 and estimate.json()["errors"] == [error]
        assert service.client.get("/runs").json() == [], "nothing recorded"
        direct = service.submit({"name": "n", "tasks": [seen_task()]}, local_commands="direct")
        assert service.wait(direct["id"])["state"] == "succeeded"
    finally:
        stop_service(service)


GPUS_SEEN = (
    "import json, os, sys; out = sys.argv[1]; os.makedirs(out, exist_ok=True); "
    "seen = dict((key, os.environ.get(key)) for key in "
    "['CUDA_VISIBLE_DEVICES', 'NVIDIA_VISIBLE_DEVICES']); "
    "open(os.path.join(out, 'gpus.json'), 'w').write(json.dumps(seen))"
)


def test_a_container_gets_the_gpus_of_its_task_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    service = engine_service(tmp_path, "docker", monkeypatch)
    tasks = []
    for task_id, gpus in (("pair", 2), ("none", 0)):
        task = command(task_id, ["python", "-c", GPUS_SEEN, "{out}"])
        task["settings"] |= {"image": "cuda:12", "gpus": gpus}
        tasks.append(task)
    try:
        run = service.submit({"name": "g", "tasks": tasks}, local_commands="docker")
        assert service.wait(run["id"])["state"] == "succeeded"
        view = service.client.get(f"/runs/{run['id']}").json()
    finally:
        stop_service(service)
    argvs = {}
    for call in calls(tmp_path):
        argv = call["argv"]
        argvs[argv[argv.index("--name") + 1].split("-")[-3]] = argv
    pair, none = argvs["pair"], argvs["none"]
    assert pair[pair.index("--gpus") + 1] == '"device=3,5"', "docker reads the value as CSV"
    assert "--gpus" not in none and "--device" not in none, "a task without GPUs gets none"
    out = service.run_dir(run["id"]) / "tasks"
    inside = {task: json.loads((out / task / "out" / "gpus.json").read_text()) for task in argvs}
    assert inside["pair"] == {"CUDA_VISIBLE_DEVICES": "0,1", "NVIDIA_VISIBLE_DEVICES": None}, (
        "the container numbers the GPUs it was given from 0"
    )
    assert inside["none"] == {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
    assert [pod["gpus"] for pod in view["tasks"]["pair"]["pods"]] == [["3", "5"]]
    assert [pod["gpus"] for pod in view["tasks"]["none"]["pods"]] == [[]]


def test_podman_gets_the_gpus_as_cdi_devices() -> None:
    from simrun_api.backends.containers import container_argv

    def argv(engine: str, gpus: list[str] | None) -> list[str]:
        where = Path("/store")
        return container_argv(
            engine,
            name="n",
            image="cuda:12",
            args=["train"],
            store=where,
            scratch=where,
            workdir=where,
            env={},
            gpus=gpus,
        )

    pair = argv("/usr/bin/podman", ["3", "GPU-5a"])
    devices = [pair[i + 1] for i, part in enumerate(pair) if part == "--device"]
    assert devices == ["nvidia.com/gpu=3", "nvidia.com/gpu=GPU-5a"] and "--gpus" not in pair
    assert "CUDA_VISIBLE_DEVICES=0,1" in pair
    assert argv("/usr/bin/docker", ["7"])[-6:] == [
        *("--gpus", '"device=7"', "--env", "CUDA_VISIBLE_DEVICES=0", "cuda:12", "train")
    ]
    without = argv("/usr/bin/podman", None)
    assert not any("GPU" in part or "gpu" in part for part in without), "no GPUs on the machine"


def test_a_backend_without_local_commands_refuses_them() -> None:
    from simrun_api.submission import checked_tasks
    from simrun_core.plugins import load_task_types
    from simrun_core.wire import SubmitRequest
    from simrun_core.workflow import decode_workflow

    workflow, _ = decode_workflow({"name": "n", "tasks": [seen_task()]})
    assert workflow is not None
    types = load_task_types()
    for value in ("docker", "direct"):
        request = SubmitRequest(workflow=workflow, local_commands=value)  # type: ignore[arg-type]
        _, problems = checked_tasks(request, types, "argo", True)
        assert [problem.text() for problem in problems] == [
            f"local_commands: {value!r} is for the local service: the argo backend runs every "
            "command task in its image"
        ]
    found = checked_tasks(
        SubmitRequest(workflow=workflow, local_commands="docker"),
        types,
        "local",
        False,
        local_commands=True,
        engine="/usr/bin/docker",
    )
    assert found[1] == []
