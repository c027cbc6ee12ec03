"""The benchmarks keep working: `benchmarks/run --size smoke` runs each of them at a tiny size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks.main import BENCHMARKS

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "run"


def test_every_benchmark_runs_at_a_tiny_size_and_writes_its_table(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    done = subprocess.run(
        [sys.executable, str(RUN), "--size", "smoke", "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = results.read_text()
    assert "## Machine" in text and "- cores:" in text and "- commit:" in text
    for name in BENCHMARKS:
        assert f"| {name}: " in text, f"no figure of {name} in the table:\n{text}"
    assert "failed: none" in done.stdout
