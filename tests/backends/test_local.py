"""The contract against the local backend: its pods are processes of `command` tasks whose
argv plays the script; and what only the local backend does (orphans, cores)."""

from __future__ import annotations

import sys
from pathlib import Path

from simrun_api.backends.base import Backend
from simrun_api.backends.local import LocalBackend
from simrun_core import exits

from .contract import HANG, BackendContract, Reports, Script, Task

PROGRAM = """\
import os, sys, time
attempt = int(os.environ["SIMRUN_ATTEMPT"])
memory = os.environ["SIMRUN_MEMORY_PER_WORKER_GB"]
print("attempt=" + str(attempt) + " memory=" + memory, flush=True)
exits = EXITS
code = exits[min(attempt, len(exits) - 1)]
if code is None:
    time.sleep(600)
sys.exit(code)
"""


class TestLocalBackend(BackendContract):
    """The local backend on a store of the test, with cores to spare for a few runs and two
    GPUs named as `CUDA_VISIBLE_DEVICES` would (whatever this machine has)."""

    def make_backend(self, store: Path) -> LocalBackend:
        scratch = store.parent / "scratch"
        return LocalBackend(store, scratch, cores=4, memory_gb=8.0, gpus=["3", "5"])

    def args(self, script: Script) -> list[str]:
        return [sys.executable, "-c", PROGRAM.replace("EXITS", repr(list(script.exits)))]

    def test_recover_kills_the_processes_a_dead_service_left(self, tmp_path: Path) -> None:
        async def scenario(backend: Backend) -> None:
            run_id = self.run_id()
            reports = Reports()
            await backend.submit(self.submission(run_id, Task("t", HANG)), reports)
            await reports.running("t", 0)
            [started] = [c for c in reports.of("t", 0) if c.phase == "running"]
            assert started.pid is not None
            again = self.restarted(backend)
            assert await again.recover() == 1
            end = await reports.ended("t", 0)
            assert end.exit_code == 137, "the process of the old service was killed"
            assert not Path(f"/proc/{started.pid}/cmdline").exists() or _zombie(started.pid)
            assert await again.recover() == 0

        self.play(tmp_path, scenario)

    def test_cancel_ends_a_pod_still_waiting_for_cores(self, tmp_path: Path) -> None:
        async def scenario(backend: Backend) -> None:
            one_core = LocalBackend(self.store, self.store.parent / "scratch", cores=1)
            self._backends.append(one_core)
            run_id = self.run_id()
            reports = Reports()
            await one_core.submit(self.submission(run_id, Task("a", HANG), Task("b")), reports)
            await reports.running("a", 0)
            await reports.until(lambda: reports.phases("b", 0) == ["pending"], "b pending")
            await one_core.cancel(run_id)
            assert reports.phases("a", 0) == ["pending", "running", "failed"]
            assert reports.phases("b", 0) == ["pending", "failed"]
            end = reports.end("b", 0)
            assert end is not None and end.exit_code is None, "it never ran: no exit code"

        self.play(tmp_path, scenario)

    def test_an_attempt_whose_process_cannot_start_fails_with_the_reason(
        self, tmp_path: Path
    ) -> None:
        """Not only an OSError: an empty argv (TypeError) or a NUL in it (ValueError) ended
        nothing before, and the run waited forever; now every such attempt fails with exit
        CONFIGURATION and says why, and the backend serves the next run."""
        cases = [
            ([], "task 't': cannot start a process: its argv is empty"),
            (["tr\0ue"], "task 't': cannot start 'tr\\x00ue': ValueError: embedded null byte"),
            (["/no/such/program"], "task 't': cannot start '/no/such/program': No such file"),
        ]

        async def scenario(backend: Backend) -> None:
            for argv, reason in cases:
                self.args = lambda script, argv=argv: argv  # type: ignore[method-assign]
                reports = Reports()
                await backend.submit(self.submission(self.run_id(), Task("t")), reports)
                end = await reports.ended("t", 0)
                assert (end.phase, end.exit_code) == ("failed", exits.CONFIGURATION), end
                assert end.message is not None and end.message.startswith(reason), end.message
            del self.args
            await self.barrier(backend)

        self.play(tmp_path, scenario)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
