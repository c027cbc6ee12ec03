"""A real Slurm cluster of the tests on this machine: Debian's `slurm-wlm` and `munge`.

`start_slurm_cluster(root)` writes a `slurm.conf` (and `gres.conf`) into `root` and starts, under
one keeper process (`keeper.py`), a munged with a socket and key of its own, a slurmctld, and one
`slurmd -N nodeN` per emulated node, each on a free port with `NodeHostname=localhost`. The
partitions are simrun's six priority classes, each of its class's value as `PriorityTier`,
with `PreemptType=preempt/partition_prio` and `PreemptMode=REQUEUE` (a job of a higher tier
requeues one of a lower), `JobAcctGatherParams=OverMemoryKill` (a job above its `--mem` is
killed), job completion records in `jobcomp.log`, and `gpus_per_node` GPUs a node backed by
stand-in device files (`/dev/tty1`...). `SlurmCluster.stop()` ends every daemon and every job
process by pid (the keeper is their subreaper). A client finds the cluster through
`SlurmCluster.env` (`SLURM_CONF`), as any Slurm client does.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from wait_helpers import wait_until

from simrun_core.planner import priority_class_values

KEEPER = Path(__file__).with_name("keeper.py")
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")
STAND_IN_GPUS = ("/dev/tty1", "/dev/tty2", "/dev/tty3", "/dev/tty4")


class SlurmMissing(RuntimeError):
    """Slurm or munge is not installed here."""


@dataclasses.dataclass
class SlurmCluster:
    """A running cluster: its directory, its configuration and the keeper of its daemons."""

    root: Path
    nodes: list[str]
    partitions: dict[str, int]
    keeper: subprocess.Popen[bytes]
    cpus_per_node: int
    memory_mb_per_node: int
    gpus_per_node: int

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment of a Slurm client of this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def jobcomp(self) -> Path:
        """Slurm's job completion records: one line per ended job."""
        return self.root / "log" / "jobcomp.log"

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command of this cluster, its output as text."""
        return subprocess.run(
            command, env=self.env, capture_output=True, text=True, check=check, timeout=60
        )

    def queue(self) -> list[dict[str, str]]:
        """The jobs in Slurm's queue: id, name, partition, state, node list and reason."""
        fields = ["id", "name", "partition", "state", "nodes", "reason"]
        out = self.run("squeue", "--noheader", "--format=%i|%j|%P|%T|%N|%r").stdout
        return [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines()]

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %T").stdout
        return dict(line.split() for line in out.splitlines())

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until every node is idle (or mixed/allocated: up and answering)."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            if self.keeper.poll() is not None:
                raise RuntimeError(f"the Slurm keeper exited: {self.log_tail()}")
            try:
                states = self.node_states()
            except subprocess.CalledProcessError:
                states = {}
            if len(states) == len(self.nodes) and all(
                state.rstrip("*") in {"idle", "mixed", "allocated"} for state in states.values()
            ):
                return
            time.sleep(0.2)
        raise TimeoutError(f"Slurm's nodes did not come up: {states}\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        texts = []
        for log in [self.root / "keeper.log", *sorted((self.root / "log").glob("*.log"))]:
            if log.is_file():
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                texts.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(texts)

    def stop(self, timeout: float = 60.0) -> None:
        """End the daemons and every job process (the keeper kills them by pid)."""
        if self.keeper.poll() is None:
            self.keeper.send_signal(signal.SIGTERM)
            try:
                self.keeper.wait(timeout)
            except subprocess.TimeoutExpired:
                self.keeper.kill()
                self.keeper.wait()
        sockets = (self.root / "munge").resolve().parent  # the short directory of the sockets
        if sockets != self.root:
            shutil.rmtree(sockets, ignore_errors=True)


def poll_until(condition: Callable[[], Any], timeout: float = 60.0, what: str = "") -> Any:
    """`wait_until` at the pace of a Slurm command (every 0.2 s), for a minute unless told."""
    return wait_until(condition, timeout, what, every=0.2)


PORTS = range(20000, 32000)
"""Where the daemons' ports are chosen: below the kernel's ephemeral ports (32768 and up), which
outgoing connections take at any moment, so no connection takes a port before its daemon."""
PORTS_LOCK = Path(tempfile.gettempdir()) / "simrun-slurm-tests-ports.lock"
"""Held by one process from choosing a cluster's ports until its daemons listen on them, so
two clusters started at once (xdist workers) never choose the same port."""


def free_ports(count: int) -> list[int]:
    """`count` distinct ports of `PORTS` free now (hold `PORTS_LOCK` until they are bound)."""
    chosen: list[int] = []
    for port in random.sample(PORTS, len(PORTS)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
        if len(chosen) == count:
            return chosen
    raise RuntimeError(f"fewer than {count} free ports in {PORTS}")


def partition_tiers() -> dict[str, int]:
    """The partitions of the tests: simrun's six priority classes, each its class's value."""
    return dict(priority_class_values())


def slurm_conf(
    root: Path,
    nodes: list[str],
    ports: list[int],
    partitions: dict[str, int],
    *,
    cpus: int,
    memory_mb: int,
    gpus: int,
    extra_conf: tuple[str, ...] = (),
) -> str:
    """The `slurm.conf` of a cluster in `root`: `ports[0]` the controller's, then one a node;
    `extra_conf` lines added (a test's `Prolog=`)."""
    lines = [
        "ClusterName=simruntest",
        # Job ids of their own, so that the jobs of two clusters of the tests on one host
        # (xdist workers) are never confused in what they leave on the host.
        f"FirstJobId={random.randrange(1, 60_000) * 1000}",  # MaxJobId is 67,043,328
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ports[0]}",
        f"SlurmUser={_user()}",
        f"SlurmdUser={_user()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={(root / 'munge').resolve() / 'munge.sock'},cred_expire=10",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={(root / 'spool').resolve() / '%n'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=sched_interval=1",
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=1",
        "JobAcctGatherParams=OverMemoryKill",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={root / 'log' / 'jobcomp.log'}",
        "MinJobAge=600",
        "ReturnToService=1",
        "MpiDefault=none",
        "SwitchType=switch/none",
        # The emulated nodes claim what the configuration says, not the machine's hardware.
        "SlurmdParameters=config_overrides",
        "KillWait=5",
        "InactiveLimit=0",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=30",
        *extra_conf,
    ]
    if gpus:
        lines.append("GresTypes=gpu")
    gres = f" Gres=gpu:{gpus}" if gpus else ""
    for node, port in zip(nodes, ports[1:], strict=True):
        lines.append(
            f"NodeName={node} NodeHostname=localhost Port={port} CPUs={cpus} "
            f"RealMemory={memory_mb}{gres} State=UNKNOWN"
        )
    all_nodes = ",".join(nodes)
    for name, tier in partitions.items():
        lines.append(
            f"PartitionName={name} Nodes={all_nodes} PriorityTier={tier} "
            "OverSubscribe=NO MaxTime=INFINITE State=UP"
        )
    return "\n".join(lines) + "\n"


def gres_conf(gpus: int) -> str:
    """GPUs backed by stand-in device files: Slurm counts and hands them out as real ones."""
    return "AutoDetect=off\n" + "".join(f"Name=gpu File={f}\n" for f in STAND_IN_GPUS[:gpus])


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def check_installed() -> None:
    """SlurmMissing naming what is not installed."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        raise SlurmMissing(
            f"{', '.join(missing)} not found: the Slurm tests need Debian's slurm-wlm and munge "
            "(apt-get install -y slurm-wlm munge; .ci/run installs them)"
        )


def start_slurm_cluster(
    root: Path,
    nodes: int = 3,
    *,
    cpus: int = 2,
    memory_mb: int = 2000,
    gpus: int = 2,
    partitions: dict[str, int] | None = None,
    node_prefix: str = "node",
    extra_conf: tuple[str, ...] = (),
) -> SlurmCluster:
    """Write the configuration into `root` (a fresh directory) and start the cluster; returns
    once every node is up. `extra_conf`: lines added to its `slurm.conf`."""
    check_installed()
    names = [f"{node_prefix}{index}" for index in range(1, nodes + 1)]
    tiers = partition_tiers() if partitions is None else partitions
    if gpus > len(STAND_IN_GPUS):
        raise ValueError(f"at most {len(STAND_IN_GPUS)} stand-in GPUs a node")
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # munged refuses a socket directory others may write
    # The sockets of munged and of each job's slurmstepd live in a short directory of /tmp:
    # a Unix socket's path has at most 108 bytes, less than a test's temporary directory
    # (popen-gw1/test_.../spool/node1/node1_<job>.<step>) may take.
    short = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    for directory in ("munge", "spool"):
        (short / directory).mkdir()
        (root / directory).symlink_to(short / directory)
    for directory in ("state", "log"):
        (root / directory).mkdir(exist_ok=True)
    short.chmod(0o755)  # munged refuses a socket directory others may write
    (root / "munge").resolve().chmod(0o711)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (root / "gres.conf").write_text(gres_conf(gpus))
    (root / "nodes").write_text("\n".join(names) + "\n")
    with open(PORTS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (root / "slurm.conf").write_text(
            slurm_conf(
                root,
                names,
                free_ports(nodes + 1),
                tiers,
                cpus=cpus,
                memory_mb=memory_mb,
                gpus=gpus,
                extra_conf=extra_conf,
            )
        )
        keeper = subprocess.Popen(
            [sys.executable, str(KEEPER), str(root)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(root / "keeper.err", "ab"),  # noqa: SIM115 - the keeper's whole life
            start_new_session=True,
        )
        cluster = SlurmCluster(
            root=root,
            nodes=names,
            partitions=tiers,
            keeper=keeper,
            cpus_per_node=cpus,
            memory_mb_per_node=memory_mb,
            gpus_per_node=gpus,
        )
        try:
            cluster.wait_idle()  # every daemon listens on its port
        except BaseException:
            cluster.stop()
            raise
    return cluster
