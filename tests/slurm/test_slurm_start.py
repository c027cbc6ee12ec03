"""A service of `backend: slurm` that cannot drive Slurm says why in one line at its start: a
client command missing, a controller that does not answer, a `squeue` that refuses the fields
simrun polls."""

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


def test_serve_says_the_problem_in_one_line(slurm: SlurmCluster, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "tokens.yaml").write_text(
        yaml.safe_dump({"t-mk": {"name": "mk", "kind": "person"}})
    )
    (tmp_path / "tokens.yaml").chmod(0o600)
    settings = {"store": "store", "db": "db.sqlite", "tokens": "tokens.yaml", "owner": "mk"}
    (tmp_path / "settings.yaml").write_text(yaml.safe_dump({**settings, "backend": "slurm"}))
    env = {
        **slurm.env,
        "SIMRUN_CONFIG": str(tmp_path / "settings.yaml"),
        "PATH": f"{tmp_path / 'empty'}{os.pathsep}{Path(sys.executable).parent}",
    }
    done = subprocess.run(
        [sys.executable, "-m", "simrun_cli", "serve"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "backend slurm" in lines[0] and "not on PATH" in lines[0], lines
