"""Record the decider's golden cases: real runs of the local service with the messages its
actors decided on (`SIMRUN_RECORD_MESSAGES=1`) beside the events they produced.

Run `python tests/golden/decider/record.py [CASE ...]` from the repository to write them (or
only the cases named) anew: only when a decision changes on purpose, and only the cases it
changes, since the cases in git are old runs that must be decided alike forever.
Each case leaves `<case>/events.jsonl` and `<case>/messages.jsonl`; a case whose messages do not
replay to its events (a kill between an append and the recording of its message) is recorded
again.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from live_service import (  # noqa: E402
    command,
    python,
    run_processes,
    start_service,
    stop_service,
    wait_until,
)
from replay import replay_problems  # noqa: E402
from unit_events import done_indices, unit_indices  # noqa: E402


def squares(n: int, **settings: object) -> dict:
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": n, **settings}}
    return {"name": "golden", "tasks": [task]}


def keep(name: str, root: Path, run_id: str) -> bool:
    """Copy a run's log and messages into the case `name`; whether they replay."""
    run_dir = root / ".simrun/store/runs" / run_id
    target = HERE / name
    target.mkdir(exist_ok=True)
    shutil.copyfile(run_dir / "events.jsonl", target / "events.jsonl")
    shutil.copyfile(run_dir / "messages.jsonl", target / "messages.jsonl")
    problems = replay_problems(target)
    print(f"{name}: {'replays' if not problems else problems[:3]}")
    return not problems


def record(name: str, scenario) -> None:
    if sys.argv[1:] and name not in sys.argv[1:]:
        return
    for _ in range(5):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            run_id = scenario(root)
            if keep(name, root, run_id):
                return
    raise SystemExit(f"{name}: no recording replays")


def one_run(workflow: dict, during=None):
    def scenario(root: Path) -> str:
        service = start_service(root)
        try:
            run = service.submit(workflow)
            if during is not None:
                during(service, run["id"])
            service.wait(run["id"], timeout=120)
            return run["id"]
        finally:
            stop_service(service)

    return scenario


def cancel(service, run_id: str) -> None:
    wait_until(lambda: run_processes(run_id), what="the process")
    service.client.post(f"/runs/{run_id}/cancel")


def kill_a_worker(service, run_id: str) -> None:
    wait_until(lambda: len(unit_indices(service.events(run_id))) >= 3)
    for pid in run_processes(run_id):
        os.kill(pid, signal.SIGKILL)


def service_killed(root: Path) -> str:
    service = start_service(root)
    try:
        run = service.submit(squares(40, sleep_s=0.05))
        wait_until(lambda: len(unit_indices(service.events(run["id"]))) >= 3)
        os.kill(service.process.pid, signal.SIGKILL)
        service.process.wait()
    finally:
        stop_service(service)
    service = start_service(root)
    try:
        service.wait(run["id"], timeout=120)
        return run["id"]
    finally:
        stop_service(service)


def workflow_deleted_mid_run(root: Path) -> str:
    """A run on the fake cluster (the Argo backend) whose Workflow is deleted by hand while both
    its pods compute: the backend reports it gone, the decider preempts the live attempts and
    submits the run again, and it succeeds. Its messages and log are copied to where `keep`
    looks for a local run's."""
    sys.path.insert(0, str(HERE.parents[1] / "cluster"))
    import asyncio

    from cluster_runs import HARNESS_ENV, Service, submitted
    from fake.cluster import FakeCluster, NodeSpec
    from test_runs_resubmitted_on_the_fake_cluster import RUN, delete_workflow, squares

    from simrun_core import events as ev
    from simrun_core.workflow import Priority

    nodes = [NodeSpec(f"node-{i}", cores=2, memory_gb=4.0) for i in (1, 2)]

    async def scenario(cluster: FakeCluster) -> None:
        async with Service(cluster, root / "db.sqlite") as service:
            event, settings = submitted(
                RUN, squares(200, sleep_s=0.02), nodes, Priority.STANDARD, max_pods=2
            )
            await service.submit(event, settings)

            def both_running() -> bool:
                log = service.log(RUN)
                workers = {e.worker for e in log if isinstance(e, ev.PodStarted)}
                return workers == {"w0", "w1"} and len(done_indices(log)) > 8

            await service.until(both_running, "both pods to run")
            await delete_workflow(cluster, RUN)
            await service.ended(RUN)

    with FakeCluster(root / "cluster", nodes=nodes, env_overrides=HARNESS_ENV) as cluster:
        asyncio.run(scenario(cluster))
        run_dir = root / ".simrun/store/runs" / RUN
        run_dir.mkdir(parents=True)
        for name in ("events.jsonl", "messages.jsonl"):
            shutil.copyfile(cluster.store_dir / "runs" / RUN / name, run_dir / name)
    return RUN


def main() -> None:
    os.environ["SIMRUN_RECORD_MESSAGES"] = "1"
    sleep = python("import time; time.sleep(60)")
    record("succeeded", one_run(squares(5)))
    record("failed", one_run(squares(6, fail_at=3)))
    record("cancelled", one_run({"name": "golden", "tasks": [command("sleep", sleep)]}, cancel))
    record("retried-after-kill", one_run(squares(40, sleep_s=0.1), kill_a_worker))
    record("killed-for-memory", one_run(squares(4, sleep_s=1.0, memory_mb=300)))
    record("service-killed", service_killed)
    record("workflow-deleted-mid-run", workflow_deleted_mid_run)


if __name__ == "__main__":
    main()
