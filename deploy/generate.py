"""Write the YAML of `deploy/` that simrun's code defines; run by hand after a change:

    python deploy/generate.py          # write the files
    python deploy/generate.py --check  # exit 1 if a committed file differs (what the tests check)

The Kueue objects and the six priority classes are `simrun_core.kueue`'s (`kueue_objects`,
`priority_objects`), the `cluster:` of the service's settings is a `simrun_core.cluster
.ClusterConfig`, so every one of these objects has one definition. The values a setup fills in
are `CLUSTER` (deploy/cluster) and `K3D` (the overlay deploy/k3d) below: the quota of the worker
nodes, the registry and the owner. The other values of a setup (the NFS export, the tokens, the
registry in the images and in BuildKit's configuration) are in the manifests: see
deploy/README.md.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import yaml

from simrun_core.cluster import ClusterConfig
from simrun_core.kueue import Quota, cluster_queue, kueue_objects, priority_objects
from simrun_core.slurm import partitions_conf

DEPLOY = Path(__file__).resolve().parent
REPO = DEPLOY.parent


@dataclass(frozen=True)
class Setup:
    """The values of one deployment that the generated files carry."""

    quota: Quota
    """The nominal quota of the ClusterQueue: the allocatable resources of the worker nodes."""
    cluster: ClusterConfig
    """The cluster of the service's settings (`cluster:`), the registry included."""
    owner: str
    """The person who owns the cluster (`owner` of the settings)."""
    hosts: tuple[str, ...]
    """The names the clients reach the service by (`hosts` of the settings): a request with
    another `Host` is refused, so that no page of another site reaches it by DNS rebinding."""


CLUSTER = Setup(
    quota=Quota(cores=48, memory_gb=188, gpus=0, ephemeral_storage_gb=900),
    cluster=ClusterConfig(registry="registry.cluster.internal:5000"),
    owner="mk",
    # the name of the lab network, the Service's names in the cluster, and `kubectl
    # port-forward` (localhost)
    hosts=(
        "simrun.cluster.internal",
        "simrun.simrun.svc",
        "simrun.simrun.svc.cluster.local",
        "localhost",
        "127.0.0.1",
    ),
)
"""The cluster of the design (deploy/cluster): fill in the quota, the registry and the owner."""

K3D = Setup(
    # Three agents of 6 GiB (deploy/k3d/k3d.yaml); an agent sees every core of its host, so
    # `cores` is what the runs may use of them together.
    quota=Quota(cores=12, memory_gb=18, gpus=0, ephemeral_storage_gb=150),
    cluster=ClusterConfig(registry="k3d-simrun-registry:5000"),
    owner="mk",
    hosts=("simrun.simrun.svc", "simrun.simrun.svc.cluster.local", "localhost", "127.0.0.1"),
)
"""The k3d cluster of the tests (deploy/k3d): the registry of k3d, the quota of its agents."""

CLIENT_LIMITS: dict[str, Any] = {
    "max_connections": 8192,
    "header_timeout_s": 10.0,
    "body_timeout_s": 20.0,
    "body_min_rate": 500,
    "keep_alive_s": 5.0,
    "max_streams_per_identity": 64,
    "stream_queue_bytes": 128 * 1024,
    "max_upload_bytes": 2 * 1024**3,
    "max_snapshot_files": 500_000,
    "max_edit_session_bytes": 1024**2,
    "max_edit_sessions_per_identity": 20,
    "edit_session_max_age_s": 7 * 24 * 3600.0,
}
"""What the clients of a group's service may hold (README, "Limits of the service"): the
connections open at once (503 beyond; the service raises its open-file limit to the pod's hard
limit), the deadline of a request's headers, the minimum rate of its body (408 below), the idle
keep-alive, the event streams per identity (429 beyond) and the bytes a stream holds for a
client that does not take them; the bytes an upload of a snapshot may write (its tar's members
as they declare them, 413 beyond) and the files of a snapshot's file list; the bytes of an edit
session, the sessions of an identity (429 beyond when all are connected) and the age after which
a closed or idle one goes."""

