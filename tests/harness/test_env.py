"""The environment contract of the harness, its sizing, and the cgroup and procfs readers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from importlib.metadata import EntryPoint, EntryPoints
from pathlib import Path

import pytest

from simrun_core import plugins
from simrun_core.plugins import ENTRY_POINT_GROUP, load_task_types
from simrun_core.task_types.demo import SQUARES
from simrun_harness import cgroup
from simrun_harness.env import (
    GIB,
    identity_from_env,
    paths_from_env,
    processes,
    sizing_from_env,
    staged_ports,
    task_type_from_env,
    timing_from_env,
)
from simrun_harness.errors import ConfigurationError
from simrun_harness.memory import MemorySampler, process_tree_anon

from .helpers import RUN_ID, wait_until


@pytest.fixture
def task_dir(tmp_path: Path) -> Path:
    path = tmp_path / "store" / "runs" / RUN_ID / "tasks" / "fit"
    path.mkdir(parents=True)
    return path


def test_paths_from_env(task_dir: Path) -> None:
    store = task_dir.parents[3]
    paths = paths_from_env(
        {
            "SIMRUN_TASK_DIR": str(task_dir),
            "SIMRUN_INPUTS": f"model=runs/{RUN_ID}/tasks/a/out/m\n\ndata=/abs/data\n",
            "SIMRUN_SCRATCH": "/tmp/scratch-x",
        }
    )
    assert paths.store == store
    assert paths.run_dir == store / "runs" / RUN_ID
    assert paths.out == task_dir / "out"
    assert paths.inputs == {
        "model": store / "runs" / RUN_ID / "tasks" / "a" / "out" / "m",
        "data": Path("/abs/data"),
    }
    assert paths.scratch == Path("/tmp/scratch-x")
    assert paths_from_env({"SIMRUN_TASK_DIR": str(task_dir)}).scratch == Path("/scratch")


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({}, "SIMRUN_TASK_DIR is not set"),
        ({"SIMRUN_TASK_DIR": "/tmp/not/a/task"}, "SIMRUN_TASK_DIR"),
        ({"SIMRUN_INPUTS": "model"}, "SIMRUN_INPUTS: line 1 'model' is not port=path"),
        ({"SIMRUN_INPUTS": "a=x\na=y"}, "SIMRUN_INPUTS: line 2: port 'a' given twice"),
    ],
)
def test_paths_errors_name_the_variable(task_dir: Path, env: dict[str, str], variable: str) -> None:
    if "SIMRUN_TASK_DIR" not in env and env:
        env = {"SIMRUN_TASK_DIR": str(task_dir), **env}
    with pytest.raises(ConfigurationError, match=variable):
        paths_from_env(env)


def test_staged_ports_must_be_inputs(task_dir: Path) -> None:
    env = {"SIMRUN_TASK_DIR": str(task_dir), "SIMRUN_INPUTS": "a=x", "SIMRUN_STAGE": "a\n"}
    assert staged_ports(env, paths_from_env(env)) == ["a"]
    env["SIMRUN_STAGE"] = "b"
    with pytest.raises(ConfigurationError, match="SIMRUN_STAGE: port 'b' is no input"):
        staged_ports(env, paths_from_env(env))


def test_identity_defaults_and_errors(task_dir: Path) -> None:
    identity = identity_from_env({"SIMRUN_TASK_DIR": str(task_dir), "SIMRUN_NODE": "n1"})
    assert (identity.task, identity.worker, identity.attempt, identity.node) == (
        "fit",
        "fit",
        0,
        "n1",
    )
    assert identity.events_path == task_dir / "events" / "fit.0.jsonl"
    for variable, value in (
        ("SIMRUN_ATTEMPT", "x"),
        ("SIMRUN_ATTEMPT", "-1"),
        ("SIMRUN_WORKER", "a/b"),
    ):
        with pytest.raises(ConfigurationError, match=variable):
            identity_from_env({"SIMRUN_TASK_DIR": str(task_dir), variable: value})


def test_task_type_by_name_or_reference() -> None:
    assert task_type_from_env({"SIMRUN_TASK_TYPE": "demo.squares"}) is SQUARES
    reference = "simrun_core.task_types.demo:SQUARES"
    assert task_type_from_env({"SIMRUN_TASK_TYPE": reference}) is SQUARES
    with pytest.raises(ConfigurationError, match="SIMRUN_TASK_TYPE: unknown task type 'nope'"):
        task_type_from_env({"SIMRUN_TASK_TYPE": "nope"})
    with pytest.raises(ConfigurationError, match="SIMRUN_TASK_TYPE: 'os:sep' is no TaskType"):
        task_type_from_env({"SIMRUN_TASK_TYPE": "os:sep"})
    with pytest.raises(ConfigurationError, match="SIMRUN_TASK_TYPE: cannot import"):
        task_type_from_env({"SIMRUN_TASK_TYPE": "no_such_module_x:T"})


def test_a_task_type_by_name_imports_no_other_entry_point(monkeypatch) -> None:
    """A broken plugin of another type does not stop the harness of this one."""
    found = EntryPoints(
        [
            EntryPoint("broken", "simrun_no_such_plugin_module:TYPE", ENTRY_POINT_GROUP),
            EntryPoint("demo.squares", "simrun_core.task_types.demo:SQUARES", ENTRY_POINT_GROUP),
        ]
    )

    def entry_points(*, name: str | None = None) -> EntryPoints:
        return found if name is None else found.select(name=name)

    monkeypatch.setattr(plugins, "_entry_points", entry_points)
    assert task_type_from_env({"SIMRUN_TASK_TYPE": "demo.squares"}) is SQUARES
    message = (
        "SIMRUN_TASK_TYPE: the task types do not load: No module named "
        "'simrun_no_such_plugin_module'"
    )
    with pytest.raises(ConfigurationError) as info:
        task_type_from_env({"SIMRUN_TASK_TYPE": "nope"})  # looks at every entry point
    assert str(info.value) == message


def test_an_unknown_task_type_names_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as info:
        task_type_from_env({"SIMRUN_TASK_TYPE": "nope"})
    known = ", ".join(sorted(load_task_types()))
    assert str(info.value) == f"SIMRUN_TASK_TYPE: unknown task type 'nope' (known: {known})"


def test_timing_defaults_and_errors() -> None:
    timing = timing_from_env({})
    assert (timing.grace_s, timing.heartbeat_s, timing.stale_s) == (60.0, 30.0, 120.0)
    assert timing_from_env({"SIMRUN_GRACE_S": "5"}).stale_s == 65.0
    assert timing_from_env({"SIMRUN_HEARTBEAT_S": "0.2"}).poll_s == 0.2
    for variable, value in (("SIMRUN_HEARTBEAT_S", "0"), ("SIMRUN_GRACE_S", "-1")):
        with pytest.raises(ConfigurationError, match=variable):
            timing_from_env({variable: value})


def test_processes_by_cores_and_memory() -> None:
    assert processes(4, None, 2.0, 6.0) == 4
    assert processes(4, 20 * GIB, 2.0, 6.0) == 3
    assert processes(2, 20 * GIB, 2.0, 6.0) == 2
    # a base computed by subtraction must not lose a process to rounding
    assert processes(8, round(2.1 * GIB), 2.1 - 0.7 * 3, 0.7) == 3
    with pytest.raises(ValueError, match="leaves no room for one process"):
        processes(4, 4 * GIB, 2.0, 6.0)


def test_sizing_from_env() -> None:
    env = {
        "SIMRUN_MEMORY_SOURCE": "process",
        "SIMRUN_CORES": "3",
        "SIMRUN_MEMORY_LIMIT_GB": "1.0",
        "SIMRUN_MEMORY_BASE_GB": "0.5",
    }
    sizing = sizing_from_env(env, SQUARES)  # 0.25 GiB per process by the hint
    assert sizing.cores == min(3, len(os.sched_getaffinity(0)))
    assert sizing.processes == min(2, sizing.cores)
    assert sizing.memory_limit_bytes == GIB
    with pytest.raises(ConfigurationError, match="SIMRUN_MEMORY_LIMIT_GB"):
        sizing_from_env({**env, "SIMRUN_MEMORY_LIMIT_GB": "0.6"}, SQUARES)
    with pytest.raises(ConfigurationError, match="SIMRUN_CORES: '0' is less than 1"):
        sizing_from_env({**env, "SIMRUN_CORES": "0"}, SQUARES)
    with pytest.raises(ConfigurationError, match="SIMRUN_MEMORY_SOURCE: 'disk'"):
        sizing_from_env({**env, "SIMRUN_MEMORY_SOURCE": "disk"}, SQUARES)


def test_cgroup_files(tmp_path: Path) -> None:
    group = tmp_path / "sys" / "pod"
    group.mkdir(parents=True)
    (group / "cgroup.controllers").write_text("cpu memory\n")
    (group / "cpu.max").write_text("250000 100000\n")
    (group / "memory.max").write_text("1073741824\n")
    (group / "memory.stat").write_text("file 10\nanon 4096\nanon_thp 0\n")
    (group / "memory.events").write_text("low 0\noom 1\noom_kill 2\n")
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("0::/pod\n")
    assert cgroup.own_cgroup(tmp_path / "sys", proc_cgroup) == group
    assert cgroup.cpu_quota(group) == 2
    assert cgroup.memory_limit(group) == 1073741824
    assert cgroup.memory_anon(group) == 4096
    assert cgroup.memory_oom_kills(group) == 2
    (group / "cpu.max").write_text("max 100000\n")
    (group / "memory.max").write_text("max\n")
    assert cgroup.cpu_quota(group) is None
    assert cgroup.memory_limit(group) is None
    assert cgroup.memory_anon(tmp_path) is None
    assert cgroup.own_cgroup(tmp_path / "nothing", proc_cgroup) is None


def test_process_tree_anon_counts_children() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); "
            "print('ok', flush=True); import time; time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ok\n"
        own = process_tree_anon(child.pid)
        assert own is not None and own >= 64 << 20
        tree = wait_until(lambda: process_tree_anon(os.getpid()), what="the tree's memory")
        assert tree >= own
        sampler = MemorySampler(pid=os.getpid())
        sampler.sample()
        assert sampler.peak is not None and sampler.peak >= own
    finally:
        child.kill()
        child.wait()
    assert process_tree_anon(child.pid) is None


def test_process_started_is_the_start_of_the_process_not_of_the_call() -> None:
    code = (
        "import time; time.sleep(0.5); from simrun_harness.signals import process_started; "
        "print(process_started(), time.time())"
    )
    before = time.time()
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert output.returncode == 0, output.stderr
    started, called = map(float, output.stdout.split())
    assert before - 0.05 <= started <= called - 0.45  # clock ticks of 10 ms, twice
