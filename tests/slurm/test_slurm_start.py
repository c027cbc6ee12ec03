"""A service of `backend: slurm` that cannot drive Slurm says why in one line at its start: a
client command missing, a controller that does not answer, a `squeue` that refuses the fields
simrun polls, a `slurm.grace_s` longer than Slurm's `KillWait`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from slurm_cluster import SlurmCluster

from simrun_api.backends.slurm import CLIENT_COMMANDS, client_problem


def commands_but_squeue(tmp_path: Path, squeue: str) -> str:
    """A PATH of the real Slurm commands but `squeue`, which is the script `squeue`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in CLIENT_COMMANDS:
        if name != "squeue":
            (bin_dir / name).symlink_to(subprocess.check_output(["which", name], text=True).strip())
    (bin_dir / "squeue").write_text(squeue)
    (bin_dir / "squeue").chmod(0o755)
    return str(bin_dir)


def test_a_cluster_that_answers_has_no_problem(slurm: SlurmCluster):
    assert client_problem(slurm.env) is None


def test_missing_client_commands_are_named(slurm: SlurmCluster, tmp_path):
    (tmp_path / "empty").mkdir()
    problem = client_problem({**slurm.env, "PATH": str(tmp_path / "empty")})
    assert problem == "the Slurm client commands sbatch, squeue, scancel, scontrol are not on PATH"


def test_a_controller_that_does_not_answer_is_named(slurm: SlurmCluster, tmp_path):
    conf = tmp_path / "slurm.conf"
    text = slurm.conf.read_text().replace("SlurmctldPort=", "SlurmctldPort=1").splitlines()
    conf.write_text("\n".join(text) + "\n")
    problem = client_problem({**slurm.env, "SLURM_CONF": str(conf)})
    assert problem is not None and "does not answer" in problem and str(conf) in problem


def test_a_squeue_refusing_the_polled_fields_stops_the_start(slurm: SlurmCluster, tmp_path):
    refusing = (
        "#!/bin/sh\necho 'squeue: error: Invalid --Format specification: exit_code' >&2\nexit 1\n"
    )
    path = commands_but_squeue(tmp_path, refusing)
    problem = client_problem({**slurm.env, "PATH": path})
    assert problem is not None
    assert "refuses the fields simrun polls" in problem and "exit_code" in problem


def test_a_grace_longer_than_slurms_kill_wait_is_named_with_both_numbers(slurm: SlurmCluster):
    assert "KillWait=5" in slurm.conf.read_text()
    problem = client_problem(slurm.env, grace_s=30)
    assert problem is not None
    assert "slurm.grace_s is 30 s" in problem and "KillWait of 5 s" in problem, problem
    assert client_problem(slurm.env, grace_s=5) is None


def serve_refused(tmp_path: Path, env: dict[str, str], **settings: object) -> str:
    """The one line of stderr of a `simrun serve` of `backend: slurm` that does not start."""
    (tmp_path / "tokens.yaml").write_text(
        yaml.safe_dump({"t-mk": {"name": "mk", "kind": "person"}})
    )
    (tmp_path / "tokens.yaml").chmod(0o600)
    base = {"store": "store", "db": "db.sqlite", "tokens": "tokens.yaml", "owner": "mk"}
    (tmp_path / "settings.yaml").write_text(
        yaml.safe_dump({**base, "backend": "slurm", **settings})
    )
    done = subprocess.run(
        [sys.executable, "-m", "simrun_cli", "serve"],
        env={**env, "SIMRUN_CONFIG": str(tmp_path / "settings.yaml")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_serve_says_the_problem_in_one_line(slurm: SlurmCluster, tmp_path):
    (tmp_path / "empty").mkdir()
    path = f"{tmp_path / 'empty'}{os.pathsep}{Path(sys.executable).parent}"
    line = serve_refused(tmp_path, {**slurm.env, "PATH": path})
    assert "backend slurm" in line and "not on PATH" in line, line


def test_serve_refuses_a_grace_slurm_does_not_give(slurm: SlurmCluster, tmp_path):
    line = serve_refused(tmp_path, slurm.env, slurm={"grace_s": 30})  # KillWait is 5 s
    assert "backend slurm" in line and "slurm.grace_s is 30 s" in line, line
    assert "KillWait of 5 s" in line, line
