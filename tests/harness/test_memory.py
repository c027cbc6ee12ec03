"""Memory and CPU usage: the cgroup files (fixture trees via `SIMRUN_CGROUP_ROOT`), the process
tree, and the limit the harness enforces itself without a cgroup (`SIMRUN_MEMORY_SOURCE=process`)
where its backend declares it real (`SIMRUN_MEMORY_ENFORCED=1`); a limit not declared real (the
local backend's) only sizes the pool.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from simrun_core.events import UNITS_EVENTS
from simrun_core.task_types.demo import SQUARES
from simrun_harness import cgroup
from simrun_harness.env import (
    GIB,
    cores,
    enforced_limit,
    memory_limit,
    sizing_from_env,
    timing_from_env,
    usage_cgroup,
)
from simrun_harness.memory import (
    MIB,
    CpuThrottle,
    MemoryGuard,
    MemorySampler,
    OomKillCounter,
    process_tree_anon,
)
from simrun_harness.split import IN_FLIGHT_PER_PROCESS

from .helpers import (
    HarnessTask,
    alive,
    descendants,
    ledger_entries,
    make_cgroup,
    pool_processes,
    wait_until,
    write_cgroup,
)
from .test_exec import copy_task, started

MB = 10**6
GATED = "harness_test_plugin:GATED"
ENFORCED = {"SIMRUN_MEMORY_ENFORCED": "1"}
"""A limit declared real (a pod without a cgroup of its own, a Slurm job): the harness kills."""

# -- the readers --------------------------------------------------------------------------------


def test_cgroup_files_are_read_below_the_root_of_the_environment(tmp_path: Path) -> None:
    root = make_cgroup(
        tmp_path / "cgroup",
        cpu_max="150000 100000\n",
        memory_max=f"{2 * GIB}\n",
        cpu_stat="usage_usec 10\nthrottled_usec 2500000\n",
    )
    env = {"SIMRUN_CGROUP_ROOT": str(root)}
    assert usage_cgroup(env, "cgroup") == root
    assert usage_cgroup(env, "process") is None
    assert cores(env) == 1  # 1.5 cores of quota, rounded down
    assert memory_limit(env, "cgroup") == 2 * GIB
    assert memory_limit({**env, "SIMRUN_MEMORY_LIMIT_GB": "0.5"}, "process") == GIB // 2
    assert cgroup.cpu_throttled_seconds(root) == 2.5
    (root / "cpu.stat").write_text("usage_usec 10\n")
    assert cgroup.cpu_throttled_seconds(root) is None
    assert usage_cgroup({"SIMRUN_CGROUP_ROOT": str(tmp_path / "none")}, "cgroup") is None


def test_usage_counts_from_the_start_of_the_harness(tmp_path: Path) -> None:
    root = make_cgroup(
        tmp_path / "cgroup",
        memory_stat="file 999999\nanon 4096\n",
        memory_events="oom 2\noom_kill 2\n",
        cpu_stat="throttled_usec 1000000\n",
    )
    memory, oom, throttle = MemorySampler(root), OomKillCounter(root), CpuThrottle(root)
    assert memory.source == "cgroup"
    memory.sample()
    write_cgroup(
        root,
        memory_stat="file 1\nanon 8192\n",
        memory_events="oom 5\noom_kill 5\n",
        cpu_stat="throttled_usec 3500000\n",
    )
    memory.sample()
    write_cgroup(root, memory_stat="anon 100\n")
    memory.sample()
    assert memory.peak == 8192
    assert oom.kills() == 3 and oom.last_kill() is None
    oom.counted("a process was killed for its memory")
    assert oom.kills() == 4 and oom.last_kill() == "a process was killed for its memory"
    assert throttle.seconds() == 2.5
    assert CpuThrottle(None).seconds() is None
    assert OomKillCounter(None).kills() == 0
    assert MemorySampler(tmp_path).source == "process"  # no memory.stat: the process tree


def test_the_memory_settings_of_the_environment() -> None:
    assert timing_from_env({}).memory_sample_s == 0.2
    assert timing_from_env({"SIMRUN_MEMORY_SAMPLE_S": "0.05"}).memory_sample_s == 0.05
    variable = "SIMRUN_MEMORY_PER_WORKER_GB"
    assert enforced_limit({variable: "0.25", **ENFORCED}, "process", variable) == GIB // 4
    assert enforced_limit({variable: "0.25", **ENFORCED}, "cgroup", variable) is None  # kernel's
    assert enforced_limit(ENFORCED, "process", variable) is None
    assert enforced_limit({variable: "0", **ENFORCED}, "process", variable) is None
    # not declared real (the local backend): the limit only sizes the pool
    assert enforced_limit({variable: "0.25"}, "process", variable) is None
    assert (
        enforced_limit({variable: "0.25", "SIMRUN_MEMORY_ENFORCED": "0"}, "process", variable)
        is None
    )
    env = {"SIMRUN_MEMORY_SOURCE": "process", "SIMRUN_CORES": "1", **ENFORCED}
    task_type = SQUARES
    assert sizing_from_env(env, task_type).process_limit_bytes is None  # the hint is no limit
    sized = sizing_from_env({**env, variable: "0.5"}, task_type)
    assert (sized.process_limit_bytes, sized.per_worker_gb) == (GIB // 2, 0.5)
    local = sizing_from_env({**env, variable: "0.5", "SIMRUN_MEMORY_ENFORCED": "0"}, task_type)
    assert (local.process_limit_bytes, local.per_worker_gb) == (None, 0.5)


HOLD = """
import subprocess, sys, time
if len(sys.argv) > 2:  # a child holding memory of its own, ready before this one is
    child = subprocess.Popen([sys.executable, __file__, sys.argv[2]], stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"ok\\n"
ballast = bytearray(int(sys.argv[1]) << 20)  # zeroed, so its pages are touched
print("ok", flush=True)
time.sleep(60)
"""


def _holding(script: Path, megabytes: int, child_mb: int | None = None) -> subprocess.Popen[str]:
    """A python process holding `megabytes`, with a child holding `child_mb` if given; it
    printed `ok` once all hold their memory."""
    script.write_text(HOLD)
    argv = [sys.executable, str(script), str(megabytes)]
    if child_mb is not None:
        argv.append(str(child_mb))
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "ok\n"
    return process


def test_the_guard_kills_a_process_tree_above_its_limit_and_counts_it(tmp_path: Path) -> None:
    small = _holding(tmp_path / "hold.py", 1)
    large = _holding(tmp_path / "hold.py", 1, child_mb=96)  # small itself, large as a tree
    try:
        grandchild = descendants(large.pid)[0]
        assert (process_tree_anon(large.pid) or 0) > 96 * MIB > (process_tree_anon(small.pid) or 0)
        oom = OomKillCounter()
        guard = MemoryGuard(
            64 * MIB, lambda: [small.pid, large.pid], oom, "the test process", "THE_LIMIT=64"
        )
        guard.check()
        assert large.wait(timeout=10) == -signal.SIGKILL
        wait_until(lambda: not alive(grandchild), what="the grandchild to be killed too")
        assert small.poll() is None
        assert oom.kills() == 1
        message = oom.last_kill()
        assert message is not None
        assert message.startswith(f"the test process (pid {large.pid}) was killed for its memory")
        assert message.endswith("above the 64 MiB of THE_LIMIT=64")
        guard.check()
        assert oom.kills() == 1, "a process is killed and counted once"
    finally:
        for process in (small, large):
            process.kill()
            process.wait()


# -- simrun-worker without a cgroup, its limit declared real: the harness kills for memory -------


def test_a_pool_process_above_its_memory_is_killed_and_the_worker_exits_137(make_task) -> None:
    task: HarnessTask = make_task({"n": 4, "memory_mb": 300, "sleep_s": 1})
    process = task.run("simrun-worker", SIMRUN_MEMORY_PER_WORKER_GB="0.25", **ENFORCED)
    assert process.returncode == 137, process.stderr_text
    report = task.report()
    assert report.oom_kills >= 1
    assert (report.exit_code, report.failed, report.per_worker_gb) == (137, False, 0.25)
    assert report.message.startswith("a process of the pool (pid ")
    assert "was killed for its memory" in report.message
    assert "above the 256 MiB of SIMRUN_MEMORY_PER_WORKER_GB=0.25; units " in report.message
    ledger = task.ledger(4)
    assert ledger.claims() == {}, "the units it did not finish are released"
    unfinished = set(task.units_started()) - set(task.units_done())
    assert unfinished and ledger.missing() == sorted(set(range(4)) - set(task.units_done()))
    releases = set(ledger_entries(task.task_dir / "ledger", "release"))
    assert {f"{index}.0" for index in unfinished} <= releases


def test_a_pool_process_within_its_memory_is_left_alone(make_task) -> None:
    task: HarnessTask = make_task({"n": 4, "memory_mb": 300, "sleep_s": 1})
    process = task.run("simrun-worker", SIMRUN_MEMORY_PER_WORKER_GB="0.375", **ENFORCED)
    assert process.returncode == 0, process.stderr_text
    report = task.report()
    assert (report.exit_code, report.oom_kills, report.units_done) == (0, 0, 4)
    assert report.peak_memory_bytes is not None and report.peak_memory_bytes >= 300 * MB
    assert report.throttled_seconds is None  # no cgroup of its own


def test_a_limit_not_declared_real_sizes_the_pool_and_kills_nothing(make_task) -> None:
    """The local backend's limit (spec 06): the pool is sized by it, and a process above its
    share runs on; only the machine's out of memory killer could end it."""
    task: HarnessTask = make_task({"n": 4, "memory_mb": 300, "sleep_s": 1})
    process = task.run(
        "simrun-worker",
        SIMRUN_MEMORY_PER_WORKER_GB="0.25",
        SIMRUN_MEMORY_LIMIT_GB="0.75",
        SIMRUN_MEMORY_BASE_GB="0.25",
        SIMRUN_MEMORY_ENFORCED="0",
    )
    assert process.returncode == 0, process.stderr_text
    report = task.report()
    assert (report.exit_code, report.oom_kills, report.units_done) == (0, 0, 4)
    assert (report.processes, report.per_worker_gb) == (2, 0.25)  # (0.75 - 0.25) / 0.25
    assert report.peak_memory_bytes is not None and report.peak_memory_bytes >= 300 * MB
    assert task.summary() == {"n": 4, "sum": 0 + 1 + 4 + 9}


# -- simrun-exec without a cgroup ---------------------------------------------------------------


def test_a_command_above_the_memory_limit_is_killed_and_exec_exits_137(make_task) -> None:
    task = copy_task(make_task, memory_mb=200, sleep_s=30)
    process = task.run("simrun-exec", SIMRUN_MEMORY_LIMIT_GB="0.125", **ENFORCED)
    assert process.returncode == 137, process.stderr_text
    assert not alive(started(task)["pid"])
    report = task.report("copy")
    assert (report.exit_code, report.failed, report.oom_kills) == (137, False, 1)
    assert report.message.startswith("the command was killed: signal SIGKILL; the command (pid")
    assert "above the 128 MiB of SIMRUN_MEMORY_LIMIT_GB=0.125" in report.message
    assert report.memory_limit_bytes == GIB // 8


def test_a_command_within_the_memory_limit_runs_to_its_end(make_task) -> None:
    task = copy_task(make_task, memory_mb=100, sleep_s=1)
    process = task.run("simrun-exec", SIMRUN_MEMORY_LIMIT_GB="0.25", **ENFORCED)
    assert process.returncode == 0, process.stderr_text
    report = task.report("copy")
    assert (report.exit_code, report.oom_kills) == (0, 0)
    assert report.peak_memory_bytes is not None and report.peak_memory_bytes >= 100 * MIB


def test_a_command_above_a_limit_not_declared_real_runs_to_its_end(make_task) -> None:
    task = copy_task(make_task, memory_mb=200, sleep_s=1)
    process = task.run("simrun-exec", SIMRUN_MEMORY_LIMIT_GB="0.125")
    assert process.returncode == 0, process.stderr_text
    report = task.report("copy")
    assert (report.exit_code, report.oom_kills, report.memory_limit_bytes) == (0, 0, GIB // 8)
    assert report.peak_memory_bytes is not None and report.peak_memory_bytes >= 200 * MIB


# -- in a cgroup: the kernel kills, the harness reads the evidence ------------------------------


def _gated_task(make_task, tmp_path: Path, n: int) -> tuple[HarnessTask, Path]:
    task: HarnessTask = make_task({"n": n}, task_type=GATED)
    root = make_cgroup(
        tmp_path / "cgroup",
        cpu_max="200000 100000\n",
        memory_max=f"{GIB}\n",
        memory_stat="file 500000000\nanon 111111111\n",
        memory_events="oom 1\noom_kill 1\n",
        cpu_stat="throttled_usec 1000000\n",
    )
    task.env.update(SIMRUN_MEMORY_SOURCE="cgroup", SIMRUN_CGROUP_ROOT=str(root))
    return task, root


def test_a_worker_reports_the_usage_of_its_cgroup(make_task, tmp_path: Path) -> None:
    task, root = _gated_task(make_task, tmp_path, n=4)
    worker = task.start("simrun-worker", SIMRUN_CORES=None)
    in_flight = IN_FLIGHT_PER_PROCESS * min(2, len(os.sched_getaffinity(0)))  # the quota's 2
    wait_until(lambda: len(task.units_started()) == min(4, in_flight), what="units in flight")
    write_cgroup(
        root,
        memory_stat="file 1\nanon 222222222\n",
        cpu_stat="throttled_usec 3500000\n",
    )
    (task.task_dir / "gate").touch()
    task.finish(worker)
    assert worker.returncode == 0, worker.stderr_text
    report = task.report()
    assert report.processes == min(2, len(os.sched_getaffinity(0)))  # the quota's 2 cores
    assert report.memory_limit_bytes == GIB
    assert report.peak_memory_bytes == 222222222
    assert report.throttled_seconds == 2.5
    assert report.oom_kills == 0
    assert task.summary() == {"n": 4, "sum": 0 + 1 + 4 + 9}


def test_a_kill_in_the_cgroup_is_reported_as_a_kill_for_memory(make_task, tmp_path: Path) -> None:
    task, root = _gated_task(make_task, tmp_path, n=4)
    worker = task.start("simrun-worker", SIMRUN_CORES=None)
    wait_until(lambda: len(task.units_started()) >= 1, what="a unit in flight")
    pool = wait_until(lambda: pool_processes(worker), what="the pool processes")
    write_cgroup(root, memory_events="oom 2\noom_kill 2\n")  # as the kernel counts its kill
    os.kill(pool[0], signal.SIGKILL)
    task.finish(worker)
    assert worker.returncode == 137, worker.stderr_text
    report = task.report()
    assert (report.exit_code, report.oom_kills, report.failed) == (137, 1, False)
    assert report.message.startswith("a process of the pool died (killed?)")
    assert task.ledger(4).claims() == {}
    assert not any(isinstance(event, UNITS_EVENTS) for event in task.events())
