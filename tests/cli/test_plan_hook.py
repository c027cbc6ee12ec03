"""The `plan` hook of a task type installed where the client runs (issue 15): `simrun submit`,
`simrun estimate`, `simrun validate` and the MCP tools plan the settings before they take the
snapshots and submit the planned ones; a plan that raises refuses the workflow.

The plugin `planplug` is installed in a site directory on `PYTHONPATH` (a package and its
metadata with the entry point of `plan.lines`), which the local service started by the
commands inherits, so it runs the type too. Its `plan` fills `units` from the model file:
one unit per line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import cli_env, run_simrun
from test_mcp import session

from simrun_cli.local import stop_local

PLUGIN = '''\
"""A plugin whose type plans its units from the model file: one unit per line."""
import json
import pathlib

import msgspec

from simrun_core.plugins import ResourceHint, TaskType


class LinesSettings(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    units: int | None = None
    scale: int = 1


def plan(settings):
    if settings.units is None:
        lines = pathlib.Path(settings.model).read_text().splitlines()
        settings = msgspec.structs.replace(settings, units=len(lines))
    return settings


def count_units(settings):
    if settings.units is None:
        raise ValueError("the units were not planned")
    return settings.units


def compute_unit(settings, index, paths):
    (paths.out / "lines").mkdir(parents=True, exist_ok=True)
    (paths.out / "lines" / f"{index}.json").write_text(json.dumps(index * settings.scale))


def merge(settings, paths):
    values = [json.loads((paths.out / "lines" / f"{i}.json").read_text())
              for i in range(settings.units)]
    (paths.out / "summary.json").write_text(json.dumps({"sum": sum(values)}))


LINES = TaskType(
    name="plan.lines",
    settings=LinesSettings,
    outputs=("lines",),
    hint=ResourceHint(memory_base_gb=0.1, memory_per_worker_gb=0.1),
    count_units="planplug:count_units",
    compute_unit="planplug:compute_unit",
    merge="planplug:merge",
    plan="planplug:plan",
)
'''
LINES = 6


class Project:
    """A project directory whose local service knows `plan.lines`, with a model file."""

    def __init__(self, root: Path, site: Path) -> None:
        self.root = root
        self.site = site
        self.env = cli_env(PYTHONPATH=str(site))
        self.model = root / "model.txt"
        self.model.write_text("".join(f"line {i}\n" for i in range(LINES)))

    def workflow(self, name: str, model: Path) -> Path:
        task = {"id": "scan", "type": "plan.lines", "settings": {"model": str(model)}}
        path = self.root / name
        path.write_text(yaml.safe_dump({"name": "lines", "tasks": [task]}, sort_keys=False))
        return path

    def simrun(self, *args: str) -> Any:
        return run_simrun(*args, "--local", cwd=self.root, env=self.env)

    def settings_of(self, run_id: str) -> dict[str, Any]:
        task = self.root / ".simrun" / "store" / "runs" / run_id / "tasks" / "scan"
        return json.loads((task / "settings.json").read_text())


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    root = tmp_path_factory.mktemp("plan")
    site = tmp_path_factory.mktemp("site")
    (site / "planplug").mkdir()
    (site / "planplug" / "__init__.py").write_text(PLUGIN)
    info = site / "planplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: planplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[simrun.task_types]\nplan.lines = planplug:LINES\n")
    try:
        yield Project(root, site)
    finally:
        stop_local(root, timeout_s=60)


def test_submit_estimate_and_validate_plan_the_units_from_the_model(project: Project) -> None:
    workflow = project.workflow("lines.yaml", project.model)

    estimate = project.simrun("estimate", "lines.yaml", "--json")
    assert estimate.returncode == 0, estimate.stdout + estimate.stderr
    assert json.loads(estimate.stdout)["scan"]["plan"]["units"] == LINES

    # render plans as a submission does (its type counts no units unplanned), with no service
    rendered = run_simrun(
        "render", "lines.yaml", "--argo", "--json", cwd=project.root, env=project.env
    )
    assert rendered.returncode == 0, rendered.stderr
    assert json.loads(rendered.stdout)["kind"] == "Workflow"

    valid = project.simrun("validate", "lines.yaml")
    assert (valid.returncode, valid.stdout.strip()) == (0, "lines.yaml: valid"), valid.stderr

    result = project.simrun("submit", "lines.yaml", "--json", "--no-wait")
    assert result.returncode == 0, result.stdout + result.stderr
    run_id = json.loads(result.stdout)["id"]
    ended = project.simrun("wait", run_id, "--json", "--timeout", "60")
    assert json.loads(ended.stdout)["state"] == "succeeded", ended.stdout
    # the given field and the planned one; the default `scale` stays with the plugin
    assert project.settings_of(run_id) == {"model": str(project.model), "units": LINES}
    status = json.loads(project.simrun("status", run_id, "--json").stdout)
    assert status["tasks"]["scan"]["units"] == LINES
    assert status["workflow"]["tasks"][0]["settings"]["units"] == LINES
    assert "units" not in yaml.safe_load(workflow.read_text())["tasks"][0]["settings"]


def test_a_plan_that_raises_refuses_the_submission_naming_the_task(project: Project) -> None:
    project.workflow("broken.yaml", project.root / "no-model.txt")
    before = json.loads(project.simrun("list", "--json").stdout)
    expected = (
        "error: broken.yaml: task 'scan': settings: the plan of 'plan.lines' (planplug:plan) "
        "failed: FileNotFoundError: [Errno 2] No such file or directory: "
        f"'{project.root / 'no-model.txt'}'"
    )
    for command in ("submit", "estimate", "validate"):
        refused = project.simrun(command, "broken.yaml")
        assert refused.returncode == 1, (command, refused.stdout, refused.stderr)
        assert refused.stderr.strip() == expected, command
    assert json.loads(project.simrun("list", "--json").stdout) == before, "nothing submitted"
    checked = project.simrun("validate", "broken.yaml", "--json")
    assert checked.returncode == 1
    assert json.loads(checked.stdout) == {"ok": False, "errors": [expected.split(": ", 2)[2]]}


def test_the_mcp_tools_plan_the_settings_too(project: Project) -> None:
    project.workflow("lines.yaml", project.model)
    project.workflow("broken.yaml", project.root / "no-model.txt")
    answers: dict[str, Any] = {}

    async def script(call: Any, tools: list[Any]) -> None:
        answers["estimate"] = await call("estimate_workflow", {"workflow_path": "lines.yaml"})
        submitted = await call("submit_workflow", {"workflow_path": "lines.yaml"})
        answers["wait"] = await call("wait_for_run", {"run_id": submitted["id"], "timeout_s": 60})
        broken = {"workflow_path": "broken.yaml"}
        answers["refused"] = await call("submit_workflow", broken, refused=True)

    session(project.root, ["--local"], {"PYTHONPATH": str(project.site)}, script)
    assert answers["estimate"]["tasks"]["scan"]["plan"]["units"] == LINES
    assert answers["wait"]["state"] == "succeeded"
    settings = project.settings_of(answers["wait"]["id"])
    assert settings == {"model": str(project.model), "units": LINES}
    refused = answers["refused"]
    assert refused["status"] == 422, refused
    prefix = f"{project.root / 'broken.yaml'}: task 'scan': settings: the plan of 'plan.lines'"
    assert refused["error"].startswith(prefix), refused
    assert "FileNotFoundError" in refused["error"]


def test_an_export_plans_the_settings_as_a_submission_does(project: Project) -> None:
    project.workflow("lines.yaml", project.model)
    store = project.root / "cwl-store"
    exported = run_simrun(
        "export",
        "lines.yaml",
        "--cwl",
        "run.cwl",
        "--store",
        str(store),
        "--json",
        cwd=project.root,
        env=project.env,
    )
    assert exported.returncode == 0, exported.stdout + exported.stderr
    [settings] = store.glob("runs/*/tasks/scan/settings.json")
    assert json.loads(settings.read_text()) == {"model": str(project.model), "units": LINES}
    project.workflow("broken.yaml", project.root / "no-model.txt")
    refused = run_simrun(
        "export",
        "broken.yaml",
        "--cwl",
        "broken.cwl",
        "--store",
        str(store),
        cwd=project.root,
        env=project.env,
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: broken.yaml: task 'scan': settings: the plan of")
    assert len(list(store.glob("runs/*"))) == 1, "a refused export writes nothing"
