"""A service on the FakeBackend for `many_runs.py`: `python -m benchmarks.fake_service ROOT ...`.

The real service (litestar app, uvicorn, Supervisor, a RunActor per run, the event logs on disk,
the index) with the FakeBackend in place of the local one: its autopilot starts the pod of every
task and keeps a split task's coordinator running; a driver then plays those pods' harnesses,
appending to each pod's harness event log, as the harness does, a `unit-started` per unit and
one `units-done` of the units done since the tick before, at a steady rate (`--rate` units per
second per pod) once the file `ROOT/go` exists, so that every run has all its units live at
once. With `--prewrite N` the first N units of each pod are written at once when it starts
(before `go`): a run far into its units, its log long, without the minutes of writing them at a
realistic rate. A pod whose units are all written keeps running (the run stays live) until the
service stops, which cancels the runs. The driver runs on the service's event loop (the fake is
in memory); `ROOT/driver.json` says how long its writes took, so the benchmark can
tell the service's own time from it.

`ROOT/service.json` has the port, the token and the pid once the service answers.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import time
from pathlib import Path

import msgspec
import uvicorn

from simrun_api.app import create_app
from simrun_api.backends.fake import FakeBackend, FakePod, Outcome
from simrun_api.local import listening_socket, local_settings, user_token
from simrun_api.server import server_config
from simrun_core import events as ev
from simrun_core.events import encode_event
from simrun_core.planner import Node
from simrun_core.service_allocator import adopt_service_allocator
from simrun_core.store import RunPaths, write_atomic

TICK_S = 0.1
GO = "go"
PROFILE = "SIMRUN_BENCH_PROFILE"
SAMPLE = "SIMRUN_BENCH_SAMPLE"
"""A file to write, when the service stops, where the event loop's thread was every 5 ms (the
innermost frames of the service's own code and of the library it was in, counted)."""
"""A file to write a cProfile of the service to (when it stops), to find where its time goes."""


@dataclasses.dataclass(eq=False)
class PlayedPod:
    """A running pod whose harness the driver plays: its log, open for appending."""

    pod: FakePod
    units: int
    fd: int
    written: int = 0


class HarnessDriver:
    """Writes the units of every held pod at `rate` units per second, from `ROOT/go` on."""

    def __init__(self, store: Path, go: Path, rate: float, prewrite: int = 0) -> None:
        self.store = store
        self.go = go
        self.rate = rate
        self.prewrite = prewrite
        self.pods: list[PlayedPod] = []
        self.busy_s = 0.0
        self.lines = 0

    def autopilot(self, pod: FakePod) -> Outcome:
        """Keep a split task's coordinator running (its units are the driver's); every other
        pod succeeds at once."""
        if pod.harness and pod.plan.units:
            path = RunPaths(self.store, pod.run_id).worker_events(pod.task)
            path.mkdir(parents=True, exist_ok=True)
            log = path / f"{pod.worker}.{pod.attempt}.jsonl"
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            played = PlayedPod(pod, pod.plan.units, fd)
            if self.prewrite:
                self._write(played, min(self.prewrite, played.units))
            self.pods.append(played)
            return Outcome(exit_code=None)
        return Outcome()

    async def drive(self, report: Path) -> None:
        """Wait for `go`, then write units every `TICK_S` until every pod has all of its own;
        then write `report` (the seconds the writes took, the lines written)."""
        while not self.go.exists():
            await asyncio.sleep(TICK_S)
        started = time.monotonic()
        while True:
            await asyncio.sleep(TICK_S)
            began = time.perf_counter()
            due = self.prewrite + int((time.monotonic() - started) * self.rate)
            left = 0
            for played in self.pods:
                target = min(played.units, due)
                if target > played.written:
                    self._write(played, target)
                left += played.units - played.written
            self.busy_s += time.perf_counter() - began
            if left == 0 and self.pods:
                break
        summary = {
            "busy_s": self.busy_s,
            "lines": self.lines,
            "seconds": time.monotonic() - started,
            "pods": len(self.pods),
        }
        write_atomic(report, msgspec.json.encode(summary))

    def _write(self, played: PlayedPod, target: int) -> None:
        pod = played.pod
        indices = tuple(range(played.written, target))
        started = [
            ev.UnitStarted(task=pod.task, index=index, worker=pod.worker) for index in indices
        ]
        done = ev.UnitsDone(
            task=pod.task, worker=pod.worker, indices=indices, seconds=(0.001,) * len(indices)
        )
        os.write(played.fd, b"".join(encode_event(event) for event in [*started, done]))
        self.lines += len(indices) + 1
        played.written = target


def main() -> None:
    """Serve the project directory ROOT on the fake backend until SIGTERM."""
    adopt_service_allocator()  # as `simrun serve` (its launcher, FakeService, set it)
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fake_service")
    parser.add_argument("root", type=Path)
    parser.add_argument("--rate", type=float, default=10.0, help="units per second per pod")
    parser.add_argument("--prewrite", type=int, default=0, help="units written at a pod's start")
    options = parser.parse_args()
    root = options.root.resolve()
    settings = msgspec.structs.replace(local_settings(root), web=None)
    token = user_token(settings)
    driver = HarnessDriver(settings.store, root / GO, options.rate, options.prewrite)
    node = Node(name="fake-node", cores=100_000, memory_gb=100_000.0)
    backend = FakeBackend(settings.store, nodes=[node], autopilot=driver.autopilot)
    app = create_app(settings, backend)
    sock = listening_socket()
    port = sock.getsockname()[1]
    config = server_config(app, settings, log_level="warning", access_log=False, backlog=4096)
    server = uvicorn.Server(config)
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda number, frame: None)

    async def serve() -> None:
        async def announce() -> None:
            while not server.started:
                await asyncio.sleep(0.02)
            info = {
                "port": port,
                "token": token,
                "pid": os.getpid(),
                "url": f"http://127.0.0.1:{port}",
            }
            write_atomic(root / "service.json", msgspec.json.encode(info))

        tasks = [
            asyncio.create_task(announce()),
            asyncio.create_task(driver.drive(root / "driver.json")),
        ]
        try:
            await server.serve(sockets=[sock])
        finally:
            for task in tasks:
                task.cancel()

    sample = os.environ.get(SAMPLE)
    if sample:
        _sample_loop(Path(sample))
    profile = os.environ.get(PROFILE)
    if profile:
        import cProfile

        cProfile.runctx("asyncio.run(serve())", globals(), {"serve": serve}, profile)
    else:
        asyncio.run(serve())


def _sample_loop(out: Path) -> None:
    """Sample the stack of this (the loop's) thread from a thread of its own every 5 ms and
    write the counts of its innermost frames at exit: where the loop's wall time goes, blocked
    calls included, at little cost."""
    import atexit
    import collections
    import sys
    import threading

    loop_thread = threading.get_ident()
    counts: collections.Counter[str] = collections.Counter()
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            frame = sys._current_frames().get(loop_thread)
            where: list[str] = []
            while frame is not None and len(where) < 4:
                code = frame.f_code
                where.append(f"{Path(code.co_filename).name}:{code.co_name}:{frame.f_lineno}")
                frame = frame.f_back
            counts[" < ".join(where)] += 1

    def write() -> None:
        stop.set()
        lines = [f"{count} {where}" for where, count in counts.most_common(200)]
        out.write_text("\n".join(lines) + "\n")

    threading.Thread(target=sample, daemon=True).start()
    atexit.register(write)


if __name__ == "__main__":
    main()
