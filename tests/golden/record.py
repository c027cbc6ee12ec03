"""Record the golden event logs: real runs of the local service, each log with its fold.

Run `python tests/golden/record.py` from the repository to write them anew (only when an event
type is added on purpose: the logs in git are the old runs that must stay readable forever).
Each case leaves `<case>/events.jsonl` and `<case>/record.json`, the record it folds to.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import msgspec

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

from live_service import (  # noqa: E402
    command,
    python,
    run_processes,
    start_service,
    stop_service,
    wait_until,
)
from unit_events import unit_indices  # noqa: E402

from simrun_core.fold import fold  # noqa: E402
from simrun_core.store import read_log  # noqa: E402


def squares(n: int, **settings: object) -> dict:
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": n, **settings}}
    return {"name": "golden", "tasks": [task]}


def keep(name: str, service_root: Path, run_id: str) -> None:
    events = service_root / ".simrun/store/runs" / run_id / "events.jsonl"
    target = HERE / name
    target.mkdir(exist_ok=True)
    shutil.copyfile(events, target / "events.jsonl")
    record = fold(read_log(target / "events.jsonl"))
    (target / "record.json").write_bytes(msgspec.json.format(msgspec.json.encode(record)) + b"\n")
    print(f"{name}: {record.state}, {record.seq} events")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        service = start_service(root)
        try:
            run = service.submit(squares(5))
            service.wait(run["id"])
            keep("succeeded", root, run["id"])

            run = service.submit(squares(6, fail_at=3))
            service.wait(run["id"])
            keep("failed", root, run["id"])

            run = service.submit(
                {
                    "name": "golden",
                    "tasks": [command("sleep", python("import time; time.sleep(60)"))],
                }
            )
            wait_until(lambda: run_processes(run["id"]), what="the process")
            service.client.post(f"/runs/{run['id']}/cancel")
            service.wait(run["id"])
            keep("cancelled", root, run["id"])

            run = service.submit(squares(40, sleep_s=0.1))
            wait_until(lambda: len(unit_indices(service.events(run["id"]))) >= 3)
            for pid in run_processes(run["id"]):
                os.kill(pid, signal.SIGKILL)
            service.wait(run["id"])
            keep("retried-after-kill", root, run["id"])

            run = service.submit(squares(40, sleep_s=0.05))
            wait_until(lambda: len(unit_indices(service.events(run["id"]))) >= 3)
            os.kill(service.process.pid, signal.SIGKILL)
            service.process.wait()
        finally:
            stop_service(service)
        service = start_service(root)
        try:
            service.wait(run["id"])
            keep("service-killed", root, run["id"])
        finally:
            stop_service(service)


if __name__ == "__main__":
    main()
