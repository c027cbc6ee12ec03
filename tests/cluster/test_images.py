"""The images of the Argo backend on the fake cluster: `has_image` against a fake OCI registry,
`build_image` as a Job of `buildctl` run by the emulated Job controller and kubelet.

BuildKit and Zot cannot run here: `fake/registry.py` serves the distribution API over HTTP and
`fake/buildctl.py` (first on the pods' PATH) stands in for `buildctl`, pushing to it. So what is
checked is the backend's side of the protocols: the manifests the API server validates, the
order of the Job and its ConfigMap, the ConfigMap volume the pod reads, the Job's conditions,
the registry's answers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import tarfile
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from fake.buildctl import UsageError, parse
from fake.cluster import FakeCluster, NodeSpec
from fake.jobs import finished, job_pods
from fake.registry import FakeRegistry
from fake.store import ApiError

from simrun_api.backends.argo import ArgoBackend
from simrun_core.argo.build import (
    BUILD_LABEL,
    CONFIGMAP_MAX_BYTES,
    MANIFEST_TYPES,
    build_job,
    build_name,
    buildctl_args,
    context_name,
)
from simrun_core.cluster import ClusterConfig

NS = "simrun"
TIMEOUT_S = 30.0
NODES = (NodeSpec("infra", worker=False), NodeSpec("node-1"))
DOCKERFILE = (
    "FROM base\n"
    "RUN <<EOF\n"
    "uv pip install --requirements - \\\n"
    "  numpy==2.3.0\n"
    "EOF\n"
    "COPY simrun-0.1.0-py3-none-any.whl /tmp/\n"
)
WHEEL = bytes(range(256)) * 64  # binary: the ConfigMap's binaryData

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


@pytest.fixture
def registry() -> Iterator[FakeRegistry]:
    with FakeRegistry() as served:
        yield served


@pytest.fixture
def cluster(tmp_path: Path, registry: FakeRegistry) -> Iterator[FakeCluster]:
    config = ClusterConfig(registry=registry.host, ttl_after_finished_s=3600)
    with FakeCluster(tmp_path / "cluster", nodes=NODES, config=config) as served:
        yield served


def backend_of(cluster: FakeCluster) -> ArgoBackend:
    backend = ArgoBackend(cluster.config, configuration=cluster.configuration())
    backend.images.poll_s = 0.05
    return backend


def context(tmp_path: Path, dockerfile: str = DOCKERFILE, name: str = "ctx") -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "Dockerfile").write_text(dockerfile)
    (directory / "simrun-0.1.0-py3-none-any.whl").write_bytes(WHEEL)
    return directory


def ref_of(registry: FakeRegistry, tag: str = "3f2a9c01") -> str:
    return f"{registry.host}/simrun-env:{tag}"


async def build(cluster: FakeCluster, directory: Path, ref: str, **options: Any) -> None:
    backend = backend_of(cluster)
    try:
        if options:
            await backend.images.build_image(directory, ref, **options)
        else:
            await backend.build_image(directory, ref)
    finally:
        await backend.close()


async def has(cluster: FakeCluster, ref: str) -> bool:
    backend = backend_of(cluster)
    try:
        return await backend.has_image(ref)
    finally:
        await backend.close()


def job_of(cluster: FakeCluster, ref: str) -> dict[str, Any]:
    return cluster.store.get("jobs", build_name(ref), NS)


def created(cluster: FakeCluster, plural: str, name: str) -> int:
    return cluster.store.created[(plural, NS, name)]


# --- has_image ------------------------------------------------------------------------------------


def test_has_image_asks_the_registry_for_the_manifest(
    cluster: FakeCluster, registry: FakeRegistry
) -> None:
    registry.add_image("simrun-env", "present")
    assert run(has(cluster, ref_of(registry, "present"))) is True
    assert run(has(cluster, ref_of(registry, "absent"))) is False
    assert run(has(cluster, f"{registry.host}/unknown-repository:x")) is False
    method, path, headers = registry.requests[0]
    assert (method, path) == ("HEAD", "/v2/simrun-env/manifests/present")
    assert set(headers["Accept"].split(", ")) == set(MANIFEST_TYPES)
    digest = registry.add_image("simrun-env", "other", b"another layer")
    assert run(has(cluster, f"{registry.host}/simrun-env@{digest}")) is True


def test_has_image_refuses_an_image_of_another_registry(cluster: FakeCluster) -> None:
    for ref in ("ubuntu:24.04", "ghcr.io/astral-sh/uv:0.13.7"):
        with pytest.raises(ValueError, match="not in the registry of the cluster"):
            run(has(cluster, ref))


def test_a_registry_that_answers_neither_is_an_error(
    cluster: FakeCluster, registry: FakeRegistry
) -> None:
    ref = ref_of(registry)
    url = f"{registry.url}/v2/simrun-env/manifests/3f2a9c01"
    for status in (500, 401, 503):
        registry.answer_with = status
        with pytest.raises(RuntimeError) as failed:
            run(has(cluster, ref))
        assert str(status) in str(failed.value) and url in str(failed.value)
    registry.stop()
    with pytest.raises(RuntimeError, match="did not answer"):
        run(has(cluster, ref))


# --- build_image ----------------------------------------------------------------------------------


def test_a_build_runs_a_job_that_owns_its_context_and_pushes(
    cluster: FakeCluster, registry: FakeRegistry, tmp_path: Path
) -> None:
    ref = ref_of(registry)
    assert run(has(cluster, ref)) is False
    run(build(cluster, context(tmp_path), ref))
    assert cluster.errors == []
    assert run(has(cluster, ref)) is True

    job = job_of(cluster, ref)
    assert finished(job) and (job["status"]["succeeded"], job["status"]["active"]) == (1, 0)
    assert [c["type"] for c in job["status"]["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    configmap = cluster.store.get("configmaps", context_name(ref), NS)
    (owner,) = configmap["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Job",
        job["metadata"]["name"],
        job["metadata"]["uid"],
    )
    assert configmap["data"] == {"Dockerfile": DOCKERFILE}
    assert base64.b64decode(configmap["binaryData"]["simrun-0.1.0-py3-none-any.whl"]) == WHEEL
    assert created(cluster, "jobs", build_name(ref)) == 1
    assert created(cluster, "configmaps", context_name(ref)) == 1

    (pod,) = job_pods(cluster.store, job)
    assert pod["metadata"]["labels"][BUILD_LABEL] == build_name(ref)
    assert pod["spec"]["containers"][0]["args"] == buildctl_args(ref, cluster.config)
    log = cluster.store.read_log(NS, pod["metadata"]["name"], "buildctl").decode()
    assert f"pushing manifest for {ref}@sha256:" in log

    # the image BuildKit's stand-in pushed: the context's files, read through the ConfigMap
    manifest = registry.manifest("simrun-env", "3f2a9c01")
    layer_digest = manifest["layers"][0]["digest"]
    layer = httpx.get(f"{registry.url}/v2/simrun-env/blobs/{layer_digest}").content
    with tarfile.open(fileobj=io.BytesIO(layer)) as archive:
        names = sorted(archive.getnames())
        assert names == ["Dockerfile", "simrun-0.1.0-py3-none-any.whl"]
        extracted = archive.extractfile("simrun-0.1.0-py3-none-any.whl")
        assert extracted is not None and extracted.read() == WHEEL

    # the context goes with its Job
    cluster.store.delete("jobs", build_name(ref), NS, propagation="Background")
    with pytest.raises(ApiError):
        cluster.store.get("configmaps", context_name(ref), NS)


def test_a_failed_build_raises_with_the_end_of_its_log(
    cluster: FakeCluster, registry: FakeRegistry, tmp_path: Path
) -> None:
    ref = ref_of(registry)
    broken = context(tmp_path, "FROM base\nRUN echo preparing\nRUN false\n")
    with pytest.raises(RuntimeError) as failed:
        run(build(cluster, broken, ref))
    message = str(failed.value)
    assert f"the build of {ref} failed" in message
    assert "BackoffLimitExceeded" in message
    assert "exit code 1" in message
    assert 'ERROR: process "/bin/sh -c false" did not complete successfully' in message
    assert message.rstrip().endswith(
        'error: failed to solve: process "/bin/sh -c false" did not complete successfully: '
        "exit code: 1"
    )
    assert cluster.errors == []
    assert run(has(cluster, ref)) is False
    conditions = [c["type"] for c in job_of(cluster, ref)["status"]["conditions"]]
    assert conditions == ["FailureTarget", "Failed"]

    # a new build of the image replaces the Job that failed, and may succeed
    run(build(cluster, context(tmp_path, name="fixed"), ref))
    assert run(has(cluster, ref)) is True
    assert created(cluster, "jobs", build_name(ref)) == 2


def test_a_build_in_flight_is_waited_for_not_started_twice(
    cluster: FakeCluster, registry: FakeRegistry, tmp_path: Path
) -> None:
    ref = ref_of(registry)
    slow = context(tmp_path, "FROM base\nRUN sleep 1.5\n")

    async def two_services() -> None:
        first = asyncio.create_task(build(cluster, slow, ref))

        def started() -> bool:
            with contextlib.suppress(ApiError):
                cluster.store.get("configmaps", context_name(ref), NS)
                return bool(cluster.jobs.pods_created)
            return False

        await asyncio.to_thread(cluster.wait_for, started, TIMEOUT_S, "the build's pod")
        await build(cluster, slow, ref)  # another service, while the first's Job runs
        await first

    run(two_services())
    assert cluster.errors == []
    assert created(cluster, "jobs", build_name(ref)) == 1
    assert created(cluster, "configmaps", context_name(ref)) == 1
    assert len(cluster.jobs.pods_created) == 1
    assert run(has(cluster, ref)) is True


def test_a_job_whose_service_died_before_its_context_gets_it(
    cluster: FakeCluster, registry: FakeRegistry, tmp_path: Path
) -> None:
    ref = ref_of(registry)
    cluster.store.create("jobs", build_job(ref, cluster.config), NS)  # and no ConfigMap
    pod = cluster.wait_for(
        lambda: next(iter(job_pods(cluster.store, job_of(cluster, ref))), None),
        TIMEOUT_S,
        "the build's pod",
    )

    def waiting() -> str | None:
        current = cluster.store.get("pods", pod["metadata"]["name"], NS)
        statuses = (current.get("status") or {}).get("containerStatuses") or []
        state = statuses[0]["state"] if statuses else {}
        return (state.get("waiting") or {}).get("reason")

    assert cluster.wait_for(waiting, TIMEOUT_S, "the pod waiting for its volume") == (
        "ContainerCreating"
    )
    run(build(cluster, context(tmp_path), ref))
    assert run(has(cluster, ref)) is True
    assert created(cluster, "jobs", build_name(ref)) == 1
    assert cluster.errors == []


def test_a_build_that_takes_too_long_raises_timeout_and_is_deleted(
    cluster: FakeCluster, registry: FakeRegistry, tmp_path: Path
) -> None:
    ref = ref_of(registry)
    slow = context(tmp_path, "FROM base\nRUN sleep 60\n")
    with pytest.raises(TimeoutError, match=r"longer than 1\.5 s"):
        run(build(cluster, slow, ref, timeout_s=1.5))
    with pytest.raises(ApiError) as gone:
        job_of(cluster, ref)
    assert gone.value.code == 404
    cluster.wait_for(
        lambda: not cluster.store.list("pods", NS, labels={BUILD_LABEL: build_name(ref)})[0],
        TIMEOUT_S,
        "the build's pod to be gone",
    )
    assert run(has(cluster, ref)) is False
    assert cluster.errors == []


def test_a_context_that_is_not_flat_or_too_big_is_refused_before_any_job(
    cluster: FakeCluster, registry: FakeRegistry, tmp_path: Path
) -> None:
    ref = ref_of(registry)
    nested = context(tmp_path, name="nested")
    (nested / "src").mkdir()
    with pytest.raises(ValueError, match="has a directory, src"):
        run(build(cluster, nested, ref))
    big = context(tmp_path, name="big")
    (big / "data.bin").write_bytes(b"\0" * CONFIGMAP_MAX_BYTES)
    with pytest.raises(ValueError, match=r"too large for a ConfigMap: \d+ bytes.*data\.bin"):
        run(build(cluster, big, ref))
    with pytest.raises(ValueError, match="not in the registry of the cluster"):
        run(build(cluster, context(tmp_path, name="foreign"), "ghcr.io/x/env:1"))
    assert created(cluster, "jobs", build_name(ref)) == 0


def test_a_binary_context_near_the_limit_of_a_configmap_is_built(
    cluster: FakeCluster, registry: FakeRegistry, tmp_path: Path
) -> None:
    """The API server counts `binaryData` decoded: 0.9 MiB of wheel is 1.2 MiB of base64."""
    ref = ref_of(registry)
    directory = context(tmp_path)
    wheel = directory / "simrun-0.1.0-py3-none-any.whl"
    wheel.write_bytes(bytes(range(256)) * (CONFIGMAP_MAX_BYTES * 9 // 10 // 256))
    run(build(cluster, directory, ref))
    assert run(has(cluster, ref)) is True


def test_the_registry_credentials_come_from_the_optional_secret(
    tmp_path: Path,
) -> None:
    with FakeRegistry(credentials=("simrun", "s3cret")) as registry:
        config = ClusterConfig(registry=registry.host)
        with FakeCluster(tmp_path / "cluster", nodes=NODES, config=config) as cluster:
            ref = ref_of(registry)
            with pytest.raises(RuntimeError, match="401"):
                run(build(cluster, context(tmp_path), ref))
            auth = base64.b64encode(b"simrun:s3cret").decode()
            docker_config = json.dumps({"auths": {registry.host: {"auth": auth}}})
            secret = {
                "metadata": {"name": "simrun-registry-auth"},
                "type": "kubernetes.io/dockerconfigjson",
                "data": {".dockerconfigjson": base64.b64encode(docker_config.encode()).decode()},
            }
            cluster.store.create("secrets", secret, NS)
            run(build(cluster, context(tmp_path, name="again"), ref))
            assert run(has(cluster, ref)) is True
            assert cluster.errors == []


# --- the fakes speak the real protocols -----------------------------------------------------------


def test_the_fake_registry_answers_as_the_distribution_api(registry: FakeRegistry) -> None:
    with httpx.Client(base_url=registry.url) as http:
        root = http.get("/v2/")
        assert root.status_code == 200
        assert root.headers["Docker-Distribution-API-Version"] == "registry/2.0"
        missing = http.get("/v2/env/manifests/1")
        assert missing.status_code == 404
        assert missing.json()["errors"][0]["code"] == "NAME_UNKNOWN"
        digest = registry.add_image("env", "1")
        assert http.get("/v2/env/manifests/2").json()["errors"][0]["code"] == "MANIFEST_UNKNOWN"
        found = http.get("/v2/env/manifests/1")
        assert found.status_code == 200
        assert found.headers["Docker-Content-Digest"] == digest
        assert found.headers["Content-Type"] == "application/vnd.oci.image.manifest.v1+json"
        head = http.head(f"/v2/env/manifests/{digest}")
        assert (head.status_code, head.content) == (200, b"")
        manifest = found.json()
        manifest["layers"][0]["digest"] = "sha256:" + "0" * 64
        put = http.put(
            "/v2/env/manifests/broken",
            content=json.dumps(manifest),
            headers={"Content-Type": manifest["mediaType"]},
        )
        assert put.status_code == 400
        assert put.json()["errors"][0]["code"] == "MANIFEST_BLOB_UNKNOWN"


def test_the_buildctl_stand_in_takes_the_command_line_of_the_job() -> None:
    ref = "registry.cluster.internal:5000/simrun-env:1"
    options = parse(buildctl_args(ref, ClusterConfig(registry="registry.cluster.internal:5000")))
    assert options.addr == "tcp://buildkitd.simrun:1234"
    assert options.locals == {"context": "/context/..data", "dockerfile": "/context/..data"}
    assert options.output == {"type": "image", "name": ref, "push": "true"}
    with pytest.raises(UsageError, match="not defined: --contxt"):
        parse(["--addr", "tcp://x:1", "build", "--contxt", "."])


def test_buildkit_would_not_find_the_dockerfile_of_the_volume_root(
    cluster: FakeCluster, registry: FakeRegistry, tmp_path: Path
) -> None:
    """Why the Job reads `/context/..data`: the volume's files are links into it."""
    ref = ref_of(registry)
    job = build_job(ref, cluster.config)
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["args"] = [arg.replace("/context/..data", "/context") for arg in container["args"]]
    cluster.store.create("jobs", job, NS)
    # the build takes the Job in flight and gives it its context
    with pytest.raises(RuntimeError, match=r"failed to read dockerfile: open \.\.data/Dockerfile"):
        run(build(cluster, context(tmp_path), ref))


def test_the_fake_job_controller_ends_a_job_past_its_deadline(cluster: FakeCluster) -> None:
    job = {
        "metadata": {"name": "sleeper"},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": 1,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "x", "command": ["sleep", "60"]}],
                }
            },
        },
    }
    cluster.store.create("jobs", job, NS)

    def ended() -> dict[str, Any] | None:
        current = cluster.store.get("jobs", "sleeper", NS)
        return current if finished(current) else None

    done = cluster.wait_for(ended, TIMEOUT_S, "the Job to fail")
    failed = [c for c in done["status"]["conditions"] if c["type"] == "Failed"]
    assert failed[0]["reason"] == "DeadlineExceeded"
    assert done["status"]["active"] == 0
    assert cluster.errors == []
