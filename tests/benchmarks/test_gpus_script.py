"""benchmarks/gpus.py, for machines with an NVIDIA GPU, refuses cleanly on one without."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_without_a_gpu_it_says_so_and_exits_2(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}
    env["PATH"] = os.pathsep.join(
        part
        for part in env.get("PATH", "").split(os.pathsep)
        if part and not Path(part, "nvidia-smi").exists()
    )
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpus"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done
    assert done.stderr.startswith("gpus: no NVIDIA GPU here"), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
