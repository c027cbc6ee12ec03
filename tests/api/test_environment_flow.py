"""The environment of a run before its submission, through a real Supervisor and RunActor on the
FakeBackend with images: resolved, its image built, then the run submitted in that image; a
failure fails the run unsubmitted, and a cancel while the image builds ends it unsubmitted
without waiting for the build."""

from __future__ import annotations

import asyncio
from pathlib import Path

from supervised import supervise

from simrun_api.backends.base import Capabilities
from simrun_api.backends.fake import FakeBackend, Outcome
from simrun_api.environments import EnvironmentRefused, Made, Resolved
from simrun_api.supervisor import Supervisor
from simrun_core import events as ev
from simrun_core.fold import RunRecord
from simrun_core.planner import Node, plan_task
from simrun_core.plugins import load_task_types
from simrun_core.provenance import SourceProvenance
from simrun_core.resources import resolve_resources
from simrun_core.store import LogWriter, RunPaths, read_log
from simrun_core.workflow import Priority, SplitMode, TaskSpec, Workflow

RUN_ID = "20260101-000000-e4e4e4"
IMAGE = "registry:5000/simrun-env:0123456789ab"
IMAGES = Capabilities(images=True)
MODEL = SourceProvenance(name="model", commit="a" * 40, snapshot="snapshots/model/" + "b" * 64)


def snapshotted_run(store: Path) -> RunPaths:
    """A submitted run of one split task whose model source was snapshotted."""
    types = load_task_types()
    task = TaskSpec(id="squares", type="demo.squares", settings={"n": 2})
    task_type = types[task.type]
    settings = task_type.decode_settings(task.settings)
    plan = plan_task(
        task,
        task_type,
        resolve_resources(task, task_type, settings),
        [Node(name="node-1", cores=2, memory_gb=8.0)],
        SplitMode.SINGLE_SERVER,
        Priority.OWNER,
        task_type.units(settings),
    )
    submitted = ev.Submitted(
        seq=1,
        run=RUN_ID,
        workflow=Workflow(name="env", tasks=[task]),
        submitted_by="u",
        owner="u",
        plans={"squares": plan},
        sources=[MODEL],
    )
    paths = RunPaths(store, RUN_ID)
    writer = LogWriter(paths.events)
    writer.append(submitted)
    writer.close()
    return paths


class ScriptedEnvironments:
    """Resolves every run to IMAGE and builds it, as the test says; records what it was asked."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.asked: list[str] = []
        self.release_build = asyncio.Event()
        self.hold_build = False
        self.build_cancelled = False

    async def resolve(self, record: RunRecord) -> Resolved:
        self.asked.append(f"resolve {record.sources[0].snapshot}")
        if self.refuse:
            raise EnvironmentRefused(self.refuse)
        return Resolved(image=IMAGE, lock_sha256="c" * 64)

    async def build(self, image: str) -> Made:
        self.asked.append(f"build {image}")
        if self.hold_build:
            try:
                await self.release_build.wait()
            except asyncio.CancelledError:
                self.build_cancelled = True
                raise
        return Made(seconds=4.5)


def kinds(paths: RunPaths) -> list[str]:
    return [event.__struct_config__.tag for event in read_log(paths.events)]


async def ended(supervisor: Supervisor) -> bool:
    return supervisor.summary(RUN_ID).state.ended


def test_the_run_is_submitted_in_the_image_of_its_environment(tmp_path: Path) -> None:
    store = tmp_path / "store"
    paths = snapshotted_run(store)
    backend = FakeBackend(store, autopilot=lambda pod: Outcome(), capabilities=IMAGES)
    environments = ScriptedEnvironments()
    supervise(store, backend, ended, environments=environments)
    assert environments.asked == [f"resolve {MODEL.snapshot}", f"build {IMAGE}"]
    log = read_log(paths.events)
    resolved = next(e for e in log if isinstance(e, ev.EnvironmentResolved))
    built = next(e for e in log if isinstance(e, ev.Built))
    assert (resolved.image, resolved.lock_sha256) == (IMAGE, "c" * 64)
    assert (built.image, built.seconds, built.cached) == (IMAGE, 4.5, False)
    order = kinds(paths)
    assert order.index("environment-resolved") < order.index("built")
    assert order.index("built") < order.index("workflow-submitted")
    assert order[-1] == "succeeded"
    [(submission, _)] = backend.submissions
    assert submission.record.image == IMAGE


def test_an_environment_that_cannot_be_resolved_fails_the_run_unsubmitted(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    paths = snapshotted_run(store)
    backend = FakeBackend(store, capabilities=IMAGES)
    environments = ScriptedEnvironments(refuse="the model has no uv.lock")
    supervise(store, backend, ended, environments=environments)
    last = read_log(paths.events)[-1]
    assert isinstance(last, ev.Failed)
    assert last.message == "the environment of the run failed: the model has no uv.lock"
    assert backend.submissions == []


def test_a_cancel_while_the_image_builds_ends_the_run_unsubmitted(tmp_path: Path) -> None:
    store = tmp_path / "store"
    paths = snapshotted_run(store)
    backend = FakeBackend(store, capabilities=IMAGES)
    environments = ScriptedEnvironments()
    environments.hold_build = True
    cancelled: list[bool] = []

    async def cancel_once_building(supervisor: Supervisor) -> bool:
        if f"build {IMAGE}" in environments.asked and not cancelled:
            await supervisor.cancel(RUN_ID, "bob")
            cancelled.append(True)
        return supervisor.summary(RUN_ID).state.ended and not supervisor.actors

    supervise(store, backend, cancel_once_building, environments=environments)
    assert kinds(paths)[-1] == "cancelled"
    assert "built" not in kinds(paths) and backend.submissions == []
    assert environments.build_cancelled, "the run's wait for the build ends with it"
