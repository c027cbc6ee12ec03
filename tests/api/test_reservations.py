"""A run with a reserved node, through a real Supervisor and RunActor on the FakeBackend: its
node is reserved before its submission and released after its end, a release that fails is
asked again until it happens, also by the next service, and a node another run holds fails the
run unsubmitted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
from supervised import supervise

from simrun_api.backends.base import Capabilities
from simrun_api.backends.fake import FakeBackend, Outcome
from simrun_api.supervisor import Supervisor
from simrun_core import events as ev
from simrun_core.planner import Node, plan_task
from simrun_core.plugins import load_task_types
from simrun_core.resources import resolve_resources
from simrun_core.store import LogWriter, RunPaths, read_log
from simrun_core.workflow import Priority, SplitMode, TaskSpec, Workflow

RUN_ID = "20260101-000000-4e5e4e"
OTHER_RUN = "20260101-000000-0712e4"
NODES = [Node(name="node-1", cores=2, memory_gb=8.0), Node(name="node-2", cores=2, memory_gb=8.0)]
RESERVATIONS = Capabilities(reservations=True)


def reserved_run(store: Path, *more: ev.Event) -> RunPaths:
    """A submitted run of one split task of two units that reserves `node-1`, then `more`."""
    types = load_task_types()
    task = TaskSpec(id="squares", type="demo.squares", settings={"n": 2})
    task_type = types[task.type]
    settings = task_type.decode_settings(task.settings)
    plan = plan_task(
        task,
        task_type,
        resolve_resources(task, task_type, settings),
        NODES,
        SplitMode.SINGLE_SERVER,
        Priority.OWNER,
        task_type.units(settings),
        run_id=RUN_ID,
        reserve="node-1",
    )
    submitted = ev.Submitted(
        seq=1,
        run=RUN_ID,
        workflow=Workflow(name="reserved", tasks=[task]),
        submitted_by="u",
        owner="u",
        plans={"squares": plan},
        reserve="node-1",
    )
    paths = RunPaths(store, RUN_ID)
    writer = LogWriter(paths.events)
    writer.append(submitted, *(msgspec.structs.replace(e, seq=n) for n, e in enumerate(more, 2)))
    writer.close()
    return paths


def kinds(paths: RunPaths) -> list[str]:
    return [event.__struct_config__.tag for event in read_log(paths.events)]


def holder(backend: FakeBackend, node: str) -> str | None:
    return next(n.reserved_by for n in backend.node_list if n.name == node)


def released(paths: RunPaths) -> Callable[[Supervisor], bool]:
    return lambda supervisor: "node-released" in kinds(paths)


def test_the_node_is_held_from_before_the_submission_to_after_the_end(tmp_path: Path) -> None:
    store = tmp_path / "store"
    paths = reserved_run(store)
    backend = FakeBackend(
        store, nodes=NODES, autopilot=lambda pod: Outcome(), capabilities=RESERVATIONS
    )
    held_while_running: list[str | None] = []
    backend.autopilot = lambda pod: (
        held_while_running.append(holder(backend, "node-1")) or Outcome()
    )
    supervise(store, backend, released(paths))
    calls = [call[0] for call in backend.calls if call[0] in ("reserve", "submit", "release")]
    assert calls == ["reserve", "submit", "release"]
    assert held_while_running and set(held_while_running) == {RUN_ID}
    log = kinds(paths)
    assert log.index("node-reserved") < log.index("workflow-submitted")
    assert log[-2:] == ["succeeded", "node-released"], "the terminal event is written first"
    assert holder(backend, "node-1") is None


def test_a_release_that_fails_is_asked_again_until_it_happens(tmp_path: Path) -> None:
    store = tmp_path / "store"
    paths = reserved_run(store)
    backend = FakeBackend(
        store, nodes=NODES, autopilot=lambda pod: Outcome(), capabilities=RESERVATIONS
    )
    backend.release_failures = 2
    supervise(store, backend, released(paths))
    assert [call for call in backend.calls if call[0] == "release"] == [
        ("release", "node-1", RUN_ID)
    ] * 3
    assert kinds(paths).count("node-released") == 1
    assert holder(backend, "node-1") is None


def test_the_next_service_releases_what_an_ended_run_still_holds(tmp_path: Path) -> None:
    """The service stopped after the terminal event, before the release."""
    store = tmp_path / "store"
    paths = reserved_run(
        store,
        ev.EnvironmentResolved(image=None),
        ev.Built(image=None),
        ev.NodeReserved(node="node-1"),
        ev.WorkflowSubmitted(name="simrun-x"),
        ev.Cancelled(message="cancelled by bob"),
    )
    nodes = [msgspec.structs.replace(NODES[0], reserved_by=RUN_ID), NODES[1]]
    backend = FakeBackend(store, nodes=nodes, capabilities=RESERVATIONS)
    supervise(store, backend, released(paths))
    assert ("release", "node-1", RUN_ID) in backend.calls
    assert not any(call[0] == "submit" for call in backend.calls), "an ended run is not resumed"
    assert kinds(paths)[-2:] == ["cancelled", "node-released"]
    assert holder(backend, "node-1") is None


def test_a_run_resumed_after_its_reservation_is_submitted_without_reserving_again(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    paths = reserved_run(
        store,
        ev.EnvironmentResolved(image=None),
        ev.Built(image=None),
        ev.NodeReserved(node="node-1"),
    )
    nodes = [msgspec.structs.replace(NODES[0], reserved_by=RUN_ID), NODES[1]]
    backend = FakeBackend(
        store, nodes=nodes, autopilot=lambda pod: Outcome(), capabilities=RESERVATIONS
    )
    supervise(store, backend, released(paths))
    made = [call[0] for call in backend.calls]
    assert "reserve" not in made and made.count("submit") == 1 and "release" in made
    log = kinds(paths)
    assert log.count("environment-resolved") == 1 and log.count("node-reserved") == 1


def test_a_node_another_run_holds_fails_the_run_unsubmitted(tmp_path: Path) -> None:
    store = tmp_path / "store"
    paths = reserved_run(store)
    nodes = [msgspec.structs.replace(NODES[0], reserved_by=OTHER_RUN), NODES[1]]
    backend = FakeBackend(store, nodes=nodes, capabilities=RESERVATIONS)
    supervise(store, backend, lambda supervisor: supervisor.summary(RUN_ID).state.ended)
    last = read_log(paths.events)[-1]
    assert isinstance(last, ev.Failed)
    assert last.message == (
        "the run could not be submitted: node 'node-1' cannot be reserved: "
        f"node 'node-1' is reserved for run {OTHER_RUN}"
    )
    assert [call[0] for call in backend.calls if call[0] != "recover"] == ["reserve", "close"]
    assert holder(backend, "node-1") == OTHER_RUN, "another run's reservation is left alone"
