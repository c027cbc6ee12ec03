"""The keeper of a Slurm cluster of the tests: one process that starts the daemons and owns them.

Run as `python keeper.py ROOT`: it becomes a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so
every process the daemons start (each job's slurmstepd and the job's own processes, which
daemonise away from slurmd) stays its descendant; it starts munged, slurmctld and one slurmd
per node of `ROOT/nodes`, all in the foreground, writes `ROOT/keeper.ready` once they run and
on SIGTERM ends every descendant by pid: the daemons first (SIGTERM), then whatever is left
(SIGKILL), and reaps them. A daemon that exits early ends the keeper with its name in
`ROOT/keeper.log`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def descendants(root_pid: int) -> list[int]:
    """Every live descendant of `root_pid`, read from /proc (children before their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    queue = [root_pid]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def end_all(daemons: list[subprocess.Popen[bytes]], grace_s: float = 5.0) -> None:
    """SIGTERM the daemons, then SIGKILL every descendant left, and reap them all."""
    for daemon in daemons:
        if daemon.poll() is None:
            daemon.terminate()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(d.poll() is None for d in daemons):
        time.sleep(0.05)
    for _ in range(50):
        left = descendants(os.getpid())
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap(daemons)
        for daemon in daemons:
            daemon.poll()
        time.sleep(0.05)


def _reap(daemons: list[subprocess.Popen[bytes]]) -> None:
    """Reap the adopted processes that ended (the daemons are reaped by their `Popen`)."""
    own = {daemon.pid for daemon in daemons}
    for pid in descendants(os.getpid()):
        if pid in own:
            continue
        # Not a child of ours (a grandchild), or reaped already: nothing to reap.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def main(root: Path) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("prctl(PR_SET_CHILD_SUBREAPER) failed", file=sys.stderr)
        return 1
    stopping = False

    def stop(number: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}
    munge = (root / "munge").resolve()  # a short path: a socket path has at most 108 bytes
    commands = {
        "munged": [
            "munged",
            "--foreground",
            "--force",
            f"--socket={munge / 'munge.sock'}",
            f"--key-file={munge / 'munge.key'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        ],
        "slurmctld": ["slurmctld", "-D", "-i"],
    }
    for node in (root / "nodes").read_text().split():
        commands[f"slurmd {node}"] = ["slurmd", "-D", "-N", node]
    daemons: dict[str, subprocess.Popen[bytes]] = {}
    log = open(root / "keeper.log", "ab")  # noqa: SIM115 - the keeper's whole life
    try:
        for name, command in commands.items():
            daemons[name] = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
            if name == "munged":
                _wait_for(munge / "munge.sock", daemons[name], name)
        (root / "keeper.ready").write_text(str(os.getpid()))
        while not stopping:
            for name, daemon in daemons.items():
                if daemon.poll() is not None:
                    log.write(f"keeper: {name} exited with {daemon.returncode}\n".encode())
                    log.flush()
                    stopping = True
            _reap(list(daemons.values()))
            time.sleep(0.1)
    finally:
        end_all(list(daemons.values()))
        log.close()
    return 0


def _wait_for(path: Path, daemon: subprocess.Popen[bytes], name: str) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not create {path}")
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
