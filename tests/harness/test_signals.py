"""SIGTERM from the first instant of a harness process, the grace of running units, and the
start and preparation times of the report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simrun_core.store import MERGED_MARKER
from simrun_harness.merge import describe_indices
from simrun_harness.split import IN_FLIGHT_PER_PROCESS

from .helpers import HarnessTask, ledger_entries, sigterm_caught, wait_until
from .test_exec import copy_task

# The units a worker of 2 processes (SIMRUN_CORES=2, at most the CPUs) holds at once.
IN_FLIGHT = IN_FLIGHT_PER_PROCESS * min(2, len(os.sched_getaffinity(0)))


def test_the_entry_modules_import_nothing_before_the_sigterm_handler() -> None:
    """What runs before `stop_on_sigterm()` is the standard library and `signals` only."""
    code = (
        "import sys, simrun_harness.worker, simrun_harness.exec; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('simrun_harness', 'simrun_core', 'msgspec', 'litestar')))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert output.returncode == 0, output.stderr
    assert output.stdout.strip() == str(
        ["simrun_harness", "simrun_harness.exec", "simrun_harness.signals", "simrun_harness.worker"]
    )


PROBE = """
import signal, sys
from pathlib import Path

OUT = Path(sys.argv[1])


class Probe:
    \"\"\"Notes whether SIGTERM is handled when simrun_core or msgspec is first imported.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name in ("simrun_core", "msgspec") and not hasattr(Probe, "seen"):
            Probe.seen = signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
            OUT.write_text(f"{name} {Probe.seen}")
        return None


sys.meta_path.insert(0, Probe())
import simrun_harness.{module} as entry

