"""A run of a snapshotted model in the image of its environment on the fake cluster: a
Supervisor with `ClusterEnvironments` and the Argo backend, the model's environment resolved by
real uv (offline, `environment_models`), its image built by the Job of `buildctl` (the stand-in
pushing to the fake registry, as in test_images.py), then the pods run in that image and install
the snapshots of the run (`SIMRUN_EDITABLE`) before their work.

An image cannot run here: the fake kubelet runs the pods' commands on this machine. What stands
in for the image is a venv of the test (`image`) that has what the image's Dockerfile installs,
the third party dependencies and the build backends of the lock, and simrun (the site packages
of this interpreter, through a `.pth`), first on the pods' `PATH`: the harness installs the
snapshots into it (never into this interpreter's environment), offline and without build
isolation, as in a pod. The task type of the run is the model's own (`envprobe.squares`,
registered by the model's entry point, so the pods find it only once the model is installed)
and its units use the library, which no path but its editable install reaches.
"""

from __future__ import annotations

import asyncio
import os
import site
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from cluster_runs import HARNESS_ENV, kinds, submitted
from environment_models import (
    CONSTRAINTS,
    Wheelhouse,
    make_sources,
    snapshot,
    uv,
    uv_offline,
)
from fake.cluster import FakeCluster, NodeSpec
from fake.kubelet import default_base_env
from fake.registry import FakeRegistry

from simrun_api.backends.argo import ArgoBackend
from simrun_api.cluster_environments import ClusterEnvironments
from simrun_api.index import RunIndex
from simrun_api.resources import ResourceStore
from simrun_api.supervisor import Supervisor
from simrun_core import events as ev
from simrun_core import launch as contract
from simrun_core.argo import labels
from simrun_core.argo.build import build_name
from simrun_core.cluster import ClusterConfig
from simrun_core.environment import build_inputs, lock_sha256
from simrun_core.plugins import ResourceHint, TaskType, load_task_types
from simrun_core.provenance import SourceProvenance
from simrun_core.store import RunPaths, read_log
from simrun_core.task_types.demo import SquaresSettings
from simrun_core.workflow import Priority, SplitMode, TaskSpec, Workflow

NS = "simrun"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
NODES = (NodeSpec("infra", worker=False), NodeSpec("node-1", cores=2, memory_gb=4.0))
FIRST, SECOND = "20260101-000000-e4e4e1", "20260101-000000-e4e4e2"
TIMEOUT_S = 60.0
N = 3
PROBE = TaskType(
    name="envprobe.squares",
    settings=SquaresSettings,
    outputs=("squares",),
    hint=ResourceHint(memory_base_gb=0.125, memory_per_worker_gb=0.25),
    count_units="simrun_core.task_types.demo:count_units",
    setup="simrun_core.task_types.demo:setup",
    compute_unit="envmodel:compute_unit",
    merge="envmodel:merge",
)
"""The model's task type as the service knows it (`envmodel.SQUARES`): the service never
imports the model, the pods do."""


@pytest.fixture
def wheelhouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Wheelhouse:
    wheels = Wheelhouse(tmp_path / "wheels")
    uv_offline(monkeypatch, wheels)
    return wheels


@pytest.fixture
def image(tmp_path: Path, wheelhouse: Wheelhouse) -> Path:
    """The venv standing in for the image: the lock's requirements, simrun, its entry points."""
    venv = tmp_path / "image"
    uv("venv", "--quiet", "--python", sys.executable, str(venv), cwd=tmp_path)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    here = [path for path in site.getsitepackages() if Path(path).is_dir()]
    (Path(purelib) / "simrun_of_the_tests.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({path!r})" for path in here) + "\n"
    )
    requirements = ["tiny-backend==1.0", "tiny-dep==1.0", "tiny-editables==1.0"]
    uv("pip", "install", "--quiet", "--python", str(python), *requirements, cwd=tmp_path)
    for entry, function in (
        ("simrun-worker", "simrun_harness.worker:main"),
        ("simrun-merge", "simrun_harness.worker:merge_main"),
        ("simrun-exec", "simrun_harness.exec:main"),
    ):
        module, _, name = function.partition(":")
        script = venv / "bin" / entry
        script.write_text(
            f"#!{python}\nimport sys\nfrom {module} import {name}\nsys.exit({name}())\n"
        )
        script.chmod(0o755)
    return venv


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    with FakeRegistry() as served:
        yield served


@pytest.fixture
def cluster(tmp_path: Path, registry: FakeRegistry, image: Path) -> Iterator[FakeCluster]:
    config = ClusterConfig(registry=registry.host, ttl_after_finished_s=3600)
    pod_tmp = tmp_path / "pod-tmp"
    pod_tmp.mkdir()
    env = {
        **HARNESS_ENV,
        "PATH": os.pathsep.join([str(image / "bin"), default_base_env()["PATH"]]),
        "TMPDIR": str(pod_tmp),  # the shadow trees of the installed snapshots
    }
    env.pop("VIRTUAL_ENV", None)
    with FakeCluster(tmp_path / "cluster", nodes=NODES, config=config, env_overrides=env) as served:
        yield served


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    path = tmp_path / "dist" / "simrun-0.1.0-py3-none-any.whl"
    path.parent.mkdir()
    path.write_bytes(b"PK\x03\x04 the simrun wheel of the service")
    return path


def sources_of(tmp_path: Path, store: Path) -> list[SourceProvenance]:
    model, library = make_sources(tmp_path / "src", PYTHON)
    return [snapshot(store, "envmodel", model), snapshot(store, "tinylib", library)]


