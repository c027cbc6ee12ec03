"""`simrun export WORKFLOW --cwl FILE`: the run prepared in a store without a service, and its CWL
workflow run by the real cwltool (`--no-container`, with and without `--parallel`) and Toil's
single-machine batch system, giving the bytes the same workflow gives in local mode.

The local runs go through the real local service (`simrun submit --local`), which plans one
worker per task here; the exports are planned on three nodes of one core, so every split task
is a coordinator and two scattered extra workers: the same outputs on 1 or 3 workers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from cli_helpers import cli_env, git, run_simrun

from simrun_cli.local import stop_local
from simrun_core.events import Submitted
from simrun_core.fold import RunRecord
from simrun_core.store import read_log

pytest.importorskip("cwltool", reason="the optional extra cwl (cwltool, cwl-utils)")
pytest.importorskip("cwl_utils", reason="the optional extra cwl (cwltool, cwl-utils)")

ROOT = Path(__file__).parents[2]
BIN = Path(sys.executable).parent
NODES = [{"name": f"n{i}", "cores": 1, "memory_gb": 2} for i in (1, 2, 3)]
SUM_SCRIPT = """\
import json, pathlib, sys
settings, out, literal, *pairs = sys.argv[1:]
total, names = 0, []
for pair in pairs:
    port, path = pair.split("=", 1)
    for unit in sorted(pathlib.Path(path).glob("*.json")):
        total += json.loads(unit.read_text())["square"]
        names.append(port + "/" + unit.name)
image = json.loads(pathlib.Path(settings).read_text())["image"]
summary = dict(total=total, units=len(names), image=image, literal=literal)
pathlib.Path(out, "summary.json").write_text(json.dumps(summary, sort_keys=True))
print("summed", len(names), "units")
"""
THREE = {
    "name": "three",
    "tasks": [
        {"id": "left", "type": "demo.squares", "settings": {"n": 40, "sleep_s": 0.02}},
        {"id": "right", "type": "demo.squares", "settings": {"n": 25, "sleep_s": 0.02}},
        {
            "id": "both",
            "type": "command",
            "inputs": {"left": "left.squares", "right": "right.squares"},
            "settings": {
                "image": "python:3.11-slim",
                "cores": 1,
                "memory_gb": 0.5,
                # a literal with what CWL would read as references and escapes
                "args": [
                    sys.executable,
                    "-c",
                    SUM_SCRIPT.replace("{", "{{").replace("}", "}}"),
                    "{settings}",
                    "{out}",
                    "$(inputs.store) ${{HOME}} \\$( a\\b",
                    "{input}",
                ],
            },
        },
    ],
}
WORKFLOWS = {"squares": "squares.yaml", "three": "three.yaml"}
TASKS = {"squares": ["squares"], "three": ["left", "right", "both"]}


def write_workflows(directory: Path) -> None:
    shutil.copy(ROOT / "examples" / "squares.yaml", directory / "squares.yaml")
    (directory / "three.yaml").write_text(yaml.safe_dump(THREE, sort_keys=False))
    (directory / "nodes.yaml").write_text(yaml.safe_dump(NODES))
    failing = {
        "name": "failing",
        "tasks": [
            {
                "id": "squares",
                "type": "demo.squares",
                "settings": {"n": 20, "sleep_s": 0.01, "fail_at": 7},
            }
        ],
    }
    (directory / "failing.yaml").write_text(yaml.safe_dump(failing, sort_keys=False))


def outputs(task_dir: Path) -> dict[str, bytes]:
    """Every file below the outputs of a task, by its path there, with its bytes."""
    out = task_dir / "out"
    return {
        str(path.relative_to(out)): path.read_bytes()
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }


def run_outputs(run_dir: Path, case: str) -> dict[str, dict[str, bytes]]:
    return {task: outputs(run_dir / "tasks" / task) for task in TASKS[case]}


class LocalRuns:
    """The workflows run in local mode in one project directory: their run directories."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict[str, Path] = {}
        self.seconds: dict[str, float] = {}


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRuns]:
    root = tmp_path_factory.mktemp("local")
    write_workflows(root)
    runs = LocalRuns(root)
    try:
        for case, workflow in WORKFLOWS.items():
            started = time.monotonic()
            result = run_simrun("submit", workflow, "--local", "--wait", cwd=root, timeout=300)
            assert result.returncode == 0, result.stdout + result.stderr
            runs.seconds[case] = time.monotonic() - started
            run_id = result.stdout.splitlines()[0].split(" run ", 1)[1].split(":", 1)[0]
            runs.runs[case] = root / ".simrun" / "store" / "runs" / run_id
        yield runs
    finally:
        stop_local(root, timeout_s=60)


