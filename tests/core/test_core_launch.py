"""The launch contract (`simrun_core.launch`) and the ledger layout (`ledger_layout`)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from core_samples import NODE, RUN_ID, T0
from hypothesis import given, settings
from hypothesis import strategies as st

from simrun_core import launch as contract
from simrun_core import ledger_layout as layout
from simrun_core.fold import RunRecord
from simrun_core.launch import Launch, LaunchEnv, LaunchError, launch_for
from simrun_core.planner import plan_task
from simrun_core.plugins import ResourceHint, TaskType, load_task_types
from simrun_core.resources import ResolvedResources, resolve_resources
from simrun_core.workflow import Priority, SplitMode, TaskSpec, Workflow

STORE = "/data/store"
TASK_DIR = f"{STORE}/runs/{RUN_ID}/tasks/fit"


class ToolSettings(msgspec.Struct):
    level: int = 1


TOOL = TaskType(
    name="test.tool",
    settings=ToolSettings,
    inputs=("data",),
    hint=ResourceHint(memory_base_gb=0.5, memory_per_worker_gb=1.5),
    command=("tool", "--settings={settings}", "--out={out}", "{input}"),
)


# -- to_env and from_env ------------------------------------------------------------------------

_NAMES = st.text("abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=12)
_PATHS = st.lists(_NAMES, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
_WORKERS = st.from_regex(layout.WORKER_ID, fullmatch=True)
_NON_NEGATIVE = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
_POSITIVE = st.floats(min_value=0.0, max_value=1e6, exclude_min=True, allow_nan=False)


@st.composite
def launches(draw: st.DrawFn) -> Launch:
    """Any launch the harness can be started with."""
    task_dir = f"{draw(_PATHS)}/runs/{draw(_NAMES)}/tasks/{draw(_NAMES)}"
    inputs = draw(st.dictionaries(_NAMES, st.one_of(_NAMES, _PATHS), max_size=3))
    stage = draw(st.lists(st.sampled_from(sorted(inputs)), unique=True)) if inputs else []
    return Launch(
        task_dir=task_dir,
        task_type=draw(st.one_of(_NAMES, st.just("simrun_core.task_types.demo:SQUARES"))),
        worker=draw(_WORKERS),
        node=draw(_NAMES),
        entry=draw(st.sampled_from([None, "worker", "exec"])),
        attempt=draw(st.integers(0, 10**6)),
        role=draw(st.sampled_from(["base", "extra"])),
        merge=draw(st.booleans()),
        inputs=inputs,
        stage=tuple(stage),
        scratch=draw(_PATHS),
        provenance=draw(st.none() | _PATHS),
        cores=draw(st.none() | st.integers(1, 512)),
        memory_limit_gb=draw(st.none() | _POSITIVE),
        memory_base_gb=draw(st.none() | _NON_NEGATIVE),
        memory_per_worker_gb=draw(st.none() | _NON_NEGATIVE),
        memory_source=draw(st.sampled_from(["cgroup", "process"])),
        memory_enforced=draw(st.booleans()),
        grace_s=draw(_NON_NEGATIVE),
        heartbeat_s=draw(_POSITIVE),
        stale_s=draw(st.none() | _POSITIVE),
        memory_sample_s=draw(_POSITIVE),
        cgroup_root=draw(st.sampled_from(["/sys/fs/cgroup"]) | _PATHS),
    )


@settings(max_examples=300, deadline=None)
@given(launches())
def test_from_env_reads_back_what_to_env_writes(launch: Launch) -> None:
    env = launch.to_env()
    assert all(isinstance(value, str) for value in env.values())
    assert Launch.from_env(env) == launch
    assert Launch.from_env(env, default_worker="other") == launch  # SIMRUN_WORKER is set


def test_to_env_writes_the_variables_of_the_harness() -> None:
    launch = Launch(
        task_dir=TASK_DIR,
        task_type="demo.squares",
        worker="w0",
        node="node-1",
        entry="worker",
        attempt=2,
        role="base",
        merge=True,
        inputs={"model": "runs/r/tasks/a/out/m", "data": "/abs/data"},
        stage=("data",),
        scratch="/scratch/x",
        provenance=f"{TASK_DIR}/provenance.json",
        cores=4,
        memory_limit_gb=8.0,
        memory_base_gb=2.0,
        memory_per_worker_gb=1.5,
        memory_source="process",
        grace_s=10.0,
    )
    assert launch.to_env() == {
        "SIMRUN_RUN": RUN_ID,
        "SIMRUN_ENTRY": "worker",
        "SIMRUN_TASK_DIR": TASK_DIR,
        "SIMRUN_TASK_TYPE": "demo.squares",
        "SIMRUN_INPUTS": "model=runs/r/tasks/a/out/m\ndata=/abs/data",
        "SIMRUN_STAGE": "data",
        "SIMRUN_SCRATCH": "/scratch/x",
        "SIMRUN_PROVENANCE": f"{TASK_DIR}/provenance.json",
        "SIMRUN_WORKER": "w0",
        "SIMRUN_ATTEMPT": "2",
        "SIMRUN_ROLE": "base",
        "SIMRUN_MERGE": "1",
        "SIMRUN_NODE": "node-1",
        "SIMRUN_CORES": "4",
        "SIMRUN_MEMORY_LIMIT_GB": "8",
        "SIMRUN_MEMORY_BASE_GB": "2",
        "SIMRUN_MEMORY_PER_WORKER_GB": "1.5",
        "SIMRUN_MEMORY_SOURCE": "process",
        "SIMRUN_MEMORY_ENFORCED": "0",
        "SIMRUN_GRACE_S": "10",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    assert (launch.run, launch.task, launch.store) == (RUN_ID, "fit", STORE)
    timing = msgspec.structs.replace(
        launch, heartbeat_s=0.2, stale_s=3.0, memory_sample_s=0.05, cgroup_root="/tmp/cg"
    ).to_env()
    assert (timing["SIMRUN_HEARTBEAT_S"], timing["SIMRUN_STALE_S"]) == ("0.2", "3")
    assert (timing["SIMRUN_MEMORY_SAMPLE_S"], timing["SIMRUN_CGROUP_ROOT"]) == ("0.05", "/tmp/cg")


def test_from_env_has_the_defaults_of_the_harness() -> None:
    env = {"SIMRUN_TASK_DIR": TASK_DIR, "SIMRUN_TASK_TYPE": "demo.squares"}
    launch = Launch.from_env(env)
    assert launch == Launch(
        task_dir=TASK_DIR, task_type="demo.squares", worker="fit", node=socket.gethostname()
    )
    assert (launch.attempt, launch.role, launch.merge, launch.entry) == (0, "extra", False, None)
    assert (launch.inputs, launch.stage, launch.scratch) == ({}, (), "/scratch")
    assert (launch.cores, launch.memory_limit_gb, launch.memory_source) == (None, None, "cgroup")
    assert (launch.memory_base_gb, launch.memory_per_worker_gb) == (None, None)
    assert launch.memory_enforced is False  # unless told, a limit only sizes the pool
    assert Launch.from_env({**env, "SIMRUN_MEMORY_ENFORCED": "1"}).memory_enforced is True
    assert (launch.grace_s, launch.heartbeat_s, launch.stale_after_s) == (60.0, 30.0, 120.0)
    assert (launch.memory_sample_s, launch.cgroup_root) == (0.2, "/sys/fs/cgroup")
    assert Launch.from_env({**env, "SIMRUN_GRACE_S": "5"}).stale_after_s == 65.0
    assert Launch.from_env(env, default_worker="merge").worker == "merge"
    assert Launch.from_env({**env, "SIMRUN_WORKER": "", "SIMRUN_ROLE": ""}).worker == "fit"
    relative = Launch.from_env({**env, "SIMRUN_TASK_DIR": f"runs/{RUN_ID}/tasks/fit"})
    assert relative.task_dir == str(Path.cwd() / "runs" / RUN_ID / "tasks" / "fit")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"SIMRUN_TASK_DIR": None}, "SIMRUN_TASK_DIR is not set"),
        (
            {"SIMRUN_TASK_DIR": "/tmp/not/a/task"},
            "SIMRUN_TASK_DIR: '/tmp/not/a/task' is not of the form <store>/runs/<run>/tasks/<task>",
        ),
        ({"SIMRUN_TASK_DIR": "/s/jobs/r/tasks/t"}, "SIMRUN_TASK_DIR: '/s/jobs/r/tasks/t' is not"),
        ({"SIMRUN_TASK_TYPE": ""}, "SIMRUN_TASK_TYPE is not set"),
        ({"SIMRUN_WORKER": "a/b"}, "SIMRUN_WORKER: 'a/b' is no valid worker id"),
        ({"SIMRUN_WORKER": ".hidden"}, "SIMRUN_WORKER: '.hidden' is no valid worker id"),
        ({"SIMRUN_ATTEMPT": "first"}, "SIMRUN_ATTEMPT: 'first' is not an integer"),
        ({"SIMRUN_ATTEMPT": "-1"}, "SIMRUN_ATTEMPT: '-1' is less than 0"),
        ({"SIMRUN_ENTRY": "merge"}, "SIMRUN_ENTRY: 'merge' is neither 'worker' nor 'exec'"),
        ({"SIMRUN_ROLE": "boss"}, "SIMRUN_ROLE: 'boss' is neither 'base' nor 'extra'"),
        ({"SIMRUN_MERGE": "yes"}, "SIMRUN_MERGE: 'yes' is neither '0' nor '1'"),
        (
            {"SIMRUN_MEMORY_ENFORCED": "true"},
            "SIMRUN_MEMORY_ENFORCED: 'true' is neither '0' nor '1'",
        ),
        ({"SIMRUN_INPUTS": "model"}, "SIMRUN_INPUTS: line 1 'model' is not port=path"),
        ({"SIMRUN_INPUTS": "=x"}, "SIMRUN_INPUTS: line 1 '=x' is not port=path"),
        ({"SIMRUN_INPUTS": "a=x\na=y"}, "SIMRUN_INPUTS: line 2: port 'a' given twice"),
        (
            {"SIMRUN_INPUTS": "a=x", "SIMRUN_STAGE": "b"},
            "SIMRUN_STAGE: port 'b' is no input of SIMRUN_INPUTS (inputs: a)",
        ),
        (
            {"SIMRUN_STAGE": "b"},
            "SIMRUN_STAGE: port 'b' is no input of SIMRUN_INPUTS (inputs: none)",
        ),
        ({"SIMRUN_CORES": "many"}, "SIMRUN_CORES: 'many' is not an integer"),
        ({"SIMRUN_CORES": "0"}, "SIMRUN_CORES: '0' is less than 1"),
        ({"SIMRUN_MEMORY_LIMIT_GB": "0"}, "SIMRUN_MEMORY_LIMIT_GB: '0' is not a number of more"),
        ({"SIMRUN_MEMORY_LIMIT_GB": "lots"}, "SIMRUN_MEMORY_LIMIT_GB: 'lots' is not a number"),
        (
            {"SIMRUN_MEMORY_BASE_GB": "-1"},
            "SIMRUN_MEMORY_BASE_GB: '-1' is not a number of at least",
        ),
        ({"SIMRUN_MEMORY_PER_WORKER_GB": "nan"}, "SIMRUN_MEMORY_PER_WORKER_GB: 'nan' is not a num"),
        ({"SIMRUN_MEMORY_SOURCE": "disk"}, "SIMRUN_MEMORY_SOURCE: 'disk' is neither 'cgroup' nor"),
        ({"SIMRUN_GRACE_S": "-1"}, "SIMRUN_GRACE_S: '-1' is not a number of at least 0"),
        ({"SIMRUN_HEARTBEAT_S": "0"}, "SIMRUN_HEARTBEAT_S: '0' is not a number of more than 0"),
        ({"SIMRUN_STALE_S": "inf"}, "SIMRUN_STALE_S: 'inf' is not a number of more than 0"),
        ({"SIMRUN_MEMORY_SAMPLE_S": "0"}, "SIMRUN_MEMORY_SAMPLE_S: '0' is not a number of more"),
        ({"SIMRUN_FIRST_ATTEMPTS": "w0"}, "SIMRUN_FIRST_ATTEMPTS: line 1 'w0' is not worker=N"),
        ({"SIMRUN_FIRST_ATTEMPTS": "w0=-1"}, "SIMRUN_FIRST_ATTEMPTS: line 1 'w0=-1' is not"),
        ({"SIMRUN_FIRST_ATTEMPTS": "a/b=1"}, "SIMRUN_FIRST_ATTEMPTS: line 1 'a/b=1' is not"),
        (
            {"SIMRUN_FIRST_ATTEMPTS": "w0=1\n\nw0=2"},
            "SIMRUN_FIRST_ATTEMPTS: line 3: worker 'w0' given twice",
        ),
    ],
)
def test_from_env_names_the_refused_variable(changes: dict[str, str | None], message: str) -> None:
    env = {"SIMRUN_TASK_DIR": TASK_DIR, "SIMRUN_TASK_TYPE": "demo.squares"}
    env.update({name: value for name, value in changes.items() if value is not None})
    for name in [name for name, value in changes.items() if value is None]:
        del env[name]
    with pytest.raises(LaunchError) as refused:
        Launch.from_env(env)
    assert str(refused.value).startswith(message)
    assert isinstance(refused.value, ValueError)


def test_the_attempt_counts_from_the_workers_first_attempt_of_its_template() -> None:
    """A pod template counting its attempts from 0 (Argo's `{{retries}}`) names the first
    attempt of each of its workers that ran before; a worker it does not name starts at 0."""
    first = contract.first_attempts_text({"w2": 1, "w0": 3, "w1": 0})
    assert first == "w0=3\nw2=1"
    assert contract.first_attempts_text({"w1": 0}) == ""
    env = {
        "SIMRUN_TASK_DIR": TASK_DIR,
        "SIMRUN_TASK_TYPE": "demo.squares",
        "SIMRUN_ATTEMPT": "2",
        "SIMRUN_FIRST_ATTEMPTS": first,
    }
    assert Launch.from_env({**env, "SIMRUN_WORKER": "w0"}).attempt == 5
    assert Launch.from_env({**env, "SIMRUN_WORKER": "w1"}).attempt == 2
    assert Launch.from_env({**env, "SIMRUN_WORKER": "w2", "SIMRUN_ATTEMPT": ""}).attempt == 1
    assert LaunchEnv(env).first_attempts == {"w0": 3, "w2": 1}
    launch = Launch.from_env({**env, "SIMRUN_WORKER": "w0"})
    assert Launch.from_env(launch.to_env()) == launch, "to_env writes the attempt itself"
    assert contract.FIRST_ATTEMPTS not in launch.to_env()
    with pytest.raises(ValueError, match="'w0': a first attempt of -1"):
        contract.first_attempts_text({"w0": -1})
    with pytest.raises(LaunchError, match="no valid worker id"):
        contract.first_attempts_text({"a/b": 1})


def test_a_launch_refuses_a_task_dir_or_worker_no_harness_could_use() -> None:
    with pytest.raises(LaunchError, match="SIMRUN_TASK_DIR: '/s/t' is not of the form"):
        Launch(task_dir="/s/t", task_type="x", worker="w0", node="n")
    with pytest.raises(LaunchError, match="SIMRUN_WORKER: 'w 0' is no valid worker id"):
        Launch(task_dir=TASK_DIR, task_type="x", worker="w 0", node="n")


def test_the_launch_imports_nothing_heavy() -> None:
    """Every harness process imports it first: no fold, store, events or planner (the names
    of the ledger's and the store's layouts only)."""
    code = (
        "import sys, simrun_core.launch; "
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('simrun'))))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert output.returncode == 0, output.stderr
    assert output.stdout.split() == [
        "simrun_core",
        "simrun_core.launch",
        "simrun_core.ledger_layout",
        "simrun_core.store_layout",
    ]


# -- launch_for -----------------------------------------------------------------------------------


def _record(resources: dict[str, ResolvedResources] | None = None) -> RunRecord:
    """A run of a split task, an exec task staging its output and a command task reading it."""
    workflow = Workflow(
        name="launches",
        tasks=[
            TaskSpec(id="squares", type="demo.squares", settings={"n": 3}),
            TaskSpec(
                id="tool",
                type="test.tool",
                inputs={"data": "squares.squares"},
                stage=["data"],
            ),
            TaskSpec(
                id="plot",
                type="command",
                settings={
                    "image": "tools:1",
                    "args": ["plot", "{input}"],
                    "cores": 1,
                    "memory_gb": 2.0,
                },
                inputs={"squares": "squares.squares"},
            ),
        ],
    )
    types = {**load_task_types(), TOOL.name: TOOL}
    plans = {}
    for task in workflow.tasks:
        task_type = types[task.type]
        decoded = task_type.decode_settings(task.settings)
        plans[task.id] = plan_task(
            task,
            task_type,
            resolve_resources(task, task_type, decoded),
            [NODE],
            SplitMode.FASTEST,
            Priority.OWNER,
            task_type.units(decoded),
        )
    return RunRecord(
        id=RUN_ID,
        workflow=workflow,
        submitted_by="alice",
        owner="alice",
        plans=plans,
        resources=resources or {},
        created=T0,
    )


def _launch(
    record: RunRecord, task: str, worker: str, task_type: TaskType, retry_memory: bool
) -> Launch:
    return launch_for(
        record,
        task,
        worker,
        3,
        task_type=task_type,
        store=Path(STORE),
        scratch=f"/scratch/{task}",
        node="node-1",
        cores=2,
        grace_s=10.0,
        memory_source="process",
        memory_enforced=False,
        retry_memory=retry_memory,
    )


@pytest.mark.parametrize("retry_memory", [False, True])
def test_launch_for_a_split_task(retry_memory: bool) -> None:
    squares = load_task_types()["demo.squares"]
    learned = ResolvedResources(memory_base_gb=0.75, memory_per_worker_gb=0.5)
    record = _record({"squares": learned})
    shape = record.plans["squares"].shape
    launch = _launch(record, "squares", "w0", squares, retry_memory=retry_memory)
    task_dir = f"{STORE}/runs/{RUN_ID}/tasks/squares"
    assert launch == Launch(
        task_dir=task_dir,
        task_type="demo.squares",
        worker="w0",
        node="node-1",
        entry="worker",
        attempt=3,
        role="base",
        merge=True,
        scratch="/scratch/squares",
        provenance=f"{task_dir}/provenance.json",
        cores=2,
        memory_limit_gb=float(shape.memory_gb),
        memory_base_gb=0.75,
        memory_per_worker_gb=shape.retry_per_worker_gb if retry_memory else shape.per_worker_gb,
        memory_source="process",
        grace_s=10.0,
    )
    assert shape.retry_per_worker_gb != shape.per_worker_gb
    env = launch.to_env()
    assert env["SIMRUN_MEMORY_PER_WORKER_GB"] == str(launch.memory_per_worker_gb)
    assert env["SIMRUN_MEMORY_ENFORCED"] == "0"  # the limit only sizes the pool
    extra = _launch(record, "squares", "w1", squares, retry_memory=retry_memory)
    assert (extra.role, extra.merge) == ("extra", False)


@pytest.mark.parametrize("retry_memory", [False, True])
def test_launch_for_an_exec_task(retry_memory: bool) -> None:
    record = _record()
    shape = record.plans["tool"].shape
    launch = _launch(record, "tool", "tool", TOOL, retry_memory=retry_memory)
    assert (launch.entry, launch.task_type, launch.worker, launch.task) == (
        "exec",
        "test.tool",
        "tool",
        "tool",
    )
    assert (launch.role, launch.merge) == ("base", True)
    assert launch.inputs == {"data": f"runs/{RUN_ID}/tasks/squares/out/squares"}
    assert launch.stage == ("data",)
    assert launch.memory_base_gb == 0.5  # the type's hint: nothing resolved
    assert launch.memory_limit_gb == (shape.retry_memory_gb if retry_memory else shape.memory_gb)
    expected = shape.retry_per_worker_gb if retry_memory else shape.per_worker_gb
    assert launch.memory_per_worker_gb == expected
    assert Launch.from_env(launch.to_env()) == launch


@pytest.mark.parametrize("retry_memory", [False, True])
def test_launch_for_a_command_task(retry_memory: bool) -> None:
    command = load_task_types()["command"]
    record = _record()
    shape = record.plans["plot"].shape
    launch = _launch(record, "plot", "plot", command, retry_memory=retry_memory)
    assert (launch.entry, launch.task_type, launch.role) == (None, "command", "base")
    assert launch.inputs == {"squares": f"runs/{RUN_ID}/tasks/squares/out/squares"}
    assert launch.memory_base_gb == command.hint.memory_base_gb
    expected = shape.retry_per_worker_gb if retry_memory else shape.per_worker_gb
    assert launch.memory_per_worker_gb == expected
    assert "SIMRUN_ENTRY" not in launch.to_env()
    assert launch.to_env()["SIMRUN_RUN"] == RUN_ID


# -- the ledger layout ------------------------------------------------------------------------


def test_the_ledger_layout() -> None:
    assert layout.SHARD_UNITS == 1000
    assert [layout.shard(i) for i in (0, 999, 1000, 123456)] == [0, 0, 1, 123]
    assert layout.shard(5, shard_units=2) == 2
    assert layout.claim_path(1234, 0) == "claim/1/1234.0"
    assert layout.release_path(1234, 2) == "release/1/1234.2"
    assert layout.done_path(999) == "done/0/999"
    assert layout.done_path(5, shard_units=2) == "done/2/5"
    assert layout.heartbeat_path("w0") == "heartbeats/w0"
    assert layout.epoch_name(7, 1) == "7.1"


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        ("1234.0", (1234, 0)),
        ("7", (7, None)),
        ("12.34", (12, 34)),
        ("7.", None),
        (".7", None),
        ("7.x", None),
        ("a", None),
        ("7.1.2", None),
        ("7\n", None),
        ("", None),
    ],
)
def test_ledger_entry_names(name: str, entry: tuple[int, int | None] | None) -> None:
    assert layout.parse_entry(name) == entry


def test_an_entry_counts_only_in_the_shard_of_its_unit() -> None:
    assert layout.in_its_shard("1234.0", "1")
    assert layout.in_its_shard("999", "0")
    assert not layout.in_its_shard("1234.0", "0")
    assert not layout.in_its_shard("junk", "0")
    assert not layout.in_its_shard("5", "x")
    assert layout.in_its_shard("5.0", "2", shard_units=2)
