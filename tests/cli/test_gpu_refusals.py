"""A machine without GPUs (no `CUDA_VISIBLE_DEVICES`, no `nvidia-smi`): a task asking for one is
refused by `simrun validate --local` and `simrun submit --local`, naming the GPUs; no run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml
from cli_helpers import cli_env, run_simrun


def without_gpus(tmp: Path) -> dict[str, str]:
    """The environment of a command (and of the local service it starts) on a machine without
    GPUs: no `CUDA_VISIBLE_DEVICES`, and a PATH without `nvidia-smi`."""
    env = cli_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    kept = [
        part
        for part in env.get("PATH", os.defpath).split(os.pathsep)
        if part and not Path(part, "nvidia-smi").exists()
    ]
    env["PATH"] = os.pathsep.join(kept)
    assert shutil.which("nvidia-smi", path=env["PATH"]) is None
    return env


def test_a_gpu_task_is_refused_without_gpus_and_no_run_is_created(project: Path) -> None:
    task = {
        "id": "train",
        "type": "command",
        "settings": {"image": "none", "args": ["true"], "cores": 1, "memory_gb": 0.5, "gpus": 1},
    }
    (project / "gpu.yaml").write_text(yaml.safe_dump({"name": "gpu", "tasks": [task]}))
    env = without_gpus(project)
    expected = (
        "gpu.yaml: task 'train': settings.gpus: a pod of 1 GPU fits on no node: "
        "the most a node has is 0 GPUs"
    )
    checked = run_simrun("validate", "--local", "gpu.yaml", cwd=project, env=env)
    assert checked.returncode == 1, checked
    assert expected in checked.stderr, checked.stderr
    submitted = run_simrun("submit", "--local", "gpu.yaml", cwd=project, env=env)
    assert submitted.returncode == 1, submitted
    assert expected in submitted.stderr, submitted.stderr
    for result in (checked, submitted):
        assert "Traceback" not in result.stdout + result.stderr
    runs = project / ".simrun" / "store" / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "no run is created"
