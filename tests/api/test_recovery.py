"""A service killed with SIGKILL during a run: the next one folds the log and ends the run."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import anyio
from live_service import (
    READ,
    WRITE,
    command,
    python,
    run_processes,
    start_service,
    stop_service,
    wait_until,
)
from submitted_runs import write_submitted_run

from simrun_api import actor as actor_module
from simrun_api.actor import RunActor
from simrun_api.backends.fake import FakeBackend, Outcome
from simrun_core import events as ev
from simrun_core.fold import fold
from simrun_core.messages import PodChanged
from simrun_core.plugins import load_task_types
from simrun_core.states import TaskState
from simrun_core.store import LogWriter, RunPaths, read_log
from simrun_core.workflow import TaskSpec


def test_a_run_survives_a_killed_service_and_leaves_no_orphan(tmp_path):
    slow_write = python("import time; time.sleep(2)\n" + WRITE.replace("; ", "\n"))
    workflow = {
        "name": "recover",
        "tasks": [
            command("first", [*slow_write, "{out}"]),
            command("second", [*python(READ), "{input}"], inputs={"data": "first.out"}),
        ],
    }
    service = start_service(tmp_path)
    try:
        run = service.submit(workflow)
        orphans = wait_until(lambda: run_processes(run["id"]), what="the first task's process")
        wait_until(
            lambda: any(e["type"] == "pod-started" for e in service.events(run["id"])),
            what="the start of the pod in the log",
        )
        os.kill(service.process.pid, signal.SIGKILL)
        service.process.wait()
        assert run_processes(run["id"]) == orphans, "the process outlives the killed service"
    finally:
        stop_service(service)
    service = start_service(tmp_path)
    try:
        end = service.wait(run["id"])
        assert end["state"] == "succeeded", end
        assert "read 42" in service.client.get(f"/runs/{run['id']}/logs/second").text
        events = service.events(run["id"])
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        interrupted = [e for e in events if e["type"] == "pod-failed" and e["task"] == "first"]
        assert interrupted and "service stopped" in interrupted[0]["message"]
        assert sum(e["type"] == "workflow-submitted" for e in events) == 1
        for pid in orphans:
            assert not os.path.exists(f"/proc/{pid}") or _zombie(pid)
        assert run_processes(run["id"]) == []
    finally:
        stop_service(service)


def _zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_stopped_service_cancels_its_runs_and_waits_for_their_processes(tmp_path):
    service = start_service(tmp_path)
    try:
        run = service.submit(
            {"name": "s", "tasks": [command("sleep", python("import time; time.sleep(600)"))]}
        )
        wait_until(lambda: run_processes(run["id"]), what="the process of the run")
        listed = wait_until(
            lambda: [i for i in service.client.get("/runs").json() if i["state"] == "running"],
            what="the run to be listed running",
        )
        assert [item["id"] for item in listed] == [run["id"]]
        assert listed[0]["progress"] == 0.0
    finally:
        stop_service(service)
    assert service.process.returncode == 0
    assert run_processes(run["id"]) == []
    events = service.events(run["id"])
    assert events[-1]["type"] == "cancelled"
    assert "the service stopping" in events[-1]["message"]
    assert not (tmp_path / ".simrun" / "service.json").exists()


# -- the actor's copies of the harness logs ---------------------------------------------------
#
# A RunActor on a store of its own with a backend that only takes the run: the test plays the
# backend's pod changes and writes the harness logs itself, and sees each append (a batch).

RUN_ID = "20260101-000000-abcdef"


class QuietBackend(FakeBackend):
    """A backend that takes the run and starts nothing: the test reports the pod changes."""

    def __init__(self) -> None:
        super().__init__(name="quiet", max_pods=8)


def two_squares_run(store, run_id: str = RUN_ID) -> RunPaths:
    """A submitted run of two split tasks `a` and `b` of one unit each, nothing else."""
    tasks = [TaskSpec(id=task, type="demo.squares", settings={"n": 1}) for task in ("a", "b")]
    return write_submitted_run(store, run_id, "two", tasks)


def harness_log(paths: RunPaths, task: str, worker: str, attempt: int, *events: ev.Event) -> None:
    """Append events to the harness log of a pod, as the harness does."""
    writer = LogWriter(paths.worker_events(task) / f"{worker}.{attempt}.jsonl", fsync=False)
    writer.append(*events)
    writer.close()


def finished_pod(task: str, worker: str = "w0", attempt: int = 0) -> list[ev.Event]:
    """What the harness of a pod of one unit writes: the unit (a batch of one), the merge, the
    report. (The lone `unit-done` events of the tests are what logs written before have.)"""
    return [
        ev.UnitStarted(task=task, index=0, worker=worker),
        ev.units_done_event(task, worker, [(0, 0.01)]),
        ev.Merged(task=task, worker=worker),
        ev.WorkerReport(task=task, worker=worker, attempt=attempt, exit_code=0, units_done=1),
    ]


class ActorUnderTest:
    """A RunActor running in a task group; `batches` are its appends, as (type, task) pairs."""

    def __init__(self, paths: RunPaths) -> None:
        self.paths = paths
        self.batches: list[list[tuple[str, str | None]]] = []
        self.events: list[ev.Event] = []
        """The run log as it was after the last append."""
        self._seen = 0
        self.actor = RunActor(paths, QuietBackend(), load_task_types(), self._changed, _nothing)
        self.actor.open()

    async def _changed(self, record, summary_changed: bool) -> None:
        events = read_log(self.paths.events)
        self.batches.append([_kind(event) for event in events[self._seen :]])
        self._seen = len(events)
        self.events = events

    def send(self, task: str, phase: str, worker: str = "w0", attempt: int = 0) -> None:
        self.actor.report(PodChanged(task=task, worker=worker, attempt=attempt, phase=phase))

    async def settle(self, count: int) -> None:
        """Wait until the actor made `count` appends in all."""
        with anyio.fail_after(10):
            while len(self.batches) < count:
                await anyio.sleep(0.01)

    async def until(self, condition: Callable[[list[ev.Event]], bool]) -> None:
        """Wait until the run log after an append holds what `condition` asks of its events,
        however the actor grouped them into appends."""
        with anyio.fail_after(10):
            while not condition(self.events):
                await anyio.sleep(0.01)


async def _nothing(*args) -> None:
    return None


def _kind(event: ev.Event) -> tuple[str, str | None]:
    return (event.__struct_config__.tag, getattr(event, "task", None))


def _tagged(events: list[ev.Event], tag: str) -> bool:
    """Whether the log holds an event of type `tag`."""
    return any(event.__struct_config__.tag == tag for event in events)


def _copied(events: list[ev.Event]) -> list[tuple[str, str | None, str | None, int | None]]:
    """The harness events of a run log: (type, task, worker, index or attempt), one for each
    unit of a `units-done`."""
    found: list[tuple[str, str | None, str | None, int | None]] = []
    for event in events:
        tag = event.__struct_config__.tag
        if isinstance(event, ev.UNITS_EVENTS):
            found += [(tag, event.task, event.worker, i) for i, _ in ev.done_units(event)]
        elif isinstance(event, ev.Merged | ev.WorkerReport):
            found.append((tag, event.task, event.worker, getattr(event, "attempt", None)))
    return found


def test_the_end_of_a_pod_appends_its_own_log_with_it_and_no_other(tmp_path, monkeypatch):
    """At the end of a pod the actor reads that pod's log and appends its events together with
    the end; the log of a pod still running is left to the next tail of every log."""
    monkeypatch.setattr(actor_module, "TAIL_INTERVAL_S", 30.0)  # no tail by the clock here
    paths = two_squares_run(tmp_path / "store")

    async def scenario() -> ActorUnderTest:
        under = ActorUnderTest(paths)
        async with anyio.create_task_group() as group:
            group.start_soon(under.actor.run)
            await under.settle(2)  # environment and build; the workflow submitted
            under.send("a", "running")
            under.send("b", "running")
            await under.settle(4)
            harness_log(paths, "a", "w0", 0, *finished_pod("a"))
            harness_log(paths, "b", "w0", 0, ev.UnitDone(task="b", index=0, worker="w0"))
            under.send("a", "succeeded")
            await under.settle(5)
            under.send("b", "pending")  # any other message tails every log (no event of its own)
            await under.settle(6)
            harness_log(paths, "b", "w0", 0, *finished_pod("b")[2:])
            under.send("b", "succeeded")
        return under

    under = anyio.run(scenario)
    assert under.batches[4] == [
        ("units-done", "a"),
        ("merged", "a"),
        ("worker-report", "a"),
        ("pod-succeeded", "a"),
        ("task-state", "a"),
        ("logs-kept", "a"),
    ]
    assert under.batches[5] == [("unit-done", "b")]
    assert under.batches[6:] == [
        [
            ("merged", "b"),
            ("worker-report", "b"),
            ("pod-succeeded", "b"),
            ("task-state", "b"),
            ("logs-kept", "b"),
        ],
        [("succeeded", None)],
    ]
    copied = _copied(read_log(paths.events))
    assert sorted(copied) == sorted(set(copied)) and len(copied) == 6


def test_units_written_before_the_pods_reports_are_read_follow_its_start(tmp_path, monkeypatch):
    """A warm process writes units before the actor has handled the backend's reports of its
    pod (they wait in the mailbox): the units follow the pod's `pod-started` in the run log,
    appended right after it, not before the task is even queued."""
    monkeypatch.setattr(actor_module, "TAIL_INTERVAL_S", 30.0)  # no tail by the clock here
    paths = two_squares_run(tmp_path / "store")

    async def scenario() -> ActorUnderTest:
        under = ActorUnderTest(paths)
        async with anyio.create_task_group() as group:
            group.start_soon(under.actor.run)
            await under.settle(2)  # environment and build; the workflow submitted
            under.send("a", "pending")
            harness_log(paths, "a", "w0", 0, *finished_pod("a")[:2])
            await under.settle(3)
            under.send("a", "running")
            await under.settle(5)  # its start, then its units (no other message comes)
            harness_log(paths, "a", "w0", 0, *finished_pod("a")[2:])
            under.send("a", "succeeded")
            await under.settle(6)
            group.cancel_scope.cancel()
        return under

    under = anyio.run(scenario)
    assert under.batches[2:5] == [
        [("task-state", "a")],
        [("pod-started", "a"), ("task-state", "a")],
        [("units-done", "a")],
    ]
    assert ("pod-succeeded", "a") in under.batches[5]


def test_the_end_of_the_run_copies_what_is_left_of_every_log(tmp_path, monkeypatch):
    """A worker of a task whose end the actor did not see (an extra one, say) wrote a unit:
    it is in the run log before `succeeded`."""
    monkeypatch.setattr(actor_module, "TAIL_INTERVAL_S", 30.0)
    paths = two_squares_run(tmp_path / "store")

    async def scenario() -> None:
        under = ActorUnderTest(paths)
        async with anyio.create_task_group() as group:
            group.start_soon(under.actor.run)
            await under.settle(2)
            harness_log(paths, "a", "w0", 0, *finished_pod("a"))
            under.send("a", "succeeded")
            await under.settle(3)
            harness_log(paths, "b", "x1", 0, ev.UnitDone(task="b", index=0, worker="x1"))
            harness_log(paths, "b", "w0", 0, *finished_pod("b")[2:])
            under.send("b", "succeeded")

    anyio.run(scenario)
    events = read_log(paths.events)
    assert events[-1].__struct_config__.tag == "succeeded"
    copied = _copied(events)
    assert ("unit-done", "b", "x1", 0) in copied and len(copied) == len(set(copied)) == 6
    record = fold(events)
    assert record.progress["b"].done == 1 and record.progress["a"].done == 1


def test_a_restarted_actor_copies_each_harness_event_once(tmp_path, monkeypatch):
    """The actor of a killed service copied some events of a pod; the next one reads the logs
    from their start and appends only what the run log lacks, then what comes after."""
    monkeypatch.setattr(actor_module, "TAIL_INTERVAL_S", 30.0)
    paths = two_squares_run(tmp_path / "store")
    harness_log(paths, "a", "w0", 0, *finished_pod("a"))
    harness_log(paths, "b", "w0", 0, ev.UnitDone(task="b", index=0, worker="w0"))

    def a_ended_and_b_copied(events: list[ev.Event]) -> bool:
        """a's pod ended (its log copied with the end) and b's first unit copied."""
        a_done = fold(events).tasks["a"] is TaskState.DONE
        return a_done and ("unit-done", "b", "w0", 0) in _copied(events)

    async def first() -> None:
        under = ActorUnderTest(paths)
        async with anyio.create_task_group() as group:
            group.start_soon(under.actor.run)
            await under.until(lambda events: _tagged(events, "workflow-submitted"))
            under.send("a", "running")
            under.send("b", "running")
            under.send("a", "succeeded")
            await under.until(a_ended_and_b_copied)
            group.cancel_scope.cancel()  # the service is killed; the log stays as it is

    anyio.run(first)
    assert fold(read_log(paths.events)).tasks["a"] is TaskState.DONE
    before = _copied(read_log(paths.events))
    assert sorted(before) == [
        ("merged", "a", "w0", None),
        ("unit-done", "b", "w0", 0),
        ("units-done", "a", "w0", 0),
        ("worker-report", "a", "w0", 0),
    ]
    harness_log(paths, "b", "w0", 1, *finished_pod("b", attempt=1)[1:])  # its retry

    def b_failed_with_the_service(events: list[ev.Event]) -> bool:
        return any(isinstance(event, ev.PodFailed) and event.task == "b" for event in events)

    async def second() -> None:
        under = ActorUnderTest(paths)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(under.actor.run)
                await under.until(b_failed_with_the_service)
                under.send("b", "running", attempt=1)
                under.send("b", "succeeded", attempt=1)

    anyio.run(second)
    events = read_log(paths.events)
    assert [event.seq for event in events] == list(range(1, len(events) + 1))
    assert events[-1].__struct_config__.tag == "succeeded"
    copied = _copied(events)
    assert copied[: len(before)] == before
    assert copied[len(before) :] == [
        ("merged", "b", "w0", None),
        ("worker-report", "b", "w0", 1),
    ], "the unit done again by the retry is in the log once"


# -- retries after a restart, keyed by task and worker --------------------------------------------


def test_after_a_restart_a_second_tasks_first_kill_for_memory_is_retried(tmp_path):
    """Task `a` was killed for memory and retried; the service died while `b` ran. Both tasks'
    coordinators are `w0`: the next service gives `b` its own attempts and no retry memory of
    `a`'s, so `b`'s first kill for memory is retried with the retry memory, not failed."""
    store = tmp_path / "store"
    paths = two_squares_run(store)

    def before(pod):
        if pod.task == "a":
            return Outcome(exit_code=137, oom=True) if pod.attempt == 0 else Outcome()
        return Outcome(exit_code=None)  # `b` runs until the service dies

    def after(pod):
        return Outcome(exit_code=137, oom=True) if pod.attempt == 1 else Outcome()

    async def service(backend: FakeBackend, until) -> RunActor:
        actor = RunActor(paths, backend, load_task_types(), _nothing_changed, _nothing)
        actor.open()
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(actor.run)
                while not until(actor.record):
                    await anyio.sleep(0.01)
                group.cancel_scope.cancel()  # killed: the log stays as it is
        return actor

    def b_runs(record) -> bool:
        pod = record.pods.get("b", {}).get("w0")
        return record.tasks["a"] is TaskState.DONE and pod is not None and pod.state == "running"

    anyio.run(service, FakeBackend(store, autopilot=before), b_runs)
    second = FakeBackend(store, autopilot=after)
    actor = anyio.run(service, second, lambda record: record.ended)

    [(submission, _)] = second.submissions
    assert submission.next_attempts == {("a", "w0"): 2, ("b", "w0"): 1}
    assert submission.retry_memory == {("a", "w0")}
    assert ("retry", RUN_ID, "b", "w0", 2, True) in second.calls
    assert actor.record.state.value == "succeeded", actor.record.message
    failed = [e for e in read_log(paths.events) if isinstance(e, ev.PodFailed) and e.task == "b"]
    assert [(e.attempt, e.retry) for e in failed] == [(0, True), (1, True)]
    assert failed[1].message.startswith("killed for memory; retried with")
    assert actor.record.oom_kills == {"a": {"w0": [0]}, "b": {"w0": [1]}}


async def _nothing_changed(record, summary_changed: bool) -> None:
    return None
