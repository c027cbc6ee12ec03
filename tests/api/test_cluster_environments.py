"""`ClusterEnvironments`: runs resolved by real uv (offline, `environment_models`) and images
made sure of through a registry in memory: the lock and the build inputs in the store, one build
of an image however many runs ask at once (a cancelled one does not cancel it), an image found
in the registry not built again, a service started again building from the store, and every
failure a refusal saying why."""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from environment_models import (
    CONSTRAINTS,
    Wheelhouse,
    make_sources,
    snapshot,
    uv_offline,
    write_tree,
)

from simrun_api.backends.argo import ArgoBackend
from simrun_api.backends.fake import FakeBackend
from simrun_api.cluster_environments import (
    NO_WHEEL,
    ClusterEnvironments,
    environments_for,
    service_wheel,
)
from simrun_api.environments import EnvironmentRefused, Made, Resolved
from simrun_core.cluster import ClusterConfig
from simrun_core.environment import build_inputs, lock_sha256
from simrun_core.fold import RunRecord
from simrun_core.provenance import SourceProvenance
from simrun_core.store import RunPaths
from simrun_core.workflow import TaskSpec, Workflow

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
REGISTRY = "registry.test:5000"
WHEEL_NAME = "simrun-0.1.0-py3-none-any.whl"


class MemoryRegistry:
    """The images of a registry in memory; a build records its context and takes the image in,
    once `gate` (when set) opens, or fails with `fail`."""

    def __init__(self) -> None:
        self.images: set[str] = set()
        self.builds: list[tuple[str, dict[str, bytes]]] = []
        self.gate: asyncio.Event | None = None
        self.fail: str | None = None
        self.cancelled = 0

    async def has_image(self, ref: str) -> bool:
        if not ref.startswith(REGISTRY + "/"):
            raise ValueError(f"image {ref!r} is not in the registry of the cluster")
        return ref in self.images

    async def build_image(self, context: os.PathLike[str] | str, ref: str) -> None:
        files = {entry.name: entry.read_bytes() for entry in Path(context).iterdir()}
        self.builds.append((ref, files))
        try:
            if self.gate is not None:
                await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail:
            raise RuntimeError(self.fail)
        self.images.add(ref)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wheels = Wheelhouse(tmp_path / "wheels")
    uv_offline(monkeypatch, wheels)
    return tmp_path / "store"


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    path = tmp_path / "dist" / WHEEL_NAME
    path.parent.mkdir()
    path.write_bytes(b"a wheel of simrun")
    return path


@pytest.fixture
def constraints(tmp_path: Path) -> Path:
    path = tmp_path / "constraints.txt"
    path.write_text(CONSTRAINTS)
    return path


def record_of(run_id: str, sources: list[SourceProvenance]) -> RunRecord:
    task = TaskSpec(id="squares", type="demo.squares", settings={"n": 1})
    return RunRecord(
        id=run_id,
        workflow=Workflow(name="env", tasks=[task]),
        submitted_by="u",
        owner="u",
        sources=sources,
        created=datetime.now(UTC),
    )


def snapshotted(tmp_path: Path, store: Path) -> list[SourceProvenance]:
    model, library = make_sources(tmp_path / "src", PYTHON)
    return [snapshot(store, "envmodel", model), snapshot(store, "tinylib", library)]


def environments(
    store: Path, registry: MemoryRegistry, wheel: Path | None, constraints: Path
) -> ClusterEnvironments:
    return ClusterEnvironments(
        store,
        registry,
        ClusterConfig(registry=REGISTRY, base_image="astral-sh/uv:0.13.7"),
        python=PYTHON,
        simrun_wheel=wheel,
        build_constraints=constraints,
    )


