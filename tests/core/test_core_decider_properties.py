"""`decide` is referentially transparent: a function of the folded state of a run and one
message, like temporalio's `activate()`. Random sequences of every kind of message never make
it raise, and equal inputs give equal decisions (no clock, no randomness, no memory); nothing a
decision is made with reads a clock.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
from datetime import UTC, datetime
from pathlib import Path

import msgspec
from core_samples import sample_plans, sample_submitted, sample_workflow
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simrun_core import events as ev
from simrun_core import messages as msg
from simrun_core.decider import decide
from simrun_core.fold import RunFold

SUBMITTED = sample_submitted(sample_workflow(), sample_plans(sample_workflow()))
APPENDED_AT = datetime(2026, 1, 1, 12, tzinfo=UTC)
HARNESS_AT = datetime(2026, 1, 1, 11, tzinfo=UTC)
PROPERTIES = settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

tasks = st.sampled_from(["squares", "plot", "nosuchtask"])
workers = st.sampled_from(["w0", "w1", "w2", "plot", "merge"])
attempts = st.integers(min_value=0, max_value=4)
texts = st.sampled_from(["", "why", "[Errno 28] No space left"])
exit_codes = st.sampled_from([None, 0, 1, 2, 3, 4, 137, 143, -9, -15, 255])
harness_events = st.one_of(
    st.builds(
        ev.UnitStarted,
        time=st.just(HARNESS_AT),
        task=tasks,
        index=st.integers(0, 4),
        worker=workers,
    ),
    st.builds(
        ev.UnitDone,
        time=st.just(HARNESS_AT),
        task=tasks,
        index=st.integers(0, 4),
        worker=workers,
        seconds=st.floats(0, 10),
    ),
    st.lists(st.tuples(st.integers(0, 4), st.floats(0, 10)), max_size=4).flatmap(
        lambda units: st.builds(
            ev.units_done_event, task=tasks, worker=workers, units=st.just(units)
        )
    ),
    st.builds(
        ev.WorkerReport,
        time=st.just(HARNESS_AT),
        task=tasks,
        worker=workers,
        attempt=attempts,
        oom_kills=st.integers(0, 2),
        exit_code=exit_codes,
        message=st.none() | texts,
    ),
    st.builds(ev.Merged, time=st.just(HARNESS_AT), task=tasks, worker=st.none() | workers),
)
harness = st.lists(harness_events, max_size=4)
pod_changes = st.builds(
    msg.PodChanged,
    task=tasks,
    worker=workers,
    attempt=attempts,
    phase=st.sampled_from(["pending", "admitted", "running", "preempted", "succeeded", "failed"]),
    exit_code=exit_codes,
    oom=st.booleans(),
    message=st.none() | texts,
    harness=harness,
    merged_marker=st.booleans(),
    on_retry_memory=st.none() | st.booleans(),
)
MESSAGES: dict[type[msg.Message], st.SearchStrategy[msg.Message]] = {
    msg.Resume: st.builds(msg.Resume, pods_survive=st.booleans(), builds_images=st.booleans()),
    msg.EnvironmentReady: st.builds(
        msg.EnvironmentReady, image=st.none() | st.just("img:1"), lock_sha256=st.none()
    ),
    msg.ImageReady: st.builds(msg.ImageReady, image=st.just("img:1"), cached=st.booleans()),
    msg.EnvironmentFailed: st.builds(msg.EnvironmentFailed, reason=texts),
    msg.NodeReservation: st.builds(
        msg.NodeReservation, node=st.sampled_from(["n1", "n2"]), taken=st.booleans(), reason=texts
    ),
    msg.NodeRelease: st.builds(msg.NodeRelease, node=st.sampled_from(["n1", "n2"])),
    msg.WorkflowAccepted: st.builds(msg.WorkflowAccepted, name=st.just("simrun-x")),
    msg.SubmissionRefused: st.builds(msg.SubmissionRefused, reason=texts),
    msg.PodChanged: pod_changes,
    msg.WorkflowGone: st.builds(msg.WorkflowGone, name=st.just("simrun-x")),
    msg.HarnessRead: st.builds(msg.HarnessRead, events=harness),
    msg.CancelAsked: st.builds(msg.CancelAsked, by=st.sampled_from(["bob", "alice"])),
    msg.PodsGone: st.builds(msg.PodsGone, harness=harness),
    msg.MergeMarker: st.builds(msg.MergeMarker, task=tasks, found=st.booleans()),
    msg.StoreWritable: st.builds(
        msg.StoreWritable, error=texts, changes=st.lists(pod_changes, max_size=3), harness=harness
    ),
}
# Runs go further when most messages are of the pods and their logs.
messages = st.one_of(*MESSAGES.values(), pod_changes, pod_changes, pod_changes)


def started() -> RunFold:
    state = RunFold()
    state.apply(SUBMITTED)
    return state


def append(state: RunFold, decision: msg.Decision) -> None:
    """Append a decision's events as the actor does: numbered and stamped."""
    assert state.record is not None
    state.apply_all(ev.stamped(decision.events, state.record.seq, APPENDED_AT))


