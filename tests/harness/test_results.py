"""The same result however a split task is computed: by pools of 1, 2 or 8 processes, by a
coordinator with extra workers, and after a worker was killed mid-unit and its units computed
again. The result is every file below `out/`, compared byte for byte with a clean run's."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from simrun_core.events import WorkerReport
from simrun_harness.split import IN_FLIGHT_PER_PROCESS

from .helpers import HarnessTask, alive, descendants, ledger_entries, wait_until

GATED = "harness_test_plugin:GATED"
SETTINGS = {"n": 24, "sleep_s": 0.05}
EXTRA = {"SIMRUN_ROLE": "extra", "SIMRUN_MERGE": "0"}

MakeTask = Callable[..., HarnessTask]

# The units a worker of 2 processes (SIMRUN_CORES=2, at most the CPUs) holds at once.
IN_FLIGHT = IN_FLIGHT_PER_PROCESS * min(2, len(os.sched_getaffinity(0)))


def clean_run(make_task: MakeTask, settings: dict, **task: str) -> dict[str, bytes]:
    """The files of one coordinator with one process computing the task alone."""
    clean = make_task(settings, **task)
    if task.get("task_type") == GATED:
        (clean.task_dir / "gate").touch()
    process = clean.run("simrun-worker", SIMRUN_CORES="1")
    assert process.returncode == 0, process.stderr_text
    return clean.out_files()


def test_pools_of_1_2_and_8_processes_give_the_same_files(make_task: MakeTask) -> None:
    tasks = {pool: make_task(SETTINGS) for pool in (1, 2, 8)}
    processes = {
        pool: task.start("simrun-worker", SIMRUN_CORES=str(pool)) for pool, task in tasks.items()
    }
    for pool, task in tasks.items():
        task.finish(processes[pool])
        assert processes[pool].returncode == 0, processes[pool].stderr_text
        # SIMRUN_CORES caps the CPUs the harness may use: a pool of 8 needs 8 of them
        assert task.report().processes == min(pool, len(os.sched_getaffinity(0)))
    files = {pool: task.out_files() for pool, task in tasks.items()}
    assert len(files[1]) == SETTINGS["n"] + 2  # the units, the summary and the merge marker
    assert files[2] == files[1]
    assert files[8] == files[1]


def test_a_pool_has_no_more_processes_than_the_task_has_units(make_task: MakeTask) -> None:
    task = make_task({"n": 1, "sleep_s": 0.0})
    process = task.run("simrun-worker", SIMRUN_CORES="8")
    assert process.returncode == 0, process.stderr_text
    assert task.report().processes == 1
    assert task.units_done("w0") == [0]


@pytest.mark.parametrize(("extras", "cores"), [(1, "1"), (3, "2")])
def test_a_coordinator_with_extra_workers_gives_the_same_files(
    make_task: MakeTask, extras: int, cores: str
) -> None:
    """1 + 1 workers of one process, and 1 + 3 workers of two (8 processes, also on fewer
    CPUs): the units wait at the gate until every extra worker holds some."""
    settings = {"n": 24}
    expected = clean_run(make_task, settings, task_type=GATED)
    task = make_task(settings, task_type=GATED)
    names = [f"x{number}" for number in range(1, extras + 1)]
    workers = [
        task.start("simrun-worker", SIMRUN_WORKER=name, SIMRUN_CORES=cores, **EXTRA)
        for name in names
    ]
    coordinator = task.start("simrun-worker", SIMRUN_CORES=cores)
    for name in ["w0", *names]:
        wait_until(lambda name=name: task.units_started(name), what=f"a claim of {name}")
    (task.task_dir / "gate").touch()
    for process in [*workers, coordinator]:
        task.finish(process)
        assert process.returncode == 0, process.stderr_text
    processes = sum(task.report(name).processes for name in ["w0", *names])
    assert processes == (1 + extras) * min(int(cores), len(os.sched_getaffinity(0)))
    done = {name: task.units_done(name) for name in ["w0", *names]}
    assert all(done.values()), f"a worker computed no unit: {done}"
    every = [index for indices in done.values() for index in indices]
    assert sorted(every) == list(range(24)), "each unit computed once"
    assert task.out_files() == expected


def test_a_worker_killed_mid_unit_is_recomputed_with_the_same_files(make_task: MakeTask) -> None:
    """An extra worker is SIGKILLed while its units wait at the gate; the coordinator releases
    its claims once its heartbeat is stale and computes them itself."""
    settings = {"n": 10}
    expected = clean_run(make_task, settings, task_type=GATED)
    task = make_task(settings, task_type=GATED)
    timing = {"SIMRUN_HEARTBEAT_S": "0.1", "SIMRUN_STALE_S": "1"}
    doomed = task.start("simrun-worker", SIMRUN_WORKER="x1", **EXTRA, **timing)
    coordinator = task.start("simrun-worker", **timing)
    wait_until(lambda: len(task.units_started("x1")) == IN_FLIGHT, what="the units of x1")
    wait_until(lambda: len(task.units_started("w0")) == IN_FLIGHT, what="the units of w0")
    tree = [doomed.pid, *descendants(doomed.pid)]
    os.killpg(doomed.pid, signal.SIGKILL)
    wait_until(lambda: not any(alive(pid) for pid in tree), what="x1 and its pool to die")
    lost = sorted(task.units_started("x1"))
    (task.task_dir / "gate").touch()
    task.finish(coordinator)
    assert coordinator.returncode == 0, coordinator.stderr_text

    assert task.units_done("x1") == []
    assert not any(isinstance(event, WorkerReport) for event in task.events("x1"))
    assert set(lost) <= set(task.units_done("w0"))
    releases = ledger_entries(task.task_dir / "ledger", "release")
    assert releases == {f"{index}.0": "w0" for index in lost}
    assert task.report().units_done == settings["n"]
    assert task.out_files() == expected
