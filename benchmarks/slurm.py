"""slurm: what the Slurm backend costs beside Slurm itself, on a real Slurm started here.

The benchmark starts its own cluster with the tests' fixture (`tests/slurm/slurm_cluster.py`,
imported by path: munged, slurmctld and three `slurmd -N` of 2 CPUs and 2,000 MB, simrun's six
partitions) and a `simrun serve` with `backend: slurm` on it (the `slurm:` block's defaults but
the scratch and a `grace_s` of the cluster's `KillWait`, 5 s), whose `PATH` starts with a
directory of counting wrappers of `sbatch`, `squeue`, `scontrol` and `scancel` (each appends
its name to a file, then execs the real command). Then:

- **first unit**: from the POST of a squares run (3 units, one job) on idle nodes to its first
  `unit-started` (the harness's event log), against Slurm's own latency: from a bare
  `sbatch --wrap` of `date +%s.%N` to the time that job wrote. Interleaved, idle in between.
  Its units are as long as those of the units row: the squares task has one key of learned
  resources whatever its settings, and units of 0 s learned there would plan the units row's
  200 units as one job (0.2 s of work).
- **units**: the wall of a squares run of 200 units of 0.05 s over the three nodes (POST to
  the end of `GET /runs/{run}/wait`), against the same units as a user would hand-write them
  for three idle nodes (`baselines/slurm_units.py`): one batch job a node with all its CPUs and
  a pool of as many processes, every job a third of the units, merged by the submitter once
  every job wrote its marker (polled every 10 ms: a baseline with no poll interval of its own).
  The baseline does not copy simrun's plan, so a plan that uses fewer nodes shows in the ratio.
- **polls**: the Slurm client calls of the service per poll interval (`poll_s`) over a window
  of intervals with 100 live runs (one `sleep` job each: six run, the others wait in the queue),
  against the same with one live run.

The machine is shared: Slurm's daemons, the jobs and the service share its cores.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import yaml

from benchmarks.baselines.by_hand import task_paths
from benchmarks.common import ROOT, Context, Row, interleaved, median
from benchmarks.service import BenchService, ServiceFailed, environment, stop_service
from simrun_core.task_types.demo import SquaresSettings, merge, setup

CLUSTER_MODULE = ROOT / "tests" / "slurm" / "slurm_cluster.py"
WAIT_MODULE = ROOT / "tests" / "wait_helpers.py"
HAND_WRITTEN = Path(__file__).resolve().parent / "baselines" / "slurm_units.py"
CLIENT_COMMANDS = ("sbatch", "squeue", "scontrol", "scancel")
FIRST_UNIT_GOAL_S = 1.5
UNITS_GOAL = 1.1
START_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 300.0
PARTITION = "simrun-owner-base"
"""The partition of the baselines' jobs: the base partition of the owner's runs."""
HAND_MEMORY_MB = 1024
"""The memory a hand-written job asks: what its units need with room (simrun's pods of the
squares task ask 1 GiB here)."""


@dataclasses.dataclass(frozen=True)
class SlurmSize:
    """How big the benchmark runs: repetitions, the squares run, the live runs, the window."""

    reps: int
    units: int
    sleep_s: float
    live_runs: int
    window_polls: int
    poll_s: float


SIZES = {
    "full": SlurmSize(reps=5, units=200, sleep_s=0.05, live_runs=100, window_polls=10, poll_s=2.0),
    "smoke": SlurmSize(reps=1, units=6, sleep_s=0.01, live_runs=3, window_polls=2, poll_s=0.5),
}


def load_test_module(name: str, path: Path) -> ModuleType:
    """A module of the tests, imported by its path as `name` (once)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def slurm_cluster() -> ModuleType:
    """The tests' Slurm fixture, imported by its path (after the wait helper it imports)."""
    load_test_module("wait_helpers", WAIT_MODULE)
    return load_test_module("bench_slurm_cluster", CLUSTER_MODULE)