sys.argv[1:] = []
entry.{function}()
"""


@pytest.mark.parametrize(
    ("module", "function"), [("worker", "main"), ("worker", "merge_main"), ("exec", "main")]
)
def test_sigterm_is_handled_before_simrun_core_is_imported(
    make_task, tmp_path: Path, module: str, function: str
) -> None:
    task = copy_task(make_task) if module == "exec" else make_task({"n": 2})
    probe = tmp_path / "probe.txt"
    code = PROBE.replace("{module}", module).replace("{function}", function)
    process = subprocess.run(
        [sys.executable, "-c", code, str(probe)],
        env=task.environment(SIMRUN_WORKER=None),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert process.returncode in (0, 3), process.stderr  # a merge of nothing fails
    assert probe.read_text() in ("simrun_core True", "msgspec True")


@pytest.mark.parametrize(
    ("program", "worker", "message"),
    [
        ("simrun-worker", "w0", "stopped on SIGTERM before the first claim"),
        ("simrun-merge", "merge", "stopped on SIGTERM before the merge"),
        ("simrun-exec", "copy", "stopped on SIGTERM while staging the inputs"),
    ],
)
def test_a_sigterm_sent_at_the_start_stops_the_harness_before_its_work(
    make_task, program: str, worker: str, message: str
) -> None:
    """Started with SIGTERM blocked, as a launcher can, and signalled at once: the signal waits
    for the handler, which sees it before anything is claimed, merged or run."""
    if program == "simrun-exec":
        task = copy_task(make_task)
        task.env["SIMRUN_STAGE"] = "data"
    else:
        task = make_task({"n": 3})
        if program == "simrun-merge":
            task.env.pop("SIMRUN_WORKER")
    process = task.start(program, block_sigterm=True)
    os.kill(process.pid, signal.SIGTERM)
    task.finish(process, program)
    assert process.returncode == 143, process.stderr_text
    report = task.report(worker)
    assert (report.exit_code, report.failed, report.message) == (143, False, message)
    assert report.prepare_seconds > 0 and report.units_done == 0
    claims = task.task_dir / "ledger" / "claim"
    assert not claims.exists() or os.listdir(claims) == []
    out = task.task_dir / "out"
    assert not (out / "started").exists() and not (out / MERGED_MARKER).exists()
    assert not (out / "summary.json").exists()


def test_a_sigterm_as_soon_as_the_handler_exists_releases_everything(make_task) -> None:
    task: HarnessTask = make_task({"n": 6, "sleep_s": 30})
    process = task.start("simrun-worker")
    wait_until(lambda: sigterm_caught(process.pid), timeout=30, what="the SIGTERM handler")
    os.kill(process.pid, signal.SIGTERM)
    task.finish(process)
    assert process.returncode == 143, process.stderr_text
    report = task.report()
    assert (report.exit_code, report.units_done) == (143, 0)
    assert report.message.startswith("stopped on SIGTERM")
    assert task.ledger(6).claims() == {}


def test_sigterm_during_work_releases_the_claims_and_reports_within_the_grace(make_task) -> None:
    task: HarnessTask = make_task({"n": 6, "sleep_s": 30})
    worker = task.start("simrun-worker", SIMRUN_GRACE_S="1")
    wait_until(lambda: len(task.units_started()) == IN_FLIGHT, what="the units in flight")
    signalled = time.monotonic()
    os.killpg(worker.pid, signal.SIGTERM)
    task.finish(worker)
    waited = time.monotonic() - signalled
    assert worker.returncode == 143, worker.stderr_text
    assert 1.0 <= waited < 6.0, "the running units get the grace, and no more"
    in_flight = sorted(task.units_started())
    report = task.report()
    assert report.message == f"stopped on SIGTERM; released units {describe_indices(in_flight)}"
    assert (report.exit_code, report.units_done) == (143, 0)
    releases = ledger_entries(task.task_dir / "ledger", "release")
    assert releases == {f"{index}.0": "w0" for index in in_flight}
    assert task.ledger(6).claims() == {}


def test_the_report_tells_when_the_worker_started_and_how_long_it_prepared(make_task) -> None:
    task: HarnessTask = make_task({"n": 4})
    before = time.time()
    process = task.run("simrun-worker")
    after = time.time()
    assert process.returncode == 0, process.stderr_text
    report = task.report()
    first_claim = task.events()[0].time.timestamp()
    assert before - 0.05 <= report.started <= first_claim
    assert report.prepare_seconds > 0 and report.started + report.prepare_seconds <= first_claim
    assert report.prepare_seconds < report.seconds <= after - report.started + 0.05


def test_the_report_of_exec_counts_the_staging_as_preparation(make_task) -> None:
    task = copy_task(make_task)
    before = time.time()
    process = task.run("simrun-exec", SIMRUN_STAGE="data")
    assert process.returncode == 0, process.stderr_text
    report = task.report("copy")
    command_started = (task.task_dir / "out" / "started").stat().st_mtime
    staged = (Path(task.env["SIMRUN_SCRATCH"]) / "data" / "a.txt").stat().st_ctime  # the copy
    assert before - 0.05 <= report.started <= staged
    assert staged <= report.started + report.prepare_seconds <= command_started
    assert json.loads((task.task_dir / "out" / "started").read_text())["SIMRUN_CORES"] == "1"


def test_exit_now_keeps_what_was_printed_and_the_exit_code() -> None:
    code = (
        "import sys; from simrun_harness.signals import exit_now; "
        "print('to the log'); print('and the errors', file=sys.stderr); exit_now(3)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout == "to the log\n" and done.stderr == "and the errors\n"


def test_a_worker_killed_at_any_moment_leaves_no_unit_done_that_its_log_lacks(make_task) -> None:
    """A unit's event is written before its `done/` entry: killed between the two, the unit is
    computed again (and counted once); never done in the ledger with no event to say so."""
    for kill_after in (3, 10, 25, 40, 60):
        task = make_task({"n": 400, "sleep_s": 0.002})
        process = task.start("simrun-worker", SIMRUN_CORES="2")
        wait_until(lambda task=task, n=kill_after: len(task.units_done()) >= n, what="units done")
        os.killpg(process.pid, signal.SIGKILL)
        task.finish(process)
        done = {int(name) for name in ledger_entries(task.task_dir / "ledger", "done")}
        logged = set(task.units_done())
        assert done <= logged, f"done in the ledger, not in the log: {sorted(done - logged)}"
