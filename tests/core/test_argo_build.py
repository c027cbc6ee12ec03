"""The manifests of the builds of images (`simrun_core.argo.build`), without a cluster.

The Job and the ConfigMap are checked against the Kubernetes definitions Argo's `schema.json`
has (ObjectMeta, OwnerReference, Container, Volume, Affinity: strict, as `kubectl apply
--validate=strict`); it has no JobSpec or PodSpec, so their fields are checked against the
batch/v1 and core/v1 field lists below. The fake cluster's own validation (and a real build on
it) is in tests/cluster/test_images.py.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import reference_schemas as schemas
from jsonschema import Draft202012Validator

from simrun_core.argo import build
from simrun_core.argo.build import (
    CONFIGMAP_MAX_BYTES,
    ImageRef,
    build_job,
    build_name,
    context_configmap,
    context_files,
    context_name,
    job_state,
    manifest_url,
    parse_ref,
)
from simrun_core.cluster import ClusterConfig

REGISTRY = "registry.cluster.internal:5000"
CONFIG = ClusterConfig(registry=REGISTRY)
REF = f"{REGISTRY}/simrun-env:3f2a9c01"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")

JOB_SPEC_FIELDS = {
    "activeDeadlineSeconds",
    "backoffLimit",
    "backoffLimitPerIndex",
    "completionMode",
    "completions",
    "managedBy",
    "manualSelector",
    "maxFailedIndexes",
    "parallelism",
    "podFailurePolicy",
    "podReplacementPolicy",
    "selector",
    "successPolicy",
    "suspend",
    "template",
    "ttlSecondsAfterFinished",
}
POD_SPEC_FIELDS = {
    "activeDeadlineSeconds",
    "affinity",
    "automountServiceAccountToken",
    "containers",
    "dnsConfig",
    "dnsPolicy",
    "enableServiceLinks",
    "hostname",
    "imagePullSecrets",
    "initContainers",
    "nodeName",
    "nodeSelector",
    "priorityClassName",
    "restartPolicy",
    "schedulerName",
    "securityContext",
    "serviceAccountName",
    "terminationGracePeriodSeconds",
    "tolerations",
    "volumes",
}


@pytest.fixture(scope="module")
def definitions() -> dict[str, Any]:
    return dict(json.loads((schemas.ARGO / "schema.json").read_text()))


def check(definitions: dict[str, Any], name: str, document: Any) -> list[str]:
    root = copy.deepcopy(definitions)
    root.pop("oneOf", None)
    root["$ref"] = f"#/definitions/{name}"
    validator = Draft202012Validator(schemas.strict(root))
    return schemas.errors(validator, document)


# --- references and the registry's URLs -----------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "parsed"),
    [
        (REF, ImageRef(REGISTRY, "simrun-env", "3f2a9c01")),
        (f"{REGISTRY}/a/b-c/d_e", ImageRef(REGISTRY, "a/b-c/d_e")),
        (
            f"{REGISTRY}/env@sha256:{'a' * 64}",
            ImageRef(REGISTRY, "env", None, f"sha256:{'a' * 64}"),
        ),
        (
            f"{REGISTRY}/env:1.0@sha256:{'b' * 64}",
            ImageRef(REGISTRY, "env", "1.0", f"sha256:{'b' * 64}"),
        ),
        ("localhost/env:x", ImageRef("localhost", "env", "x")),
        ("ubuntu:24.04", ImageRef(None, "ubuntu", "24.04")),
        ("library/ubuntu", ImageRef(None, "library/ubuntu")),
    ],
)
def test_references_are_parsed_as_the_distribution_grammar_does(ref: str, parsed: ImageRef) -> None:
    assert parse_ref(ref) == parsed


@pytest.mark.parametrize(
    "ref", [f"{REGISTRY}/Env:1", f"{REGISTRY}/", f"{REGISTRY}/env:-x", f"{REGISTRY}/env@md5:1", ""]
)
def test_invalid_references_are_refused(ref: str) -> None:
    with pytest.raises(ValueError):
        parse_ref(ref)


def test_the_manifest_url_is_the_registry_api_of_the_tag_or_digest() -> None:
    assert manifest_url(REF, CONFIG) == f"http://{REGISTRY}/v2/simrun-env/manifests/3f2a9c01"
    digest = f"sha256:{'c' * 64}"
    assert manifest_url(f"{REGISTRY}/a/env:t@{digest}", CONFIG) == (
        f"http://{REGISTRY}/v2/a/env/manifests/{digest}"
    )
    assert manifest_url(f"{REGISTRY}/env", CONFIG).endswith("/v2/env/manifests/latest")
    served = ClusterConfig(registry=REGISTRY, registry_url="https://zot.simrun.svc:5000/")
    assert (
        manifest_url(REF, served) == "https://zot.simrun.svc:5000/v2/simrun-env/manifests/3f2a9c01"
    )


@pytest.mark.parametrize(
    "ref", ["ubuntu:24.04", "ghcr.io/x/env:1", "registry.cluster.internal/env:1"]
)
def test_an_image_of_another_registry_has_no_url(ref: str) -> None:
    with pytest.raises(ValueError, match="not in the registry of the cluster"):
        manifest_url(ref, CONFIG)
    with pytest.raises(ValueError, match="not in the registry of the cluster"):
        build_job(ref, CONFIG)


def test_a_cluster_without_a_registry_has_no_images() -> None:
    with pytest.raises(ValueError, match="no registry"):
        manifest_url(REF, ClusterConfig())


# --- names ----------------------------------------------------------------------------------------


def test_names_are_fixed_by_the_image_and_valid() -> None:
    long = f"{REGISTRY}/team/" + "a-very-long-repository-name-" * 5 + "end:" + "t" * 100
    names = {build_name(ref) for ref in (REF, f"{REGISTRY}/simrun-env:other", long)}
    assert len(names) == 3
    assert build_name(REF) == build_name(REF)
    assert build_name(REF).startswith("build-simrun-env-")
    for ref in (REF, long, f"{REGISTRY}/x__y.z:1"):
        for name in (build_name(ref), context_name(ref), build_name(ref) + "-abcde"):
            assert DNS_LABEL.match(name) and len(name) <= 63, name
    assert context_name(REF) == build_name(REF) + "-context"


# --- the context ----------------------------------------------------------------------------------


def write_context(directory: Path, **files: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name.replace("__", ".")).write_bytes(data)
    return directory


def test_a_flat_context_is_read_and_made_a_configmap(tmp_path: Path) -> None:
    wheel = bytes(range(256)) * 8
    context = write_context(
        tmp_path / "ctx", Dockerfile=b"FROM base\nCOPY simrun.whl /tmp/\n", simrun__whl=wheel
    )
    files = context_files(context)
    assert files == {"Dockerfile": b"FROM base\nCOPY simrun.whl /tmp/\n", "simrun.whl": wheel}
    job = {"metadata": {"name": build_name(REF), "uid": "1234-5678"}}
    configmap = context_configmap(REF, CONFIG, files, job)
    assert configmap["data"] == {"Dockerfile": "FROM base\nCOPY simrun.whl /tmp/\n"}
    assert base64.b64decode(configmap["binaryData"]["simrun.whl"]) == wheel
    assert configmap["immutable"] is True
    meta = configmap["metadata"]
    assert (meta["name"], meta["namespace"]) == (context_name(REF), "simrun")
    assert meta["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": build_name(REF), "uid": "1234-5678"}
    ]
    assert meta["annotations"] == {build.IMAGE_ANNOTATION: REF}
    assert meta["labels"][build.BUILD_LABEL] == build_name(REF)
    assert all(CONFIG_KEY.match(key) for part in ("data", "binaryData") for key in configmap[part])


def test_the_configmap_needs_the_created_job(tmp_path: Path) -> None:
    files = context_files(write_context(tmp_path, Dockerfile=b"FROM x\n"))
    with pytest.raises(ValueError, match="no uid"):
        context_configmap(REF, CONFIG, files, {"metadata": {"name": build_name(REF)}})


def test_a_context_with_a_directory_is_refused_naming_it(tmp_path: Path) -> None:
    context = write_context(tmp_path / "ctx", Dockerfile=b"FROM x\n")
    (context / "src").mkdir()
    with pytest.raises(ValueError, match="has a directory, src"):
        context_files(context)


def test_a_link_to_a_directory_is_a_directory(tmp_path: Path) -> None:
    context = write_context(tmp_path / "ctx", Dockerfile=b"FROM x\n")
    (context / "elsewhere").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="has a directory, elsewhere"):
        context_files(context)


def test_a_context_too_large_for_a_configmap_is_refused_naming_its_size(tmp_path: Path) -> None:
    context = write_context(
        tmp_path / "ctx", Dockerfile=b"FROM x\n", big__whl=b"\0" * CONFIGMAP_MAX_BYTES
    )
    with pytest.raises(ValueError) as refused:
        context_files(context)
    message = str(refused.value)
    assert "too large for a ConfigMap" in message
    assert "big.whl" in message and str(CONFIGMAP_MAX_BYTES) in message
    assert str(CONFIGMAP_MAX_BYTES + len("Dockerfile") + 7 + len("big.whl")) in message


def test_a_context_just_within_the_limit_is_taken(tmp_path: Path) -> None:
    dockerfile = b"FROM x\n"
    room = CONFIGMAP_MAX_BYTES - len("Dockerfile") - len(dockerfile) - len("blob")
    files = context_files(write_context(tmp_path, Dockerfile=dockerfile, blob=b"\1" * room))
    assert sum(len(k) + len(v) for k, v in files.items()) == CONFIGMAP_MAX_BYTES


@pytest.mark.parametrize("name", ["has space", "ümlaut"])
def test_a_file_a_configmap_cannot_name_is_refused(tmp_path: Path, name: str) -> None:
    context = write_context(tmp_path / "ctx", Dockerfile=b"FROM x\n")
    (context / name).write_bytes(b"x")
    with pytest.raises(ValueError, match=re.escape(repr(name))):
        context_files(context)


def test_a_context_needs_a_dockerfile_and_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no Dockerfile"):
        context_files(write_context(tmp_path / "ctx", other=b"x"))
    with pytest.raises(ValueError, match="no directory"):
        context_files(tmp_path / "missing")


# --- the Job --------------------------------------------------------------------------------------


def test_the_job_runs_buildctl_against_the_daemon_and_pushes(definitions: dict[str, Any]) -> None:
    job = build_job(REF, CONFIG)
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    assert (
        check(definitions, "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", job["metadata"]) == []
    )
    assert (job["metadata"]["name"], job["metadata"]["namespace"]) == (build_name(REF), "simrun")
    spec = job["spec"]
    assert set(spec) <= JOB_SPEC_FIELDS
    assert spec["backoffLimit"] == 0
    assert spec["ttlSecondsAfterFinished"] == CONFIG.ttl_after_finished_s
    assert spec["activeDeadlineSeconds"] == build.BUILD_TIMEOUT_S + build.DEADLINE_MARGIN_S
    template = spec["template"]
    assert (
        check(definitions, "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta", template["metadata"])
        == []
    )
    pod = template["spec"]
    assert set(pod) <= POD_SPEC_FIELDS
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert check(definitions, "io.k8s.api.core.v1.Affinity", pod["affinity"]) == []
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "simrun/worker", "operator": "NotIn", "values": ["true"]}
    ]
    (container,) = pod["containers"]
    assert check(definitions, "io.k8s.api.core.v1.Container", container) == []
    assert container["image"] == CONFIG.buildctl_image == "moby/buildkit:v0.34.2-rootless"
    assert container["command"] == ["buildctl"]
    assert container["args"] == [
        "--addr",
        "tcp://buildkitd.simrun:1234",
        "build",
        "--progress",
        "plain",
        "--frontend",
        "dockerfile.v0",
        "--local",
        "context=/context/..data",
        "--local",
        "dockerfile=/context/..data",
        "--output",
        f"type=image,name={REF},push=true",
    ]
    for volume in pod["volumes"]:
        assert check(definitions, "io.k8s.api.core.v1.Volume", volume) == []
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["context"]["configMap"] == {"name": context_name(REF)}
    assert volumes["registry-auth"]["secret"] == {
        "secretName": "simrun-registry-auth",
        "optional": True,
        "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
    }
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    assert mounts["context"]["mountPath"] == "/context"
    assert {"name": "DOCKER_CONFIG", "value": mounts["registry-auth"]["mountPath"]} in container[
        "env"
    ]
    assert all(mount["readOnly"] for mount in mounts.values())


def test_the_job_follows_the_cluster_config() -> None:
    config = ClusterConfig(
        namespace="builds",
        registry="k3d-simrun-registry:5000",
        buildkit="tcp://buildkitd.builds:1234",
        buildctl_image="moby/buildkit:v0.30.0",
        ttl_after_finished_s=600,
    )
    ref = "k3d-simrun-registry:5000/env:1"
    job = build_job(ref, config, timeout_s=12.5)
    assert job["metadata"]["namespace"] == "builds"
    assert job["spec"]["activeDeadlineSeconds"] == 13 + build.DEADLINE_MARGIN_S
    assert job["spec"]["ttlSecondsAfterFinished"] == 600
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "moby/buildkit:v0.30.0"
    assert container["args"][:2] == ["--addr", "tcp://buildkitd.builds:1234"]


def test_the_deployed_addresses_are_the_defaults() -> None:
    root = Path(__file__).resolve().parents[2] / "deploy" / "cluster"
    buildkit = (root / "buildkit.yaml").read_text()
    defaults = ClusterConfig()
    assert f"image: {defaults.buildctl_image}" in buildkit
    assert "tcp://0.0.0.0:1234" in buildkit and defaults.buildkit == "tcp://buildkitd.simrun:1234"
    assert f'[registry."{REGISTRY}"]' in buildkit  # the registry of the builds is plain HTTP
    assert '"port": "5000"' in (root / "zot.yaml").read_text()
    settings = (root / "simrun-config.yaml").read_text()
    assert f"registry: {REGISTRY}" in settings and "registry_url" not in settings


# --- the state of a Job ---------------------------------------------------------------------------


def condition(kind: str, reason: str = "", message: str = "", status: str = "True") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([], ("running", "")),
        ([condition("Suspended", status="False")], ("running", "")),
        (
            [condition("SuccessCriteriaMet", "CompletionsReached", "Reached expected number")],
            ("complete", "CompletionsReached: Reached expected number"),
        ),
        (
            [
                condition("SuccessCriteriaMet", "CompletionsReached"),
                condition("Complete", "CompletionsReached"),
            ],
            ("complete", "CompletionsReached"),
        ),
        (
            [
                condition(
                    "FailureTarget",
                    "BackoffLimitExceeded",
                    "Job has reached the specified backoff limit",
                )
            ],
            ("failed", "BackoffLimitExceeded: Job has reached the specified backoff limit"),
        ),
        ([condition("Failed", "DeadlineExceeded")], ("failed", "DeadlineExceeded")),
        ([condition("Failed", "DeadlineExceeded", status="False")], ("running", "")),
    ],
)
def test_the_state_of_a_job_is_read_from_its_conditions(
    conditions: list[dict], expected: tuple[str, str]
) -> None:
    assert job_state({"status": {"conditions": conditions}}) == expected