def counting_wrappers(directory: Path, counts: Path) -> Path:
    """A directory of `sbatch`, `squeue`, `scontrol` and `scancel` that each append their name
    to `counts` and exec the real command."""
    directory.mkdir(parents=True)
    for name in CLIENT_COMMANDS:
        real = shutil.which(name)
        if real is None:
            raise FileNotFoundError(f"{name} is not on PATH")
        wrapper = directory / name
        wrapper.write_text(f'#!/bin/sh\necho {name} >> "{counts}"\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    return directory


def calls(counts: Path) -> Counter[str]:
    """The client calls the wrappers counted so far, by command."""
    try:
        return Counter(counts.read_text().split())
    except FileNotFoundError:
        return Counter()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_slurm_service(root: Path, cluster: Any, wrappers: Path, poll_s: float) -> BenchService:
    """`simrun serve` with `backend: slurm` on `cluster`, the wrappers first on its PATH."""
    root.mkdir(parents=True)
    (root / "tokens.yaml").write_text(yaml.safe_dump({"t-mk": {"name": "mk", "kind": "person"}}))
    (root / "tokens.yaml").chmod(0o600)
    settings = {
        "store": "store",
        "db": "db/simrun.sqlite",
        "tokens": "tokens.yaml",
        "owner": "mk",
        "backend": "slurm",
        # the grace within the KillWait of the tests' cluster, which the service checks
        "slurm": {"poll_s": poll_s, "grace_s": 5, "scratch_path": str(root / "scratch")},
    }
    (root / "settings.yaml").write_text(yaml.safe_dump(settings))
    port = free_port()
    env = {
        **environment(),
        "SIMRUN_CONFIG": str(root / "settings.yaml"),
        "SLURM_CONF": str(cluster.conf),
        "PATH": f"{wrappers}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    with open(root / "service-bench.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "simrun_cli", "serve", "--port", str(port)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    client = httpx.Client(
        base_url=url, headers={"Authorization": "Bearer t-mk"}, timeout=120.0, trust_env=False
    )
    service = BenchService(root=root, process=process, info={"url": url}, client=client)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise ServiceFailed(f"the Slurm service exited: {service.log_tail()}")
        try:
            if client.get("/me").status_code == 200:
                return service
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            stop_service(service)
            raise ServiceFailed(f"the Slurm service did not answer: {service.log_tail()}")
        time.sleep(0.05)


def squares(units: int, sleep_s: float) -> dict[str, Any]:
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": units, "sleep_s": sleep_s}}
    return {"name": "squares", "tasks": [task]}


def sleeper() -> dict[str, Any]:
    """A run that stays live: one `command` job of one CPU that sleeps an hour."""
    settings = {"image": "none", "args": ["sleep", "3600"], "cores": 1, "memory_gb": 0.25}
    return {"name": "live", "tasks": [{"id": "sleep", "type": "command", "settings": settings}]}


def run_dir(service: BenchService, run_id: str) -> Path:
    return service.root / "store" / "runs" / run_id


def succeeded(service: BenchService, run_id: str) -> None:
    """Wait for a run's end; ServiceFailed unless it succeeded."""
    end = service.wait(run_id, timeout=RUN_TIMEOUT_S)
    if end["state"] != "succeeded":
        raise ServiceFailed(f"run {run_id} {end['state']}: {end.get('message')}")


def first_unit_started(directory: Path) -> float:
    """The time (epoch seconds) of the first `unit-started` of a run's squares task."""
    times = []
    for log in (directory / "tasks" / "squares" / "events").glob("*.jsonl"):
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("type") == "unit-started":
                times.append(datetime.fromisoformat(event["time"]).timestamp())
    if not times:
        raise ServiceFailed(f"no unit-started in {directory}")
    return min(times)


def plan_of(directory: Path) -> dict[str, Any]:
    """The plan of the squares task, from the run's `submitted` event."""
    with (directory / "events.jsonl").open() as log:
        submitted = json.loads(log.readline())
    return dict(submitted["plans"]["squares"])


def wait_for(condition: Any, what: str, timeout: float = RUN_TIMEOUT_S, every: float = 0.01) -> Any:
    """The tests' `wait_until` with the benchmark's deadline, every 10 ms unless told (the
    start of a bare job is timed by it)."""
    return load_test_module("wait_helpers", WAIT_MODULE).wait_until(condition, timeout, what, every)


def idle(cluster: Any) -> None:
    """Until Slurm's queue holds no pending or running job and every node is idle."""
    wait_for(lambda: not cluster.queue(), "empty queue", every=0.1)
    cluster.wait_idle()


def run(ctx: Context) -> list[Row]:
    """Start a Slurm cluster and a service on it, measure, stop both; the rows."""
    size = SIZES[ctx.size.name]
    fixture = slurm_cluster()
    try:
        fixture.check_installed()
    except fixture.SlurmMissing as missing:
        ctx.log(f"skipped: {missing}")
        return [
            Row(
                key=f"slurm.{key}",
                benchmark=f"slurm: {key}",
                simrun=None,
                baseline=None,
                unit="s",
                goal=f"skipped: {missing}",
            )
            for key in ("first_unit", "units", "polls")
        ]
    ctx.log("starting a Slurm cluster of three nodes")
    cluster = fixture.start_slurm_cluster(ctx.scratch / "slurm", gpus=0)
    service = None
    try:
        counts = ctx.scratch / "calls"
        wrappers = counting_wrappers(ctx.scratch / "bin", counts)
        service = start_slurm_service(ctx.scratch / "service", cluster, wrappers, size.poll_s)
        rows = measure(ctx, size, cluster, service, counts)
    finally:
        if service is not None:
            stop_service(service)
        cluster.stop()
    return rows


def measure(
    ctx: Context, size: SlurmSize, cluster: Any, service: BenchService, counts: Path
) -> list[Row]:
    scratch = ctx.scratch

    def simrun_first_unit(rep: int) -> float:
        idle(cluster)
        began = time.time()
        run_id = service.submit(squares(3, size.sleep_s))["id"]
        succeeded(service, run_id)
        return first_unit_started(run_dir(service, run_id)) - began

    def bare_sbatch(rep: int) -> float:
        idle(cluster)
        stamp = scratch / f"bare-{rep}-{time.monotonic_ns()}"
        began = time.time()
        cluster.run(
            "sbatch",
            "--parsable",
            f"--partition={PARTITION}",
            "--cpus-per-task=1",
            "--mem=100",
            "--output=/dev/null",
            f"--wrap=date +%s.%N > {stamp}.tmp && mv {stamp}.tmp {stamp}",
        )
        wait_for(stamp.exists, "start of the bare job")
        return float(stamp.read_text()) - began

    ctx.log("warm-up")
    simrun_first_unit(-1)
    bare_sbatch(-1)
    ctx.log(f"first unit: {size.reps} reps")
    ours_first, slurm_first = interleaved(size.reps, simrun_first_unit, bare_sbatch)

    plans: list[dict[str, Any]] = []

    def simrun_units(rep: int) -> float:
        idle(cluster)
        began = time.perf_counter()
        run_id = service.submit(squares(size.units, size.sleep_s))["id"]
        succeeded(service, run_id)
        wall = time.perf_counter() - began
        summary = json.loads(
            (run_dir(service, run_id) / "tasks/squares/out/summary.json").read_text()
        )
        if summary["sum"] != sum(i * i for i in range(size.units)):
            raise ServiceFailed(f"run {run_id} summed {summary}")
        plans.append(plan_of(run_dir(service, run_id)))
        return wall

    def hand_written(rep: int) -> float:
        idle(cluster)
        return hand_written_units(cluster, scratch / f"hand-{rep}", size)

    ctx.log(f"units: {size.reps} reps of {size.units} x {size.sleep_s:g} s")
    ours_units, hand_units = interleaved(size.reps, simrun_units, hand_written)
    planned = ", ".join(
        f"{p['pods']}x{p['shape']['cores']} CPUs/{p['shape']['processes']} processes" for p in plans
    )

    ctx.log("polls: one live run")
    idle(cluster)
    window_s = size.window_polls * size.poll_s
    first = service.submit(sleeper())["id"]
    wait_for(lambda: any(j["state"] == "RUNNING" for j in cluster.queue()), "the live run's job")
    one = window(counts, window_s)
    ctx.log(f"polls: {size.live_runs} live runs")
    live = [first] + [service.submit(sleeper())["id"] for _ in range(size.live_runs - 1)]
    wait_for(lambda: len(cluster.queue()) >= size.live_runs, "every live run's job", every=0.2)
    states = {service.client.get(f"/runs/{r}").json()["state"] for r in live}
    many = window(counts, window_s)
    states |= {service.client.get(f"/runs/{r}").json()["state"] for r in live}
    if states - {"queued", "running", "submitted"}:
        raise ServiceFailed(f"the live runs are not all live: {states}")

    first_gap = median(ours_first) - median(slurm_first)
    units_ratio = median(ours_units) / median(hand_units)
    intervals = window_s / size.poll_s
    per_interval_many = sum(many.values()) / intervals
    per_interval_one = sum(one.values()) / intervals
    ctx.log(
        f"first unit {median(ours_first):.2f} s (bare sbatch {median(slurm_first):.2f} s); "
        f"units {median(ours_units):.2f} s (hand-written {median(hand_units):.2f} s); calls "
        f"per interval {per_interval_many:.2f} with {size.live_runs} runs ({dict(many)}), "
        f"{per_interval_one:.2f} with one ({dict(one)})"
    )
    return [
        Row(
            key="slurm.first_unit",
            benchmark="slurm: submission to first unit on idle nodes, against a bare sbatch",
            simrun=median(ours_first),
            baseline=median(slurm_first),
            unit="s",
            goal=f"<= baseline + {FIRST_UNIT_GOAL_S:g} s",
            met=first_gap <= FIRST_UNIT_GOAL_S,
            note=(
                "from the POST of a squares run of 3 units (one job, simrun-owner-base) to the "
                "time of its first `unit-started`; baseline: from a bare `sbatch --wrap` of "
                "`date +%s.%N` (same partition) to the time it wrote; idle nodes before each, "
                f"interleaved; simrun - baseline = {first_gap:.2f} s (each rep: simrun "
                f"{_each(ours_first)}; sbatch {_each(slurm_first)})"
            ),
        ),
        Row(
            key="slurm.units",
            benchmark=(
                f"slurm: {size.units} units x {size.sleep_s:g} s on three idle nodes, against "
                "hand-written batch jobs"
            ),
            simrun=median(ours_units),
            baseline=median(hand_units),
            unit="s",
            goal=f"<= {UNITS_GOAL:g}x",
            met=units_ratio <= UNITS_GOAL,
            note=(
                "wall of a squares run from its POST to the end of `/wait`; simrun planned, "
                f"rep by rep (0.05 s units learned from the first-unit row's runs): {planned}; "
                "baseline: "
                f"one hand-written job a node ({len(cluster.nodes)} jobs of "
                f"{cluster.cpus_per_node} CPUs, a pool of as many processes, "
                "`baselines/slurm_units.py`), each a share of the units, merged by the "
                "submitter as soon as every job's marker exists (polled every 10 ms); "
                f"`poll_s` {size.poll_s:g} s; each rep: simrun "
                f"{_each(ours_units)}; hand-written {_each(hand_units)}"
            ),
        ),
        Row(
            key="slurm.polls",
            benchmark=f"slurm: Slurm client calls per poll interval, {size.live_runs} live runs",
            simrun=per_interval_many,
            baseline=per_interval_one,
            unit="calls",
            goal="<= 1 per interval",
            met=sum(many.values()) <= intervals,
            note=(
                f"the calls of the service's counting wrappers over {size.window_polls} "
                f"intervals of `poll_s` {size.poll_s:g} s once {size.live_runs} runs were live "
                f"(six jobs running, the rest queued): {dict(many) or 'none'}; baseline: the "
                f"same with one live run: {dict(one) or 'none'}"
            ),
        ),
    ]


def window(counts: Path, seconds: float) -> Counter[str]:
    """The client calls counted during the next `seconds`."""
    before = calls(counts)
    time.sleep(seconds)
    return calls(counts) - before


def hand_written_units(cluster: Any, out: Path, size: SlurmSize) -> float:
    """The wall of the units as a user would write them for the cluster's idle nodes: one batch
    job a node with all its CPUs and a pool of as many processes, each a share of the units,
    merged by the submitter."""
    parts = len(cluster.nodes)
    cores = processes = int(cluster.cpus_per_node)
    out.mkdir(parents=True)
    settings = SquaresSettings(n=size.units, sleep_s=size.sleep_s)
    paths = task_paths(out, "squares")
    began = time.perf_counter()
    setup(settings, paths)
    for part in range(parts):
        command = [
            sys.executable,
            str(HAND_WRITTEN),
            str(out),
            str(size.units),
            str(size.sleep_s),
            str(processes),
            str(part),
            str(parts),
        ]
        cluster.run(
            "sbatch",
            "--parsable",
            f"--partition={PARTITION}",
            "--nodes=1",
            f"--cpus-per-task={cores}",
            f"--mem={HAND_MEMORY_MB}",
            f"--output={out}/part-{part}.log",
            f"--chdir={out}",
            "--wrap=" + " ".join(command),
        )
    wait_for(lambda: all((out / f"done-{p}").exists() for p in range(parts)), "the jobs' markers")
    merge(settings, paths)
    wall = time.perf_counter() - began
    summary = json.loads((paths.out / "summary.json").read_text())
    if summary["sum"] != sum(i * i for i in range(size.units)):
        raise ServiceFailed(f"the hand-written jobs summed {summary}")
    return wall


def _each(seconds: list[float]) -> str:
    """The seconds of each rep, as a note lists them."""
    return ", ".join(f"{value:.2f}" for value in seconds)