def test_every_kind_of_message_is_generated() -> None:
    assert set(MESSAGES) == set(msg.AnyMessage.__args__)


@PROPERTIES
@given(st.lists(messages, min_size=1, max_size=40))
def test_random_messages_never_raise_and_equal_inputs_decide_alike(
    sequence: list[msg.Message],
) -> None:
    """Two folds of the same log, each told its own copy of each message (as a replay decodes
    it): their decisions are equal, and equal to a second decision on the same inputs."""
    one, other = started(), started()
    for message in sequence:
        decision = decide(one, message)
        assert decide(one, message) == decision, "decided twice, alike"
        recorded = msg.decode_message(msg.encode_message(message))
        assert decide(other, recorded) == decision, "a copy of the message, alike"
        assert all(event.time == ev.UNSTAMPED for event in decision.events if not _copied(event))
        append(one, decision)
        append(other, decision)
    assert msgspec.to_builtins(one.record) == msgspec.to_builtins(other.record)


def _copied(event: ev.Event) -> bool:
    """An event copied from a harness log (it keeps the harness's time)."""
    return isinstance(event, (ev.UnitDone, ev.UnitsDone, ev.WorkerReport, ev.Merged))


def test_decide_called_twice_on_equal_inputs_returns_equal_decisions() -> None:
    """A decision that appends events (a pod failed, retried) is the same on equal copies of
    the state and the message: no clock stamps its events."""
    state = started()
    append(state, decide(state, msg.Resume()))
    append(state, decide(state, msg.WorkflowAccepted(name="simrun-x")))
    append(
        state,
        decide(state, msg.PodChanged(task="squares", worker="w0", attempt=0, phase="running")),
    )
    failed = msg.PodChanged(
        task="squares", worker="w0", attempt=0, phase="failed", exit_code=137, oom=True
    )
    first = decide(state, failed)
    second = decide(copy.deepcopy(state), copy.deepcopy(failed))
    assert first.events and first == second


# -- nothing a decision is made with reads a clock ---------------------------------------------

CLOCKS = {
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
    ("time", "time"),
    ("time", "time_ns"),
    ("time", "monotonic"),
    ("time", "monotonic_ns"),
    ("time", "perf_counter"),
    ("time", "localtime"),
    ("time", "gmtime"),
}
"""The clocks of the standard library, as `<module or class>.<function>`."""


def own_imports(module: str) -> set[str]:
    """The simrun modules a module of ours imports (at its top or in a function; typing-only
    imports included: what a reader of the module may reach)."""
    path = module_path(module)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        found |= {n for n in names if n.startswith("simrun_") and _exists(n)}
    return found


def module_path(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return Path(spec.origin)


def _exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False  # `from package import name` of a name that is no module


def reachable(start: str) -> set[str]:
    """Every simrun module `start` imports, transitively (with the packages above each)."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:n]) for n in range(1, len(parts))]
        todo += sorted(own_imports(module))
    return seen


def clock_reads(module: str) -> list[str]:
    """Where a module reads a clock: `import time`, a `from time import`, or a call of one of
    `CLOCKS` (by its module's or class's name)."""
    tree = ast.parse(module_path(module).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "time" for a in node.names):
            found.append(f"{module}:{node.lineno}: import time")
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            found.append(f"{module}:{node.lineno}: from time import")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Name, ast.Attribute)):
            owner = node.value.id if isinstance(node.value, ast.Name) else node.value.attr
            if (owner, node.attr) in CLOCKS:
                found.append(f"{module}:{node.lineno}: {owner}.{node.attr}")
    return found


def test_no_clock_is_reachable_from_the_decider() -> None:
    modules = reachable("simrun_core.decider")
    assert {"simrun_core.events", "simrun_core.fold", "simrun_core.messages"} <= modules
    assert "simrun_core.clock" not in modules
    assert [read for module in sorted(modules) for read in clock_reads(module)] == []


def test_the_clock_check_sees_a_clock() -> None:
    """The check above can fail: the clock of the writers of logs is one."""
    assert clock_reads("simrun_core.clock") == ["simrun_core.clock:14: datetime.now"]
