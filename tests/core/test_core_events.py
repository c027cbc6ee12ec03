"""simrun_core.events: one line per event, every type round trips, unknown types are skipped."""

from __future__ import annotations

import json

import msgspec
import pytest
from core_samples import RUN_ID, at, sample_plans, sample_workflow
from hypothesis import given, settings
from hypothesis import strategies as st

from simrun_core import events as ev
from simrun_core.provenance import SourceProvenance
from simrun_core.states import TaskState
from simrun_core.workflow import Priority


def samples() -> list[ev.Event]:
    """One event of every type, with the optional fields set where there are some."""
    workflow = sample_workflow()
    return [
        ev.Submitted(
            seq=1,
            time=at(0),
            run=RUN_ID,
            workflow=workflow,
            submitted_by="agent-7",
            owner="alice",
            agent="agent-7",
            priority=Priority.AGENT,
            group="fits",
            sources=[
                SourceProvenance(
                    name="model",
                    path="/home/alice/model",
                    branch="main",
                    commit="abc123",
                    dirty=True,
                    changed=["a.py"],
                    diff_sha256="f" * 64,
                    snapshot="snapshots/model.tar",
                )
            ],
            plans=sample_plans(workflow),
            backend="argo",
            local_commands="docker",
        ),
        ev.EnvironmentResolved(seq=2, time=at(1), image="registry:5000/env:abc"),
        ev.Built(seq=3, time=at(2), image="registry:5000/env:abc"),
        ev.WorkflowSubmitted(seq=4, time=at(3), name=f"simrun-{RUN_ID}"),
        ev.PodAdmitted(seq=5, time=at(4), task="squares", worker="squares-0", attempt=1),
        ev.PodStarted(
            seq=6, time=at(5), task="squares", worker="squares-0", attempt=1, node="n1", pid=42
        ),
        ev.PodPreempted(seq=7, time=at(6), task="squares", worker="squares-0", attempt=1),
        ev.PodFailed(
            seq=8,
            time=at(7),
            task="squares",
            worker="squares-0",
            attempt=2,
            exit_code=137,
            oom=True,
            retry=True,
            message="OOMKilled",
        ),
        ev.PodSucceeded(seq=9, time=at(8), task="squares", worker="squares-0", attempt=3),
        ev.OomKilled(
            seq=10,
            time=at(9),
            task="squares",
            worker="squares-0",
            attempt=2,
            memory_gb=2.0,
            retry_memory_gb=3.0,
        ),
        ev.UnitStarted(seq=11, time=at(10), task="squares", index=4, worker="squares-0"),
        ev.UnitDone(seq=12, time=at(11), task="squares", index=4, worker="squares-0", seconds=1.5),
        ev.UnitsDone(
            seq=12,
            time=at(11),
            task="squares",
            worker="squares-0",
            indices=(5, 3),
            seconds=(0.25, 0.5),
        ),
        ev.WorkerReport(
            seq=13,
            time=at(12),
            task="squares",
            worker="squares-0",
            attempt=3,
            node="n1",
            processes=2,
            units_done=3,
            seconds=9.5,
            unit_seconds=8.25,
            cpu_seconds=16.0,
            peak_memory_bytes=123_456_789,
            memory_limit_bytes=2**31,
            per_worker_gb=0.375,
            oom_kills=1,
            failed=True,
            exit_code=3,
            message="unit 4 failed",
        ),
        ev.TaskStateChanged(
            seq=14, time=at(13), task="squares", state=TaskState.FAILED, message="unit 4 failed"
        ),
        ev.Merged(seq=15, time=at(14), task="squares", worker="squares-0"),
        ev.LogsKept(seq=16, time=at(15), task="squares"),
        ev.NodeReserved(seq=17, time=at(16), node="n1"),
        ev.NodeReleased(seq=18, time=at(17), node="n1"),
        ev.CancelRequested(seq=19, time=at(18), by="alice"),
        ev.Succeeded(seq=20, time=at(19), message="done"),
        ev.Failed(seq=21, time=at(20), message="task 'squares' failed"),
        ev.Cancelled(seq=22, time=at(21), message="cancelled by alice"),
    ]


SAMPLES = samples()


def test_samples_cover_every_event_type() -> None:
    assert [type(event) for event in SAMPLES] == list(ev.RunEvent.__args__)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda event: type(event).__name__)
def test_round_trip(event: ev.Event) -> None:
    line = ev.encode_event(event)
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert json.loads(line)["type"] == type(event).__struct_config__.tag
    assert json.loads(line)["seq"] == event.seq
    assert ev.decode_event(line) == event
    assert ev.decode_event(line.decode()) == event