SETTINGS_KEY = "settings.yaml"
"""The key of the settings file in the ConfigMap `simrun-config`."""
DB = "/var/lib/simrun/index.db"
"""The index and the learned resources (SQLite), on the local volume `simrun-data`."""
TOKENS = "/etc/simrun/tokens/tokens.yaml"
"""The tokens file: the Secret `simrun-tokens`, mounted 0400."""
WHEEL_DIR = "/opt/simrun"
"""Where deploy/service/Dockerfile puts the wheel of simrun."""
SERVICE_IMAGE = "simrun-service"
"""The repository of the image of deploy/service/Dockerfile in the registry."""


def version() -> str:
    """The version of simrun, from pyproject.toml (the wheel the service image carries)."""
    with (REPO / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def settings(setup: Setup) -> dict[str, Any]:
    """The service's settings file (`simrun_api.settings.ServiceSettings`) of a setup: the
    store where the pods mount it, `backend: argo`, the cluster of `setup.cluster`. A run
    whose model has no environment of its own runs in the image of the service, which has
    simrun, its harness and the plugins of the service."""
    cluster = msgspec.json.decode(msgspec.json.encode(setup.cluster))
    return {
        "store": setup.cluster.store_mount,
        "db": DB,
        "tokens": TOKENS,
        "owner": setup.owner,
        "backend": "argo",
        "default_image": f"{setup.cluster.registry}/{SERVICE_IMAGE}:{version()}",
        "simrun_wheel": f"{WHEEL_DIR}/simrun-{version()}-py3-none-any.whl",
        "cluster": {key: value for key, value in cluster.items() if value is not None},
        "hosts": list(setup.hosts),
        **CLIENT_LIMITS,
    }


def settings_config_map(setup: Setup) -> dict[str, Any]:
    """The ConfigMap `simrun-config` holding the settings file."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "simrun-config", "namespace": setup.cluster.namespace},
        "data": {SETTINGS_KEY: dump([settings(setup)])},
    }


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line strings as literal blocks."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def dump(documents: list[dict[str, Any]]) -> str:
    """YAML documents in the order of their keys, without line wrapping."""
    return yaml.dump_all(
        documents, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000
    )


def _file(source: str, documents: list[dict[str, Any]]) -> str:
    header = (
        f"# Generated by deploy/generate.py from {source}: do not edit.\n"
        "# Change the code or the values of deploy/generate.py and run it again.\n"
    )
    return header + dump(documents)


def rendered() -> dict[Path, str]:
    """Every generated file, by its path below deploy/, with its text."""
    priorities = priority_objects()
    queues = [
        item for item in kueue_objects(CLUSTER.quota, CLUSTER.cluster) if item not in priorities
    ]
    return {
        Path("cluster/priority-classes.yaml"): _file(
            "simrun_core.kueue.priority_objects()", priorities
        ),
        Path("cluster/kueue/queues.yaml"): _file("simrun_core.kueue.kueue_objects()", queues),
        Path("cluster/simrun-config.yaml"): _file(
            "simrun_core.cluster.ClusterConfig (CLUSTER)", [settings_config_map(CLUSTER)]
        ),
        Path("k3d/queues.yaml"): _file(
            "simrun_core.kueue.cluster_queue() (K3D)", [cluster_queue(K3D.quota)]
        ),
        Path("k3d/simrun-config.yaml"): _file(
            "simrun_core.cluster.ClusterConfig (K3D)", [settings_config_map(K3D)]
        ),
        Path("slurm/partitions.conf"): (
            "# Generated by deploy/generate.py from simrun_core.slurm.partitions_conf(): do not\n"
            "# edit. Append it to the site's slurm.conf (Nodes=ALL: every node; narrow it there).\n"
            + partitions_conf()
        ),
    }


def stale() -> list[Path]:
    """The generated files whose committed text differs from what the code gives."""
    return [
        path
        for path, text in rendered().items()
        if not (DEPLOY / path).exists() or (DEPLOY / path).read_text() != text
    ]


def main(argv: list[str] | None = None) -> int:
    """Write the generated files, or with --check name the stale ones and exit 1."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    args = parser.parse_args(argv)
    if args.check:
        paths = stale()
        for path in paths:
            print(f"deploy/{path} is stale: run python deploy/generate.py", file=sys.stderr)
        return 1 if paths else 0
    for path, text in rendered().items():
        target = DEPLOY / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote deploy/{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