def event_of(run_id: str, sources: list[SourceProvenance]) -> tuple[ev.Submitted, dict]:
    workflow = Workflow(
        name="environment", tasks=[TaskSpec(id="squares", type=PROBE.name, settings={"n": N})]
    )
    workers = [node for node in NODES if node.worker]
    types = {**load_task_types(), PROBE.name: PROBE}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("cluster_runs.load_task_types", lambda: types)
        event, settings = submitted(
            run_id, workflow, workers, Priority.STANDARD, mode=SplitMode.SINGLE_SERVER, max_pods=1
        )
    return msgspec.structs.replace(event, sources=sources), settings


async def run_both(
    cluster: FakeCluster, db: Path, sources: list[SourceProvenance], wheel: Path, constraints: Path
) -> tuple[list[ev.Event], list[ev.Event]]:
    backend = ArgoBackend(cluster.config, configuration=cluster.configuration())
    backend.images.poll_s = 0.05
    environments = ClusterEnvironments(
        cluster.store_dir,
        backend,
        cluster.config,
        python=PYTHON,
        simrun_wheel=wheel,
        build_constraints=constraints,
    )
    index, resources = RunIndex(db), ResourceStore(db)
    await index.open()
    await resources.open()
    types = {**load_task_types(), PROBE.name: PROBE}
    supervisor = Supervisor(
        cluster.store_dir, backend, types, index, resources, environments=environments
    )
    await supervisor.start()
    logs = []
    try:
        for run_id in (FIRST, SECOND):
            await supervisor.submit(*event_of(run_id, sources))
            async with asyncio.timeout(TIMEOUT_S):
                while not supervisor.load(run_id).ended:
                    assert cluster.errors == []
                    await asyncio.sleep(0.05)
            logs.append(read_log(RunPaths(cluster.store_dir, run_id).events))
    finally:
        await supervisor.close()
        await environments.close()
        await backend.close()
        await resources.close()
        await index.close()
    return logs[0], logs[1]


def test_a_run_builds_the_image_of_its_environment_and_its_pods_install_the_snapshots(
    tmp_path: Path, cluster: FakeCluster, registry: FakeRegistry, wheel: Path
) -> None:
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(CONSTRAINTS)
    sources = sources_of(tmp_path, cluster.store_dir)
    first, second = asyncio.run(
        run_both(cluster, tmp_path / "db.sqlite", sources, wheel, constraints)
    )
    assert cluster.errors == []
    seen = kinds(first)
    assert seen[-1] == "succeeded", (seen, [e for e in first if isinstance(e, ev.PodFailed)])
    assert seen[:4] == ["submitted", "environment-resolved", "built", "workflow-submitted"]

    resolved = next(e for e in first if isinstance(e, ev.EnvironmentResolved))
    built = next(e for e in first if isinstance(e, ev.Built))
    image = resolved.image
    assert image is not None and image.startswith(f"{registry.host}/simrun-env:")
    lock = RunPaths(cluster.store_dir, FIRST).environment_lock.read_text()
    assert resolved.lock_sha256 == lock_sha256(lock, PYTHON)
    assert (built.image, built.cached) == (image, False)
    assert built.seconds is not None and built.seconds > 0
    assert registry.has("simrun-env", image.rsplit(":", 1)[1])

    # the build: one Job of buildctl, its context the Dockerfile kept in the store and the wheel
    assert cluster.store.created[("jobs", NS, build_name(image))] == 1
    dockerfile = (build_inputs(cluster.store_dir, image) / "Dockerfile").read_text()
    for requirement in ("tiny-backend==1.0", "tiny-dep==1.0", "tiny-editables==1.0"):
        assert requirement in dockerfile.splitlines()  # what the image venv of the test has
    assert f"FROM {registry.host}/{cluster.config.base_image}" in dockerfile

    # the pods ran in the image with the snapshots of the run to install, in their order
    pods, _ = cluster.store.list("pods", NS, labels={labels.RUN: FIRST})
    assert pods
    editable = [f"{cluster.config.store_mount}/{source.snapshot}" for source in sources]
    for pod in pods:
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "main"]
        assert container["image"] == image
        env = {entry["name"]: entry.get("value") for entry in container["env"]}
        assert env[contract.EDITABLE].splitlines() == editable
    log = "".join(
        cluster.store.read_log(NS, pod["metadata"]["name"], "main").decode() for pod in pods
    )
    assert "simrun: installing the sources: " in log

    # their units imported the library from its snapshot, through its editable install
    summary = msgspec.json.decode(
        (RunPaths(cluster.store_dir, FIRST).out("squares") / "summary.json").read_bytes()
    )
    assert summary["sum"] == sum(index * index for index in range(N))
    library = Path(summary["library"])
    snapshots = cluster.store_dir / "snapshots"
    assert library.resolve().parent == (cluster.store_dir / sources[1].snapshot).resolve()
    assert snapshots.resolve() not in library.parents, "imported from the shadow of its install"
    assert Path(summary["model"]).resolve().is_relative_to(snapshots.resolve() / "envmodel")

    # the second run of the same environment finds the image: no second build
    assert kinds(second)[-1] == "succeeded", kinds(second)
    again = next(e for e in second if isinstance(e, ev.Built))
    assert (again.image, again.cached, again.seconds) == (image, True, None)
    second_resolved = next(e for e in second if isinstance(e, ev.EnvironmentResolved))
    assert second_resolved.lock_sha256 == resolved.lock_sha256
    assert cluster.store.created[("jobs", NS, build_name(image))] == 1