@pytest.mark.parametrize(
    "event",
    [
        ev.PodAdmitted(seq=1, time=at(0), task="t", worker="w"),
        ev.TaskStateChanged(seq=2, time=at(0), task="t", state=TaskState.RUNNING),
        ev.Cancelled(seq=3, time=at(0)),
    ],
    ids=lambda event: type(event).__name__,
)
def test_round_trip_with_defaults_omitted(event: ev.Event) -> None:
    line = ev.encode_event(event)
    assert b"attempt" not in line
    assert b"message" not in line
    assert ev.decode_event(line) == event


def test_the_encoding_of_an_event() -> None:
    event = ev.UnitDone(seq=7, time=at(6), task="squares", index=2, worker="w-0", seconds=0.5)
    assert json.loads(ev.encode_event(event)) == {
        "type": "unit-done",
        "seq": 7,
        "time": "2024-05-06T07:08:15Z",
        "task": "squares",
        "index": 2,
        "worker": "w-0",
        "seconds": 0.5,
    }


def test_known_types_are_the_kebab_case_tags() -> None:
    assert {"submitted", "task-state", "unit-done", "oom-killed", "cancelled"} <= ev.KNOWN_TYPES
    assert len(ev.KNOWN_TYPES) == len(ev.RunEvent.__args__)
    assert all(tag == tag.lower() and "_" not in tag for tag in ev.KNOWN_TYPES)


def test_terminal_events() -> None:
    assert (ev.Succeeded, ev.Failed, ev.Cancelled) == ev.TERMINAL_EVENTS


def test_the_writer_of_a_log_is_the_service_unless_its_submitted_event_names_another() -> None:
    service = ev.Submitted(
        seq=1, time=at(0), run=RUN_ID, workflow=sample_workflow(), submitted_by="mk", owner="mk"
    )
    assert service.writer is ev.Writer.SERVICE
    assert b"writer" not in ev.encode_event(service), "a service's log reads as before the field"
    exported = ev.encode_event(msgspec.structs.replace(service, writer=ev.Writer.EXPORT))
    assert json.loads(exported)["writer"] == "export"
    decoded = ev.decode_event(exported)
    assert isinstance(decoded, ev.Submitted) and decoded.writer is ev.Writer.EXPORT


def test_a_new_optional_field_is_ignored() -> None:
    line = b'{"type":"built","seq":3,"time":"2024-05-06T07:08:09Z","image":"i","cache":"hit"}'
    assert ev.decode_event(line) == ev.Built(seq=3, time=at(0), image="i")


def test_an_unknown_type_keeps_its_place_in_the_log() -> None:
    line = b'{"type":"pod-exploded","seq":5,"time":"2024-05-06T07:08:09Z","task":"t"}\n'
    unknown = ev.decode_event(line)
    assert isinstance(unknown, ev.UnknownEvent)
    assert (unknown.seq, unknown.kind) == (5, "pod-exploded")


@pytest.mark.parametrize(
    "line", [b'{"type":"pod-exploded"}', b'{"type":"future-thing","seq":"not a number"}']
)
def test_an_unknown_type_without_a_seq_is_no_event(line: bytes) -> None:
    with pytest.raises(ev.EventDecodeError):
        ev.decode_event(line)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"%garbage\n", "JSON is malformed: invalid character (byte 0)"),
        (b"", "Input data was truncated"),
        (b"[1, 2]", "Expected `object`, got `array`"),
        (b'{"seq": 1}', "Object missing required field `type`"),
        (b'{"type": 3}', "Expected `str` - at `$.type`"),
        (b'{"type":"built","time":"yesterday"}', "Invalid RFC3339 encoded datetime - at `$.time`"),
        (b'{"type":"unit-done","task":"t","worker":"w"}', "Object missing required field `index`"),
    ],
)
def test_garbage_raises_event_decode_error(line: bytes, message: str) -> None:
    with pytest.raises(ev.EventDecodeError) as info:
        ev.decode_event(line)
    assert str(info.value) == message


def test_deeply_nested_garbage_raises_event_decode_error() -> None:
    with pytest.raises(ev.EventDecodeError):
        ev.decode_event(b"[" * 5000)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
TYPES = st.sampled_from([*sorted(ev.KNOWN_TYPES), "no-such-type"])
EVENT_LIKE = st.builds(
    lambda kind, fields: json.dumps({**fields, "type": kind}).encode(),
    TYPES,
    st.dictionaries(
        st.sampled_from(["seq", "time", "task", "worker", "index", "state", "message", "x"]),
        JSON_VALUES,
        max_size=5,
    ),
)


@settings(max_examples=200, deadline=None, database=None)
@given(line=st.one_of(st.binary(max_size=64), EVENT_LIKE))
def test_any_bytes_give_an_event_none_or_event_decode_error(line: bytes) -> None:
    try:
        event = ev.decode_event(line)
    except ev.EventDecodeError:
        return
    assert event is None or isinstance(event, ev.RunEvent.__args__)
