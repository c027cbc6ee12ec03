"""The snapshots a harness installs (`SIMRUN_EDITABLE` of the launch contract) and the pure parts
of `simrun_core.editable`: the names of shadow trees and the installer's arguments."""

from __future__ import annotations

from core_samples import RUN_ID
from hypothesis import given
from hypothesis import strategies as st

from simrun_core import events as ev
from simrun_core import launch as contract
from simrun_core.editable import editable_arguments, shadow_names
from simrun_core.fold import fold
from simrun_core.launch import Launch, LaunchEnv
from simrun_core.provenance import SourceProvenance
from simrun_core.workflow import Workflow

TASK_DIR = f"/store/runs/{RUN_ID}/tasks/fit"
HASH = "a" * 64


def test_the_snapshots_to_install_go_through_the_environment_a_line_each() -> None:
    snapshots = (f"snapshots/model/{HASH}", f"/mnt/store/snapshots/lib/{HASH}")
    launch = Launch(task_dir=TASK_DIR, task_type="t", worker="w0", node="n", editable=snapshots)
    env = launch.to_env()
    assert env[contract.EDITABLE] == "\n".join(snapshots)
    assert Launch.from_env(env) == launch
    bare = Launch(task_dir=TASK_DIR, task_type="t", worker="w0", node="n")
    assert contract.EDITABLE not in bare.to_env(), "none: the variable is left out"
    assert LaunchEnv({contract.EDITABLE: "\n a \n\n b\n"}).editable == ("a", "b")


@given(st.lists(st.text("abc/-_.", min_size=1, max_size=10), max_size=5))
def test_editable_round_trips(paths: list[str]) -> None:
    cleaned = tuple(path.strip() for path in paths if path.strip())
    launch = Launch(task_dir=TASK_DIR, task_type="t", worker="w0", node="n", editable=cleaned)
    assert Launch.from_env(launch.to_env()).editable == cleaned


def test_the_snapshots_of_a_run_are_those_of_its_sources_with_one() -> None:
    sources = [
        SourceProvenance(name="model", snapshot=f"snapshots/model/{HASH}"),
        SourceProvenance(name="recorded", path="/home/a/recorded"),
        SourceProvenance(name="lib", snapshot=f"snapshots/lib/{HASH}"),
    ]
    workflow = Workflow(name="w", tasks=[])
    submitted = ev.Submitted(
        seq=1, run=RUN_ID, workflow=workflow, submitted_by="a", owner="a", sources=sources
    )
    record = fold([submitted])
    assert contract.editable_snapshots(record, "/store") == (
        f"/store/snapshots/model/{HASH}",
        f"/store/snapshots/lib/{HASH}",
    )


def test_shadow_trees_are_named_after_their_sources_once_each() -> None:
    snapshots = [
        f"/s/snapshots/model/{HASH}",
        f"/s/snapshots/lib/{HASH}",
        "/elsewhere/model",
        "/work/tree",
    ]
    assert shadow_names(snapshots) == ["model", "lib", "model-2", "tree"]


def test_the_installer_arguments_of_a_pod_build_offline_without_isolation() -> None:
    assert editable_arguments("uv", ["/a", "/b"], isolated=False) == [
        "--no-deps",
        "--no-build-isolation",
        "--offline",
        "-e",
        "/a",
        "-e",
        "/b",
    ]
    assert editable_arguments("pip", ["/a"], isolated=False) == [
        "--no-deps",
        "--disable-pip-version-check",
        "--no-input",
        "--no-build-isolation",
        "--no-index",
        "-e",
        "/a",
    ]
    assert editable_arguments("uv", ["/a"], isolated=True) == ["--no-deps", "-e", "/a"]