def test_a_run_is_resolved_to_its_image_with_its_lock_and_build_inputs_kept(
    tmp_path: Path, store: Path, wheel: Path, constraints: Path
) -> None:
    sources = snapshotted(tmp_path, store)
    registry = MemoryRegistry()
    envs = environments(store, registry, wheel, constraints)

    async def main() -> tuple[Resolved, Made, Made]:
        resolved = await envs.resolve(record_of("20260101-000000-aaaaaa", sources))
        assert resolved.image is not None
        return resolved, await envs.build(resolved.image), await envs.build(resolved.image)

    resolved, made, again = asyncio.run(main())
    assert resolved.image is not None and resolved.image.startswith(f"{REGISTRY}/simrun-env:")
    lock = RunPaths(store, "20260101-000000-aaaaaa").environment_lock.read_text()
    assert resolved.lock_sha256 == lock_sha256(lock, PYTHON)
    assert ".simrun-store/tinylib" in lock
    inputs = build_inputs(store, resolved.image)
    dockerfile = (inputs / "Dockerfile").read_text()
    assert dockerfile.startswith("# The image of an environment") and "tiny-dep==1.0" in dockerfile
    assert f"FROM {REGISTRY}/astral-sh/uv:0.13.7" in dockerfile
    kept = msgspec.json.decode((inputs / "build.json").read_bytes())
    digest = hashlib.sha256(b"a wheel of simrun").hexdigest()
    assert kept == {
        "image": resolved.image,
        "lock_sha256": resolved.lock_sha256,
        "simrun_version": f"0.1.0 sha256:{digest}",
        "wheel": WHEEL_NAME,
        "wheel_sha256": digest,
    }
    # built from a flat context of the Dockerfile and the wheel, then found in the registry
    assert made.cached is False and made.seconds is not None and made.seconds >= 0
    assert again == Made(seconds=None, cached=True)
    ((ref, files),) = registry.builds
    assert ref == resolved.image
    assert files == {"Dockerfile": dockerfile.encode(), WHEEL_NAME: b"a wheel of simrun"}


def test_a_model_without_pyproject_runs_in_the_default_image(
    tmp_path: Path, store: Path, wheel: Path, constraints: Path
) -> None:
    bare = snapshot(store, "bare", write_tree(tmp_path / "bare", {"run.py": "print(1)\n"}))
    envs = environments(store, MemoryRegistry(), wheel, constraints)
    recorded = SourceProvenance(name="model", path="/home/u/model", commit="a" * 40)
    for sources in ([bare], [recorded], []):
        assert asyncio.run(envs.resolve(record_of("20260101-000000-bbbbbb", sources))) == (
            Resolved(image=None)
        )
    assert not RunPaths(store, "20260101-000000-bbbbbb").environment_lock.exists()
    gone = SourceProvenance(name="model", snapshot="snapshots/model/" + "0" * 64)
    with pytest.raises(EnvironmentRefused, match="is not in the store"):
        asyncio.run(envs.resolve(record_of("20260101-000000-bbbbbb", [gone])))


def test_an_environment_that_cannot_be_resolved_is_refused_saying_why(
    tmp_path: Path, store: Path, wheel: Path, constraints: Path
) -> None:
    model, _ = snapshotted(tmp_path, store)
    envs = environments(store, MemoryRegistry(), wheel, constraints)
    with pytest.raises(EnvironmentRefused, match="local package 'tinylib'"):
        asyncio.run(envs.resolve(record_of("20260101-000000-cccccc", [model])))
    no_registry = ClusterEnvironments(
        store, MemoryRegistry(), ClusterConfig(), python=PYTHON, simrun_wheel=wheel
    )
    with pytest.raises(EnvironmentRefused, match="no registry"):
        asyncio.run(no_registry.resolve(record_of("20260101-000000-cccccc", [model])))


def test_runs_of_one_new_environment_build_its_image_once_and_a_cancel_leaves_it(
    tmp_path: Path, store: Path, wheel: Path, constraints: Path
) -> None:
    sources = snapshotted(tmp_path, store)
    registry = MemoryRegistry()
    envs = environments(store, registry, wheel, constraints)

    async def main() -> list[Made]:
        registry.gate = asyncio.Event()
        first = await envs.resolve(record_of("20260101-000000-000001", sources))
        second = await envs.resolve(record_of("20260101-000000-000002", sources))
        assert first == second and first.image is not None
        image = first.image
        waiting = [asyncio.ensure_future(envs.build(image)) for _ in range(3)]
        while not registry.builds:
            await asyncio.sleep(0.01)
        waiting[0].cancel()  # the run cancelled while its image builds
        await asyncio.sleep(0.05)
        registry.gate.set()
        made = await asyncio.gather(*waiting[1:])
        assert waiting[0].cancelled()
        return made

    made = asyncio.run(main())
    assert len(registry.builds) == 1 and registry.cancelled == 0
    assert made[0] == made[1] and made[0].cached is False and made[0].seconds is not None


