"""The deployment in `deploy/`: `kubectl kustomize` builds `deploy/cluster` and `deploy/k3d`
offline, the built objects are the ones spec 11 lists, the Kueue objects and the priority
classes are `simrun_core.kueue`'s (and valid against Kueue's CRDs), the generated files are
current, the service's settings decode with its own loader, its tokens pass its permission
check, and the store is mounted with the options the findings need.

The release manifests of `deploy/cluster/upstream` are URLs, which only a build with the network
fetches: its patches are built here against local stand-ins of the objects they patch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest
import yaml

from simrun_api.auth import TokensError, load_tokens
from simrun_api.settings import load_settings
from simrun_core.argo import labels
from simrun_core.cluster import ClusterConfig
from simrun_core.kueue import KUEUE_API, kueue_objects, priority_objects

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBECTL = shutil.which("kubectl")

KUEUE_URL = "https://github.com/kubernetes-sigs/kueue/releases/download/v0.20.5/manifests.yaml"
ARGO_URL = (
    "https://github.com/argoproj/argo-workflows/releases/download/v4.1.6/namespace-install.yaml"
)
QUEUE_KINDS = {
    "WorkloadPriorityClass",
    "PriorityClass",
    "Topology",
    "ResourceFlavor",
    "ClusterQueue",
    "LocalQueue",
}
"""The kinds of `simrun_core.kueue.kueue_objects`."""
CLUSTER_SCOPED = {
    "Namespace",
    "PriorityClass",
    "WorkloadPriorityClass",
    "Topology",
    "ResourceFlavor",
    "ClusterQueue",
    "StorageClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "PersistentVolume",
}
EXPECTED = {
    ("Namespace", "simrun"),
    ("ConfigMap", "workflow-controller-configmap"),
    ("ServiceAccount", "simrun-workflow"),
    ("Role", "simrun-workflow"),
    ("RoleBinding", "simrun-workflow"),
    ("PersistentVolumeClaim", "simrun-store"),
    ("ConfigMap", "buildkitd-config"),
    ("PersistentVolumeClaim", "buildkitd-state"),
    ("Deployment", "buildkitd"),
    ("Service", "buildkitd"),
    ("ConfigMap", "simrun-config"),
    ("ServiceAccount", "simrun"),
    ("Role", "simrun"),
    ("RoleBinding", "simrun"),
    ("ClusterRole", "simrun"),
    ("ClusterRoleBinding", "simrun"),
    ("Secret", "simrun-tokens"),
    ("PersistentVolumeClaim", "simrun-data"),
    ("Deployment", "simrun"),
    ("Service", "simrun"),
}
"""What both builds hold beside the Kueue objects (spec 11's table)."""
ZOT = {
    ("ConfigMap", "zot-config"),
    ("PersistentVolumeClaim", "zot-data"),
    ("Deployment", "zot"),
    ("Service", "zot"),
}
NFS = {("StorageClass", "simrun-nfs")}


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


generate = _load("simrun_deploy_generate", DEPLOY / "generate.py")
schemas = _load("reference_schemas", REPO / "tests" / "core" / "reference_schemas.py")

SETUPS = {"cluster": generate.CLUSTER, "k3d": generate.K3D}


# --- building ------------------------------------------------------------------------------


def _kubectl() -> str:
    if KUBECTL is None:
        pytest.skip(
            "kubectl is not installed: these tests build deploy/ with `kubectl kustomize` "
            "(kubectl with kustomize v5); .ci/run requires it"
        )
    return KUBECTL


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize DIRECTORY` builds; the build must need no network."""
    done = subprocess.run(
        [_kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {directory}:\n{done.stderr}"
    return [item for item in yaml.safe_load_all(done.stdout) if item]


@pytest.fixture(scope="module")
def built() -> dict[str, list[dict[str, Any]]]:
    return {name: kustomize(DEPLOY / name) for name in SETUPS}


def by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for item in objects:
        key = (item["kind"], item["metadata"]["name"])
        assert key not in found, f"{key} twice in the build"
        found[key] = item
    return found


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return by_key(objects)[(kind, name)]


def settings_of(objects: list[dict[str, Any]], tmp_path: Path) -> Path:
    """The settings file of the built ConfigMap, written where the service would read it."""
    config = one(objects, "ConfigMap", "simrun-config")
    path = tmp_path / "settings.yaml"
    path.write_text(config["data"][generate.SETTINGS_KEY])
    return path


def service_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = one(objects, "Deployment", "simrun")["spec"]["template"]["spec"]
    return pod


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [item for item in pod["containers"] if item["name"] == name]
    return found


def test_kubectl_has_kustomize_v5():
    done = subprocess.run(
        [_kubectl(), "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    version = json.loads(done.stdout).get("kustomizeVersion", "")
    assert re.match(r"v([5-9]|\d\d)\.", version), f"kustomize {version!r}: v5 or newer needed"


# --- the objects ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SETUPS)
def test_each_kind_is_built(built, name):
    keys = set(by_key(built[name]))
    queue_keys = {
        (item["kind"], item["metadata"]["name"])
        for item in kueue_objects(SETUPS[name].quota, SETUPS[name].cluster)
    }
    expected = EXPECTED | queue_keys | (ZOT | NFS if name == "cluster" else set())
    assert expected - keys == set(), "missing from the build"
    unexpected = (
        keys - expected - ({("PersistentVolume", "simrun-store")} if name == "k3d" else set())
    )
    assert unexpected == set(), "unexpected in the build"


@pytest.mark.parametrize("name", SETUPS)
def test_every_object_names_its_namespace_but_the_cluster_scoped_ones(built, name):
    for item in built[name]:
        namespace = item["metadata"].get("namespace")
        if item["kind"] in CLUSTER_SCOPED:
            assert namespace is None, f"{item['kind']} {item['metadata']['name']}"
        else:
            assert namespace == "simrun", f"{item['kind']} {item['metadata']['name']}"


@pytest.mark.parametrize("name", SETUPS)
def test_the_kueue_objects_and_priorities_are_simrun_cores(built, name):
    setup = SETUPS[name]
    expected = kueue_objects(setup.quota, setup.cluster)
    found = by_key([item for item in built[name] if item["kind"] in QUEUE_KINDS])
    assert found == by_key(expected)
    priorities = {"PriorityClass", "WorkloadPriorityClass"}
    assert {key: item for key, item in found.items() if key[0] in priorities} == by_key(
        priority_objects()
    )
    assert len(priority_objects()) == 12, "six classes, each twice"


@pytest.mark.parametrize("name", SETUPS)
def test_the_kueue_objects_are_valid_against_the_crds(built, name):
    objects = [item for item in built[name] if item["apiVersion"] == KUEUE_API]
    assert {item["kind"] for item in objects} == set(schemas.KUEUE_CRDS)
    for item in objects:
        assert schemas.errors(schemas.kueue_crd(item["kind"]), item) == [], item["kind"]


def test_the_generated_files_are_what_the_code_gives():
    assert generate.stale() == [], "run python deploy/generate.py"
    for path, text in generate.rendered().items():
        assert (DEPLOY / path).read_text() == text


def test_generate_check_exits_0_on_the_committed_files():
    done = subprocess.run(
        [sys.executable, str(DEPLOY / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_generate_names_a_stale_file(tmp_path, monkeypatch):
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "cluster" / "kueue" / "queues.yaml").write_text("# edited by hand\n")
    monkeypatch.setattr(generate, "DEPLOY", copy)
    assert generate.stale() == [Path("cluster/kueue/queues.yaml")]
    assert generate.main(["--check"]) == 1
    assert generate.main([]) == 0
    assert generate.stale() == []


# --- the settings and the tokens of the service ---------------------------------------------


@pytest.mark.parametrize("name", SETUPS)
def test_the_settings_decode_with_the_services_loader(built, name, tmp_path):
    setup = SETUPS[name]
    settings = load_settings(settings_of(built[name], tmp_path))
    assert settings.backend == "argo"
    assert settings.owner == setup.owner
    cluster = msgspec.convert(msgspec.to_builtins(settings.cluster), ClusterConfig)
    assert cluster == setup.cluster, "the cluster of the settings is generate.py's ClusterConfig"
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert settings.simrun_wheel == Path(f"/opt/simrun/simrun-{version}-py3-none-any.whl")


@pytest.mark.parametrize("name", SETUPS)
def test_the_deployment_mounts_what_the_settings_name(built, name, tmp_path):
    settings = load_settings(settings_of(built[name], tmp_path))
    pod = service_pod(built[name])
    main = container(pod, "simrun")
    env = {item["name"]: item["value"] for item in main["env"]}
    mounts = {item["mountPath"]: item for item in main["volumeMounts"]}
    volumes = {item["name"]: item for item in pod["volumes"]}

    def volume_at(path: Path) -> dict[str, Any]:
        return volumes[mounts[str(path)]["name"]]

    config = Path(env["SIMRUN_CONFIG"])
    assert volume_at(config.parent)["configMap"]["name"] == "simrun-config"
    assert config.name == generate.SETTINGS_KEY
    assert volume_at(settings.tokens.parent)["secret"]["secretName"] == "simrun-tokens"
    store = volume_at(settings.store)["persistentVolumeClaim"]["claimName"]
    assert store == settings.cluster.store_claim
    assert settings.store == Path(settings.cluster.store_mount), "the pods' path of the store"
    assert volume_at(settings.db.parent)["persistentVolumeClaim"]["claimName"] == "simrun-data"
    assert pod["serviceAccountName"] == "simrun"


@pytest.mark.parametrize("name", SETUPS)
def test_the_tokens_secret_is_mounted_0400_and_passes_the_check(built, name, tmp_path):
    objects = built[name]
    pod = service_pod(objects)
    (volume,) = [item for item in pod["volumes"] if "secret" in item]
    assert volume["secret"]["secretName"] == "simrun-tokens"
    assert volume["secret"]["defaultMode"] == 0o400 == 256
    assert "fsGroup" not in pod.get("securityContext", {}), "fsGroup makes the file 0440"
    assert pod["securityContext"]["runAsUser"] == 0, "the files of a Secret volume are root's"

    settings = load_settings(settings_of(objects, tmp_path))
    secret = one(objects, "Secret", "simrun-tokens")
    tokens = tmp_path / "tokens" / settings.tokens.name
    tokens.parent.mkdir()
    tokens.write_text(secret["stringData"][settings.tokens.name])
    tokens.chmod(volume["secret"]["defaultMode"])
    assert load_tokens(tokens) == {}
    tokens.chmod(volume["secret"]["defaultMode"] | stat.S_IRGRP)
    with pytest.raises(TokensError, match="lets others read it"):
        load_tokens(tokens)


# --- the store ------------------------------------------------------------------------------


def test_the_store_is_nfs_with_the_mount_options_of_the_findings(built):
    objects = built["cluster"]
    storage = one(objects, "StorageClass", "simrun-nfs")
    assert storage["provisioner"] == "nfs.csi.k8s.io"
    assert storage["mountOptions"] == ["nfsvers=4.2", "lookupcache=positive"]
    settings = yaml.safe_load((DEPLOY / "cluster" / "store-settings.yaml").read_text())
    assert storage["parameters"]["server"] == settings["data"]["server"]
    assert storage["parameters"]["share"] == settings["data"]["share"]
    assert ("ConfigMap", "store-settings") not in by_key(objects), "local to the build"
    claim = one(objects, "PersistentVolumeClaim", generate.CLUSTER.cluster.store_claim)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == "simrun-nfs"


def test_the_k3d_store_is_a_host_path_every_node_mounts(built):
    objects = built["k3d"]
    claim = one(objects, "PersistentVolumeClaim", generate.K3D.cluster.store_claim)
    volume = one(objects, "PersistentVolume", claim["spec"]["volumeName"])
    assert claim["spec"]["storageClassName"] == "" == volume["spec"]["storageClassName"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] == volume["spec"]["accessModes"]
    assert volume["spec"]["claimRef"] == {"namespace": "simrun", "name": "simrun-store"}
    k3d = yaml.safe_load((DEPLOY / "k3d" / "k3d.yaml").read_text())
    (mount,) = k3d["volumes"]
    assert mount["volume"].split(":")[1] == volume["spec"]["hostPath"]["path"]
    assert set(mount["nodeFilters"]) == {"server:*", "agent:*"}


# --- the registry, the cluster of k3d ---------------------------------------------------------


@pytest.mark.parametrize("name", SETUPS)
def test_one_registry_in_the_settings_the_image_and_buildkit(built, name):
    objects = built[name]
    registry = SETUPS[name].cluster.registry
    image = container(service_pod(objects), "simrun")["image"]
    assert image.startswith(f"{registry}/simrun-service:")
    settings = yaml.safe_load(one(objects, "ConfigMap", "simrun-config")["data"]["settings.yaml"])
    assert settings["default_image"] == image, "a run without sources runs in the service's image"
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert image.endswith(f":{version}")
    toml = tomllib.loads(one(objects, "ConfigMap", "buildkitd-config")["data"]["buildkitd.toml"])
    assert toml["registry"] == {registry: {"http": True, "insecure": True}}


def test_the_k3d_cluster_has_three_labelled_agents_and_its_registry(built):
    k3d = yaml.safe_load((DEPLOY / "k3d" / "k3d.yaml").read_text())
    assert (k3d["apiVersion"], k3d["kind"]) == ("k3d.io/v1alpha5", "Simple")
    assert (k3d["servers"], k3d["agents"]) == (1, 3)
    (label,) = k3d["options"]["k3s"]["nodeLabels"]
    assert label == {"label": f"{labels.WORKER_NODE}=true", "nodeFilters": ["agent:*"]}
    created = k3d["registries"]["create"]
    assert f"{created['name']}:{created['hostPort']}" == generate.K3D.cluster.registry
    assert k3d["options"]["kubeconfig"]["updateDefaultKubeconfig"] is False
    objects = built["k3d"]
    assert one(objects, "Deployment", "simrun")["spec"]["replicas"] == 0
    assert by_key(objects).keys() & (ZOT | NFS) == set()


# --- Argo, the rights, the infrastructure ----------------------------------------------------


@pytest.mark.parametrize("name", SETUPS)
def test_the_executor_requests_what_it_limits(built, name):
    config = one(built[name], "ConfigMap", "workflow-controller-configmap")
    executor = yaml.safe_load(config["data"]["executor"])
    resources = executor["resources"]
    assert resources["requests"] == resources["limits"]
    assert resources["limits"]["memory"] == "256Mi"


@pytest.mark.parametrize("name", SETUPS)
def test_the_backend_subtracts_the_executor_of_the_controller_config(built, name):
    nodes = pytest.importorskip("simrun_api.backends.argo_nodes")
    config = one(built[name], "ConfigMap", "workflow-controller-configmap")
    requests = yaml.safe_load(config["data"]["executor"])["resources"]["requests"]
    assert requests["cpu"] == f"{round(nodes.EXECUTOR_CORES * 1000)}m"
    assert requests["memory"] == f"{round(nodes.EXECUTOR_MEMORY_GB * 1024)}Mi"


def rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _grants(resource: str, *verbs: str, group: str = "") -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for verb in verbs}


def test_the_pods_of_the_workflows_may_report_their_results(built):
    objects = built["cluster"]
    account = generate.CLUSTER.cluster.service_account
    assert ("ServiceAccount", account) in by_key(objects)
    assert rules(one(objects, "Role", account)) == _grants(
        "workflowtaskresults", "create", "patch", group="argoproj.io"
    ) | _grants("pods", "patch")
    binding = one(objects, "RoleBinding", account)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": "simrun"}
    ]


def test_the_service_has_the_least_rights_it_needs(built):
    objects = built["cluster"]
    workflows = ("get", "list", "watch", "create", "update", "patch", "delete")
    assert rules(one(objects, "Role", "simrun")) == (
        _grants("workflows", *workflows, group="argoproj.io")
        | _grants("pods", "delete")
        | _grants("pods/log", "get")
        | _grants("jobs", "create", "delete", "get", "list", "watch", group="batch")
        | _grants("configmaps", "create", "delete")
    )
    assert rules(one(objects, "ClusterRole", "simrun")) == _grants(
        "nodes", "get", "list", "watch", "patch"
    ) | _grants("pods", "get", "list", "watch")
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        binding = one(objects, kind, "simrun")
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "simrun", "namespace": "simrun"}
        ]


def test_the_service_serves_on_all_addresses_and_is_probed(built):
    objects = built["cluster"]
    main = container(service_pod(objects), "simrun")
    assert main["command"] == ["simrun", "serve", "--host", "0.0.0.0", "--port", "8000"]
    (port,) = main["ports"]
    assert (port["name"], port["containerPort"]) == ("http", 8000)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["tcpSocket"]["port"] == "http", probe
    service = one(objects, "Service", "simrun")
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http"}]


@pytest.mark.parametrize("name", SETUPS)
def test_the_infrastructure_stays_off_the_worker_nodes(built, name):
    for item in built[name]:
        if item["kind"] == "Deployment":
            affinity = item["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
            (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"][
                "nodeSelectorTerms"
            ]
            assert term["matchExpressions"] == [
                {"key": labels.WORKER_NODE, "operator": "NotIn", "values": ["true"]}
            ], item["metadata"]["name"]


def test_buildkit_keeps_its_state_and_serves_the_address_of_the_config(built):
    objects = built["cluster"]
    address = generate.CLUSTER.cluster.buildkit
    host, port = re.fullmatch(r"tcp://([^.:]+)\.([^:]+):(\d+)", address).group(1, 3)
    service = one(objects, "Service", host)
    assert service["spec"]["ports"][0]["port"] == int(port)
    pod = one(objects, "Deployment", "buildkitd")["spec"]["template"]["spec"]
    state = one(objects, "PersistentVolumeClaim", "buildkitd-state")
    assert state["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert state["spec"]["storageClassName"] == "local-path"
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims == {"buildkitd-state"}
    buildkitd = container(pod, "buildkitd")
    assert buildkitd["image"].endswith("-rootless")
    assert not buildkitd["securityContext"].get("privileged", False)
    assert f"tcp://0.0.0.0:{port}" in buildkitd["args"]


# --- the release manifests ------------------------------------------------------------------


def _stand_ins() -> dict[str, list[dict[str, Any]]]:
    """The objects of the release manifests that the patches of upstream/ change."""

    def deployment(name: str, container_name: str, env: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": container_name, "image": "x", "env": env}]},
                },
            },
        }

    identity = {
        "name": "LEADER_ELECTION_IDENTITY",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
    }
    manager = deployment("kueue-controller-manager", "manager", [])
    manager["metadata"]["namespace"] = "kueue-system"
    return {
        KUEUE_URL: [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}},
            manager,
        ],
        ARGO_URL: [
            deployment("workflow-controller", "workflow-controller", [identity]),
            deployment("argo-server", "argo-server", []),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "workflow-controller-configmap"},
            },
        ],
    }


def test_upstream_names_the_release_urls_and_patches_them(tmp_path):
    upstream = DEPLOY / "cluster" / "upstream"
    resources = {
        path.parent.name: yaml.safe_load(path.read_text())["resources"]
        for path in upstream.glob("*/kustomization.yaml")
    }
    assert resources == {"kueue": [KUEUE_URL], "argo": [ARGO_URL]}

    copy = tmp_path / "cluster"
    shutil.copytree(DEPLOY / "cluster" / "namespace", copy / "namespace")
    shutil.copytree(upstream, copy / "upstream")
    for url, objects in _stand_ins().items():
        for path in (copy / "upstream").glob("*/kustomization.yaml"):
            text = path.read_text()
            if url in text:
                (path.parent / "release.yaml").write_text(yaml.safe_dump_all(objects))
                path.write_text(text.replace(url, "release.yaml"))
    objects = by_key(kustomize(copy / "upstream"))

    controller = objects[("Deployment", "workflow-controller")]
    assert controller["metadata"]["namespace"] == "simrun", "Argo in the namespace of the runs"
    (main,) = controller["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in main["env"]}
    assert env["DEFAULT_REQUEUE_TIME"]["value"] == "1s"
    assert "LEADER_ELECTION_IDENTITY" in env, "the patch adds to the released environment"
    assert objects[("Deployment", "kueue-controller-manager")]["metadata"]["namespace"] == (
        "kueue-system"
    )
    assert ("Namespace", "simrun") in objects
    for name in ("workflow-controller", "argo-server", "kueue-controller-manager"):
        spec = objects[("Deployment", name)]["spec"]["template"]["spec"]
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == labels.WORKER_NODE


# --- the image of the service and CI ---------------------------------------------------------


def test_the_service_image_installs_the_wheel_without_dev_extras():
    text = (DEPLOY / "service" / "Dockerfile").read_text()
    assert "ARG BASE=python:3.11-slim" in text
    assert "pip wheel --no-cache-dir --no-deps --wheel-dir /dist ." in text
    assert "pip install --no-cache-dir /opt/simrun/simrun-*.whl" in text
    assert "[dev]" not in text
    assert 'CMD ["simrun", "serve", "--host", "0.0.0.0", "--port", "8000"]' in text
    assert "ENV SIMRUN_CONFIG=/etc/simrun/config/settings.yaml" in text
    pod = service_pod(kustomize(DEPLOY / "cluster"))
    env = {item["name"]: item["value"] for item in container(pod, "simrun")["env"]}
    assert env["SIMRUN_CONFIG"] == "/etc/simrun/config/settings.yaml"
    assert generate.WHEEL_DIR == "/opt/simrun"


def test_ci_requires_kubectl_before_the_tests(tmp_path):
    run = (REPO / ".ci" / "run").read_text()
    assert run.index("command -v kubectl") < run.index('eval "$line"')
    # without kubectl on the PATH, .ci/run stops with a message before it runs anything
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "grep", "env"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run(
        [bash, str(REPO / ".ci" / "run")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": str(bin_dir)},
        check=False,
    )
    assert done.returncode != 0
    assert "kubectl" in done.stderr and "+ pip install" not in done.stdout
