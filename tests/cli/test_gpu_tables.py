"""The GPUs in the tables of the command line: `estimate` shows the GPUs of a pod, `status` the
GPUs each pod was given, both only when some task has GPUs; end to end, through `simrun` and the
local service it starts with `CUDA_VISIBLE_DEVICES=3,5`, a worker's report records its GPU."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace

import msgspec
import yaml
from cli_helpers import cli_env, plan, run_simrun
from rich.console import Console, RenderableType

from simrun_cli.render import estimate_table, pods_table
from simrun_core.resources import ResolvedResources
from simrun_core.wire import PodView, RunView, TaskEstimate


def lines(renderable: RenderableType) -> list[str]:
    console = Console(file=io.StringIO(), width=100, color_system=None, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def estimate(gpus: int) -> TaskEstimate:
    planned = plan("train", None)
    shape = msgspec.structs.replace(planned.shape, gpus=gpus)
    return TaskEstimate(
        resources=ResolvedResources(memory_base_gb=0, memory_per_worker_gb=1, gpus=gpus),
        plan=msgspec.structs.replace(planned, shape=shape),
        seconds=None,
    )


def test_estimate_shows_the_gpus_of_a_pod_when_a_task_has_some() -> None:
    table = lines(estimate_table({"train": estimate(2), "plot": estimate(0)}))
    assert "GPUs/pod" in table[0]
    train = next(line for line in table if "train" in line).split()
    plot = next(line for line in table if "plot" in line).split()
    assert (train[5], plot[5]) == ("2", "0"), table
    assert "GPUs" not in "\n".join(lines(estimate_table({"plot": estimate(0)})))


def pod(worker: str, gpus: list[str] | None) -> PodView:
    return PodView(
        worker=worker,
        attempt=0,
        state="running",
        node="here",
        exit_code=None,
        oom=False,
        oom_kills=[],
        peak_memory_gb=None,
        processes=1,
        units_done=0,
        gpus=gpus,
    )


def run_of(*pods: PodView) -> RunView:
    """A run of one task `train` with `pods`: what the pods table reads of a run."""
    return SimpleNamespace(tasks={"train": SimpleNamespace(pods=list(pods))})  # type: ignore[return-value]


def test_status_shows_the_gpus_each_pod_was_given() -> None:
    table = lines(pods_table(run_of(pod("w0", ["3"]), pod("w1", []))))
    assert "GPUs" in table[0]
    assert any(line.split()[:2] == ["train", "w0"] and " 3 " in line for line in table), table
    without = lines(pods_table(run_of(pod("w0", None))))
    assert "GPUs" not in "\n".join(without)


def row(output: str, task: str) -> list[str]:
    """The cells of the row of `task` in a table printed by `simrun` (its first line)."""
    return next(line for line in output.splitlines() if line.split()[:1] == [task]).split()


def test_estimate_and_status_show_the_gpus_of_a_local_run(project: Path) -> None:
    show = "import os; print('devices=' + os.environ['CUDA_VISIBLE_DEVICES'])"
    tasks = [
        {
            "id": "train",
            "type": "command",
            "settings": {
                "image": "none",
                "args": ["python", "-c", show],
                "cores": 1,
                "memory_gb": 0.5,
                "gpus": 2,
            },
        },
        {"id": "squares", "type": "demo.squares", "settings": {"n": 2}, "resources": {"gpus": 1}},
    ]
    (project / "gpus.yaml").write_text(yaml.safe_dump({"name": "gpus", "tasks": tasks}))
    env = cli_env(CUDA_VISIBLE_DEVICES="3,5", COLUMNS="160")

    estimate = run_simrun("estimate", "gpus.yaml", "--local", cwd=project, env=env)
    assert estimate.returncode == 0, estimate.stderr
    header = next(line for line in estimate.stdout.splitlines() if "GPUs/pod" in line)
    column = header.split().index("GPUs/pod")
    assert row(estimate.stdout, "train")[column] == "2", estimate.stdout
    assert row(estimate.stdout, "squares")[column] == "1", estimate.stdout

    submitted = run_simrun("submit", "gpus.yaml", "--local", "--json", cwd=project, env=env)
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["id"]
    waited = run_simrun("wait", run_id, "--local", cwd=project, env=env)
    assert waited.returncode == 0, waited.stdout + waited.stderr

    status = run_simrun("status", run_id, "--local", cwd=project, env=env)
    assert status.returncode == 0, status.stderr
    header = next(line for line in status.stdout.splitlines() if "GPUs" in line.split())
    column = header.split().index("GPUs")
    pods = status.stdout[status.stdout.index(header) :]
    assert row(pods, "train")[column] == "3,5", status.stdout
    [squares_gpu] = row(pods, "squares")[column].split(",")
    assert squares_gpu in ("3", "5"), status.stdout
    logs = run_simrun("logs", run_id, "train", "--local", cwd=project, env=env)
    assert "devices=3,5" in logs.stdout, logs.stdout

    history = run_simrun("history", run_id, "--local", "--json", cwd=project, env=env)
    reports = [e for e in json.loads(history.stdout) if e["type"] == "worker-report"]
    assert [(e["task"], e["gpus"]) for e in reports] == [("squares", [squares_gpu])]