def export(directory: Path, workflow: str, *options: str) -> dict[str, Any]:
    """`simrun export WORKFLOW --cwl run.cwl --store store --nodes nodes.yaml --json` in
    `directory`; what it printed."""
    result = run_simrun(
        "export",
        workflow,
        "--cwl",
        "run.cwl",
        "--store",
        "store",
        "--json",
        *options,
        cwd=directory,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    exported: dict[str, Any] = json.loads(result.stdout)
    return exported


def runner_env() -> dict[str, str]:
    """The environment of cwltool and Toil: the console scripts of this interpreter first, as
    the steps run `simrun-worker` from the PATH."""
    env = cli_env()
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", os.defpath)])
    return env


def runner(name: str) -> str | None:
    """A console script of a CWL runner, of this interpreter's first (`python -m cwltool`
    exits 0 whatever the status of the workflow)."""
    return shutil.which(name, path=str(BIN)) or shutil.which(name)


def cwltool(directory: Path, cwl: str, *options: str) -> subprocess.CompletedProcess[str]:
    script = runner("cwltool")
    assert script is not None, "cwltool is installed with its module"
    command = [script, "--no-container", *options]
    command += ["--outdir", str(directory / "cwl-out"), cwl]
    command += ["--scratch", str(directory / "scratch")]
    return subprocess.run(
        command,
        cwd=directory,
        env=runner_env(),
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_workflows(tmp_path)
    return tmp_path


# -- cwltool gives the bytes of local mode --------------------------------------------------------


# cwltool runs a step in about a second alone; on a loaded machine of 2 cores a chain of three
# took past the suite's 180 s once: the limit only catches a hang.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
@pytest.mark.parametrize("case", sorted(WORKFLOWS))
def test_cwltool_runs_the_export_with_the_outputs_of_local_mode(
    local_runs: LocalRuns, project: Path, case: str, parallel: bool
) -> None:
    exported = export(project, WORKFLOWS[case], "--nodes", "nodes.yaml")
    run_dir = Path(exported["store"]) / "runs" / exported["run"]
    result = cwltool(project, exported["cwl"], *(["--parallel"] if parallel else []))
    assert result.returncode == 0, result.stderr[-5000:]
    assert "Final process status is success" in result.stderr
    assert run_outputs(run_dir, case) == run_outputs(local_runs.runs[case], case)
    for task in TASKS[case]:
        settings = f"tasks/{task}/settings.json"
        assert (run_dir / settings).read_bytes() == (local_runs.runs[case] / settings).read_bytes()
    split = [task for task in TASKS[case] if task != "both"]
    for task in split:  # the coordinator and both extra workers ran (and reported)
        events = sorted(path.name for path in (run_dir / "tasks" / task / "events").iterdir())
        assert events == ["w0.0.jsonl", "w1.0.jsonl", "w2.0.jsonl"]
    if case == "three":
        summary = json.loads((run_dir / "tasks/both/out/summary.json").read_bytes())
        assert summary["literal"] == "$(inputs.store) ${HOME} \\$( a\\b"
        assert summary["units"] == 65


def test_a_failing_unit_fails_the_cwl_run_through_the_coordinator(project: Path) -> None:
    exported = export(project, "failing.yaml", "--nodes", "nodes.yaml")
    result = cwltool(project, exported["cwl"], "--parallel")
    assert result.returncode != 0
    assert "Final process status is permanentFail" in result.stderr
    assert "[step squares-w0] completed permanentFail" in result.stderr
    assert "w0: unit 7 failed: RuntimeError: unit 7 fails as fail_at asks" in result.stderr
    # the extra workers may have met the unit too: they never fail the workflow
    assert "[step squares-extra] completed permanentFail" not in result.stderr
    run_dir = Path(exported["store"]) / "runs" / exported["run"]
    assert not (run_dir / "tasks/squares/out/summary.json").exists()


# -- what the export writes -----------------------------------------------------------------------


def test_the_export_prepares_the_run_as_a_service_would(
    local_runs: LocalRuns, project: Path
) -> None:
    result = run_simrun(
        "export", "three.yaml", "--cwl", "run.cwl", "--store", "store", "--group", "study",
        cwd=project,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    run_id = lines[0].split(" ", 2)[1].rstrip(":")
    store = (project / "store").resolve()
    cwl = (project / "run.cwl").resolve()
    assert lines[0] == f"run {run_id}: prepared in {store} (3 tasks)"
    assert lines[1] == f"wrote {cwl} (3 steps); run it here:"
    assert lines[2].strip() == (
        f"cwltool --no-container --parallel {cwl} --store {store} --scratch /tmp/simrun-scratch"
    )
    assert (
        lines[4]
        .strip()
        .startswith(
            f"toil-cwl-runner --batchSystem slurm --jobStore {store}/runs/{run_id}/toil-jobstore "
        )
    )
    run_dir = store / "runs" / run_id
    [submitted] = read_log(run_dir / "events.jsonl")
    assert isinstance(submitted, Submitted)
    assert submitted.backend == "cwl" and submitted.group == "study" and submitted.seq == 1
    assert {plan.pods for plan in submitted.plans.values()} == {1}, "planned on this machine"
    record = msgspec.json.decode((run_dir / "run.json").read_bytes(), type=RunRecord)
    assert record.id == run_id and record.state == "submitting"
    local = local_runs.runs["three"]
    for task in TASKS["three"]:
        for name in ("settings.json", "provenance.json"):
            path = f"tasks/{task}/{name}"
            assert (run_dir / path).read_bytes() == (local / path).read_bytes(), path
        assert (run_dir / "tasks" / task / "out").is_dir()
    document = yaml.safe_load(cwl.read_text())
    assert document["inputs"]["store"]["default"] == str(store)


def test_the_sources_are_snapshotted_into_the_store(project: Path) -> None:
    model = project / "model"
    model.mkdir()
    git(model, "init", "-q", "-b", "main")
    (model / "model.py").write_text("VALUE = 1\n")
    git(model, "add", ".")
    git(model, "commit", "-q", "-m", "first")
    exported = export(project, "squares.yaml", "--source", "model=model")
    store = Path(exported["store"])
    [submitted] = read_log(store / "runs" / exported["run"] / "events.jsonl")
    assert isinstance(submitted, Submitted)
    [source] = submitted.sources
    assert source.name == "model" and source.snapshot is not None
    assert (store / source.snapshot / "model.py").read_text() == "VALUE = 1\n"
    [step] = yaml.safe_load(Path(exported["cwl"]).read_text())["steps"]
    env = {item["envName"]: item["envValue"] for item in step["run"]["requirements"][0]["envDef"]}
    assert env["PYTHONPATH"] == f"$(inputs.store)/{source.snapshot}"


def test_the_export_refuses_and_writes_nothing(project: Path) -> None:
    missing = run_simrun("export", "squares.yaml", cwd=project)
    assert missing.returncode == 1 and "--cwl FILE" in missing.stderr
    service = run_simrun(
        "export", "squares.yaml", "--cwl", "run.cwl", "--store", ".simrun/store", cwd=project
    )
    assert service.returncode == 1 and "the store of a service" in service.stderr
    (project / "bad.yaml").write_text(
        yaml.safe_dump({"name": "bad", "tasks": [{"id": "t", "type": "demo.squares"}]})
    )
    bad = run_simrun("export", "bad.yaml", "--cwl", "run.cwl", "--store", "store", cwd=project)
    assert bad.returncode == 1 and "bad.yaml: task 't'" in bad.stderr
    assert not (project / "store").exists() and not (project / "run.cwl").exists()
    assert not (project / ".simrun").exists()


# -- Toil ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_toil_runs_the_export_with_the_outputs_of_local_mode(
    local_runs: LocalRuns, project: Path
) -> None:
    toil = runner("toil-cwl-runner")
    if toil is None:
        pytest.skip("Toil is not installed: pip install 'toil[cwl]'")
    exported = export(project, "three.yaml", "--nodes", "nodes.yaml")
    run_dir = Path(exported["store"]) / "runs" / exported["run"]
    result = subprocess.run(
        [
            *(toil, "--jobStore", str(project / "jobstore"), "--no-container"),
            *("--workDir", str(project), "--outdir", str(project / "toil-out")),
            *(exported["cwl"], "--scratch", str(project / "scratch")),
        ],
        cwd=project,
        env=runner_env(),
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    assert run_outputs(run_dir, "three") == run_outputs(local_runs.runs["three"], "three")
