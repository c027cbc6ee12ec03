"""`simrun render WORKFLOW --slurm`: the batch scripts a submission on Slurm would create, one a
worker, with no service and no cluster: the run id in every job's name, the partitions of the
run's class, the cores, memory and GPUs of the plan, `--requeue` for the extra workers, the
`slurm:` block of a settings file."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import run_simrun, write_squares

from simrun_core.slurm_jobs import RENDER_RUN_ID

ROOT = Path(__file__).parents[2]


def scripts_of(text: str) -> list[str]:
    """The scripts of `render --slurm`'s text: each starts with its `#!` line."""
    parts = re.split(r"\n(?=#!/bin/bash\n)", text)
    return [part if part.endswith("\n") else part + "\n" for part in parts if part.strip()]


def options(script: str) -> list[str]:
    """The `#SBATCH` options of a script, in order."""
    return [
        line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")
    ]


def option(script: str, name: str) -> str | None:
    """The value of one `--name=value` option of a script, None when it has none."""
    found = [o.split("=", 1)[1] for o in options(script) if o.startswith(f"--{name}=")]
    assert len(found) <= 1, found
    return found[0] if found else None


def render(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_simrun("render", *args, cwd=tmp_path)


def test_squares_renders_a_script_per_worker_named_after_the_run(tmp_path):
    done = render(tmp_path, str(ROOT / "examples/squares.yaml"), "--slurm")
    assert done.returncode == 0, done.stderr
    scripts = scripts_of(done.stdout)
    names = [option(script, "job-name") for script in scripts]
    assert names == [f"simrun-{RENDER_RUN_ID}-squares-w{n}" for n in range(3)]  # 3 default nodes
    base, *extras = scripts
    assert option(base, "partition") == "simrun-standard-base"
    assert "--no-requeue" in options(base) and "--requeue" not in options(base)
    for extra in extras:
        assert option(extra, "partition") == "simrun-standard-extra"
        assert "--requeue" in options(extra) and "--no-requeue" not in options(extra)
    for script in scripts:
        assert option(script, "cpus-per-task") == "8"
        assert option(script, "mem") == "3072M"
        assert option(script, "gres") is None
        assert "/shared/simrun/store/runs/" in option(script, "output")
        assert script.rstrip().endswith("-m simrun_harness.worker")
        checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
        assert checked.returncode == 0, checked.stderr
    assert "export SIMRUN_ROLE=base" in base and "export SIMRUN_MERGE=1" in base
    assert all("export SIMRUN_ROLE=extra" in extra for extra in extras)
    assert not (tmp_path / ".simrun").exists(), "render needs no service"


def test_json_holds_the_same_scripts_with_their_names_and_partitions(tmp_path):
    example = str(ROOT / "examples/squares.yaml")
    text = render(tmp_path, example, "--slurm").stdout
    jobs = json.loads(render(tmp_path, example, "--slurm", "--json").stdout)
    assert [job["script"] for job in jobs] == scripts_of(text)
    assert [(job["task"], job["worker"], job["partition"]) for job in jobs] == [
        ("squares", "w0", "simrun-standard-base"),
        ("squares", "w1", "simrun-standard-extra"),
        ("squares", "w2", "simrun-standard-extra"),
    ]
    assert all(job["name"] == option(job["script"], "job-name") for job in jobs)


def write_two_tasks(directory: Path) -> Path:
    """A GPU `command` task, and a `command` task reading its output."""

    def command(task_id: str, args: list[str], **resources: float) -> dict[str, Any]:
        settings = {"image": "t:1", "args": args, **resources}
        return {"id": task_id, "type": "command", "settings": settings}

    train = command("train", ["train", "{out}"], cores=2, memory_gb=4, gpus=2)
    report = command("report", ["report", "{input}"], cores=1, memory_gb=1)
    report["inputs"] = {"model": "train.out"}
    path = directory / "two.yaml"
    path.write_text(yaml.safe_dump({"name": "two", "tasks": [train, report]}, sort_keys=False))
    return path


def test_a_settings_file_gives_the_partitions_store_and_options_of_the_jobs(tmp_path):
    workflow = write_two_tasks(tmp_path)
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("- {name: gpu1, cores: 4, memory_gb: 16, gpus: 2}\n")
    settings = tmp_path / "settings.yaml"
    block = {
        "partitions": {"simrun-standard-base": "batch"},
        "scratch_path": "/local/scratch",
        "account": "lab",
        "sbatch_options": ["--constraint=avx2"],
        "python": "/shared/venv/bin/python",
    }
    settings.write_text(
        yaml.safe_dump({"store": "shared/store", "backend": "slurm", "slurm": block})
    )
    args = ("--slurm", "--nodes", str(nodes), "--settings", str(settings), "--reserve", "gpu1")
    done = render(tmp_path, str(workflow), *args)
    assert done.returncode == 0, done.stderr
    train, report = scripts_of(done.stdout)
    store = tmp_path / "shared" / "store"
    for script, task in [(train, "train"), (report, "report")]:
        assert option(script, "job-name") == f"simrun-{RENDER_RUN_ID}-{task}-{task}"
        assert option(script, "partition") == "batch"
        assert option(script, "account") == "lab"
        assert option(script, "reservation") == f"simrun-{RENDER_RUN_ID}"
        assert "--constraint=avx2" in options(script)
        assert (
            option(script, "output")
            == f"{store}/runs/{RENDER_RUN_ID}/tasks/{task}/logs/{task}-0.log"
        )
        assert f"export SIMRUN_SCRATCH=/local/scratch/{RENDER_RUN_ID}/{task}/{task}/" in script
    assert (option(train, "cpus-per-task"), option(train, "mem"), option(train, "gres")) == (
        "2",
        "4096M",
        "gpu:2",
    )
    assert option(report, "gres") is None and option(report, "mem") == "1024M"
    assert train.rstrip().endswith(f"exec train {store}/runs/{RENDER_RUN_ID}/tasks/train/out")
    assert report.rstrip().endswith(
        f"exec report model={store}/runs/{RENDER_RUN_ID}/tasks/train/out/out"
    )


@pytest.mark.parametrize(
    ("args", "settings", "message"),
    [
        (("--argo", "--slurm"), None, "render needs what to render: --argo or --slurm"),
        (("--argo", "--settings", "s.yaml"), None, "--settings is read with --slurm only"),
        (("--slurm", "--settings", "s.yaml"), None, "s.yaml: cannot be read"),
        (("--slurm", "--settings", "s.yaml"), "- a\n", "s.yaml: not a mapping of setting"),
        (
            ("--slurm", "--settings", "s.yaml"),
            "slurm: {partitons: {}}\n",
            "s.yaml: slurm: Object contains unknown field `partitons`",
        ),
        (("--slurm", "--settings", "s.yaml"), "slurm: {grace_s: soon}\n", "$.grace_s"),
        (("--slurm", "--reserve", "nowhere"), None, "reserve"),
    ],
)
def test_what_cannot_be_rendered_for_slurm_is_refused_naming_it(tmp_path, args, settings, message):
    workflow = write_squares(tmp_path)
    if settings is not None:
        (tmp_path / "s.yaml").write_text(settings)
    done = render(tmp_path, str(workflow), *args)
    assert done.returncode == 1
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""