def test_a_service_started_again_builds_the_image_from_the_store(
    tmp_path: Path, store: Path, wheel: Path, constraints: Path
) -> None:
    sources = snapshotted(tmp_path, store)
    registry = MemoryRegistry()
    resolved = asyncio.run(
        environments(store, registry, wheel, constraints).resolve(
            record_of("20260101-000000-dddddd", sources)
        )
    )
    assert resolved.image is not None
    restarted = environments(store, registry, wheel, constraints)  # nothing in memory
    made = asyncio.run(restarted.build(resolved.image))
    assert made.cached is False and [ref for ref, _ in registry.builds] == [resolved.image]
    # a build that finds no inputs says so
    with pytest.raises(EnvironmentRefused, match=r"build inputs of .* are not in the store"):
        asyncio.run(restarted.build(f"{REGISTRY}/simrun-env:" + "0" * 32))
    # nor does one with another wheel than the one the image was resolved with
    wheel.write_bytes(b"another wheel")
    registry.images.clear()
    changed = environments(store, registry, wheel, constraints)
    with pytest.raises(EnvironmentRefused, match="was resolved with the simrun wheel"):
        asyncio.run(changed.build(resolved.image))


def test_a_build_without_a_wheel_or_that_fails_is_refused_saying_why(
    tmp_path: Path, store: Path, wheel: Path, constraints: Path
) -> None:
    sources = snapshotted(tmp_path, store)
    registry = MemoryRegistry()
    without = environments(store, registry, None, constraints)
    resolved = asyncio.run(without.resolve(record_of("20260101-000000-eeeeee", sources)))
    assert resolved.image is not None
    with pytest.raises(EnvironmentRefused, match=NO_WHEEL):
        asyncio.run(without.build(resolved.image))
    registry.images.add(resolved.image)  # built elsewhere: found, so no wheel is needed
    assert asyncio.run(without.build(resolved.image)) == Made(seconds=None, cached=True)

    envs = environments(store, registry, wheel, constraints)
    failing = asyncio.run(envs.resolve(record_of("20260101-000000-ffffff", sources)))
    assert failing.image is not None and failing.image != resolved.image  # the wheel's hash
    registry.fail = "the build of the image failed (Job build-x: BackoffLimitExceeded)"
    with pytest.raises(EnvironmentRefused, match="cannot be built: the build of the image failed"):
        asyncio.run(envs.build(failing.image))
    registry.fail = None
    assert asyncio.run(envs.build(failing.image)).cached is False  # tried again, not remembered
    with pytest.raises(EnvironmentRefused, match="whether the registry has"):
        asyncio.run(envs.build("docker.io/library/python:3.14"))


def test_the_service_wheel_names_its_version_and_hash(tmp_path: Path, wheel: Path) -> None:
    found = service_wheel(wheel)
    assert (found.name, found.path) == (WHEEL_NAME, wheel)
    assert found.version == f"0.1.0 sha256:{hashlib.sha256(b'a wheel of simrun').hexdigest()}"
    missing = service_wheel(tmp_path / "none" / WHEEL_NAME)
    assert (missing.path, missing.sha256, missing.version) == (None, None, "0.1.0")


def test_only_a_backend_that_builds_images_in_a_registry_gets_cluster_environments(
    tmp_path: Path, wheel: Path
) -> None:
    cluster = ClusterConfig(registry=REGISTRY)
    argo = ArgoBackend(cluster)
    found = environments_for(tmp_path, argo, cluster, python=PYTHON, simrun_wheel=wheel)
    assert isinstance(found, ClusterEnvironments) and found.backend is argo
    assert (
        environments_for(tmp_path, argo, ClusterConfig(), python=PYTHON, simrun_wheel=wheel) is None
    )
    fake = FakeBackend(tmp_path)
    assert environments_for(tmp_path, fake, cluster, python=PYTHON, simrun_wheel=wheel) is None
