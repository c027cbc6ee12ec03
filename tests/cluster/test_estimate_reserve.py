"""`simrun estimate --reserve NODE` plans a workflow on the reserved node alone, as
`simrun submit --reserve NODE` would, against a service on the fake cluster (which has
reservations); a node that does not exist is refused the same way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from fake.cluster import FakeCluster, NodeSpec
from service_process import HARNESS_ENV, ServiceProcess, serving

NODES = [NodeSpec("node-1", cores=3, memory_gb=6.0), NodeSpec("node-2", cores=9, memory_gb=16.0)]


def estimate(service: ServiceProcess, workflow: Path, *args: str) -> subprocess.CompletedProcess:
    """`simrun estimate WORKFLOW --json ARGS` against the service."""
    return subprocess.run(
        [sys.executable, "-m", "simrun_cli", "estimate", str(workflow), "--json", *args],
        cwd=service.root,
        env=service.env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def plan_of(done: subprocess.CompletedProcess) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    plan: dict[str, Any] = json.loads(done.stdout)["squares"]["plan"]
    return plan


def test_an_estimate_with_a_reservation_plans_on_that_node_alone(tmp_path: Path) -> None:
    with (
        FakeCluster(tmp_path, nodes=NODES, env_overrides=HARNESS_ENV) as cluster,
        serving(cluster, tmp_path / "service") as service,
    ):
        workflow = service.root / "squares.yaml"
        task = {"id": "squares", "type": "demo.squares", "settings": {"n": 400, "sleep_s": 0.01}}
        workflow.write_text(yaml.safe_dump({"name": "squares", "tasks": [task]}))
        spread = plan_of(estimate(service, workflow))
        small = plan_of(estimate(service, workflow, "--reserve", "node-1"))
        large = plan_of(estimate(service, workflow, "--reserve", "node-2"))
        nowhere = estimate(service, workflow, "--reserve", "nowhere")
        assert cluster.errors == []
    assert spread["pods"] > 1, spread  # both nodes
    assert small["pods"] == 1 and large["pods"] == 1, (small, large)
    assert small["shape"]["cores"] < large["shape"]["cores"] <= 9, (small, large)
    assert nowhere.returncode == 1, nowhere.stdout
    assert "reserve: node 'nowhere' to reserve does not exist (nodes: node-1, node-2)" in (
        nowhere.stderr
    )
