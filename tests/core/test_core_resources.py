"""simrun_core.resources: keys, observations of reports and the resolution of a request."""

from __future__ import annotations

import dataclasses
import random
from datetime import UTC, datetime, timedelta
from fractions import Fraction

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simrun_core import events as ev
from simrun_core.planner import Node, PodShape, TaskPlan, plan_task
from simrun_core.plugins import ResourceHint
from simrun_core.resources import (
    GIB,
    MARGIN,
    MIN_LEARNED_PER_WORKER_GB,
    RETRY_FACTOR,
    WINDOW,
    Observation,
    ResolvedResources,
    ResourceKey,
    expected_seconds,
    nearest_rank,
    observation_from_report,
    resolve,
    resolve_resources,
    resource_key,
)
from simrun_core.task_types.command import COMMAND, CommandSettings
from simrun_core.task_types.demo import SQUARES, SquaresSettings
from simrun_core.workflow import Priority, ResourceOverride, SplitMode, TaskSpec

T0 = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
TASK = TaskSpec(id="fit", type="demo.squares")
SETTINGS = SquaresSettings(n=100)
KEY = ResourceKey("demo.squares", "model")


class CostSettings(msgspec.Struct, forbid_unknown_fields=True):
    method: str = "lsq"
    points: int = 10
    tolerance: float = 0.1
    grid: dict[str, int] = msgspec.field(default_factory=dict)
    label: str | None = None


COSTLY = dataclasses.replace(SQUARES, name="costly", settings=CostSettings, cost_setting="method")


def observation(
    seconds: float,
    per_worker_gb: float | None = 1.0,
    *,
    run: str | None = None,
    oom: bool = False,
    succeeded: bool | None = None,
    seconds_per_unit: float | None = None,
    worker: str = "fit-w0",
) -> Observation:
    """An observation `seconds` after T0, of a run named after its time by default."""
    return Observation(
        key=KEY.text(),
        run=run if run is not None else f"run-{seconds:g}",
        task="fit",
        worker=worker,
        attempt=0,
        per_worker_gb=per_worker_gb,
        seconds_per_unit=seconds_per_unit,
        oom=oom,
        succeeded=(not oom) if succeeded is None else succeeded,
        time=T0 + timedelta(seconds=seconds),
    )


def resolved(*observations: Observation, override: ResourceOverride | None = None):
    return resolve(TASK, SQUARES, SETTINGS, observations, override)


# --- keys ---------------------------------------------------------------------------------------


def test_a_key_without_a_cost_setting_has_no_variant() -> None:
    plain = dataclasses.replace(SQUARES, cost_setting=None)
    key = resource_key(plain, {"n": 3}, "pkdb_models")
    assert key == ResourceKey("demo.squares", "pkdb_models", "")
    assert key.text() == '["demo.squares","pkdb_models",""]'
    assert resource_key(plain, {"n": 3}, "").text() == '["demo.squares","",""]'


def test_the_demo_squares_learn_apart_by_their_seconds_a_unit() -> None:
    fast = resource_key(SQUARES, {"n": 3}, "m")
    assert fast == ResourceKey("demo.squares", "m", "0.0")
    assert resource_key(SQUARES, {"n": 3, "sleep_s": 2}, "m").variant == "2.0"


@pytest.mark.parametrize(
    ("cost_setting", "settings_", "variant"),
    [
        ("method", {"method": "mcmc"}, "mcmc"),  # text as is
        ("method", {}, "lsq"),  # the default when unset
        ("points", {"points": 200}, "200"),  # other values as JSON
        ("points", {}, "10"),
        ("tolerance", {"tolerance": 1}, "1.0"),  # decoded: 1 and 1.0 are one variant
        ("tolerance", {"tolerance": 1.0}, "1.0"),
        ("grid", {"grid": {"b": 2, "a": 1}}, '{"a":1,"b":2}'),  # sorted keys
        ("label", {}, "null"),
    ],
)
def test_the_variant_is_the_value_of_the_cost_setting(
    cost_setting: str, settings_: dict[str, object], variant: str
) -> None:
    task_type = dataclasses.replace(COSTLY, cost_setting=cost_setting)
    assert resource_key(task_type, settings_, "m") == ResourceKey("costly", "m", variant)
    decoded = task_type.decode_settings(dict(settings_))
    assert resource_key(task_type, decoded, "m") == ResourceKey("costly", "m", variant)


def test_a_cost_setting_which_is_no_setting_is_an_error() -> None:
    task_type = dataclasses.replace(COSTLY, cost_setting="nope")
    with pytest.raises(ValueError, match=r"type 'costly': its cost_setting 'nope' is no setting"):
        resource_key(task_type, {}, "m")


def test_keys_of_different_parts_differ_as_text() -> None:
    texts = {
        ResourceKey("a", "b", "c").text(),
        ResourceKey("a", "b,c", "").text(),
        ResourceKey("a,b", "c", "").text(),
        ResourceKey("a", "", "b").text(),
    }
    assert len(texts) == 4


# --- observations of reports --------------------------------------------------------------------


def report(**fields: object) -> ev.WorkerReport:
    values: dict[str, object] = {
        "seq": 9,
        "time": T0,
        "task": "fit",
        "worker": "fit-w1",
        "attempt": 2,
        "processes": 4,
        "units_done": 8,
        "unit_seconds": 20.0,
        "peak_memory_bytes": 6 * GIB,
        "per_worker_gb": 2.5,
    }
    values.update(fields)
    return ev.WorkerReport(**values)  # type: ignore[arg-type]


def test_an_observation_of_a_report() -> None:
    assert observation_from_report(KEY, report(), base_gb=2.0, run="r1") == Observation(
        key=KEY.text(),
        run="r1",
        task="fit",
        worker="fit-w1",
        attempt=2,
        per_worker_gb=1.0,  # (6 - 2) / 4
        seconds_per_unit=2.5,  # 20 / 8
        oom=False,
        succeeded=True,
        time=T0,
    )


def test_the_memory_per_worker_of_a_report_is_exact_and_at_least_zero() -> None:
    one = observation_from_report(KEY, report(peak_memory_bytes=GIB, processes=3), 0.1)
    assert one.per_worker_gb == 0.3
    low = observation_from_report(KEY, report(peak_memory_bytes=GIB), base_gb=2.0)
    assert low.per_worker_gb == 0.0


def test_a_report_killed_for_memory_counts_its_limit() -> None:
    killed = observation_from_report(KEY, report(failed=True, exit_code=137), 2.0, oom=True)
    assert (killed.per_worker_gb, killed.oom, killed.succeeded) == (2.5, True, False)


def test_a_report_without_memory_or_units() -> None:
    bare = observation_from_report("k", report(peak_memory_bytes=None, units_done=0), 2.0)
    assert (bare.key, bare.per_worker_gb, bare.seconds_per_unit) == ("k", None, None)


def test_succeeded_follows_the_report_unless_given() -> None:
    assert not observation_from_report(KEY, report(failed=True, exit_code=1), 0.0).succeeded
    assert not observation_from_report(KEY, report(exit_code=143), 0.0).succeeded
    assert observation_from_report(KEY, report(exit_code=0), 0.0).succeeded
    assert not observation_from_report(KEY, report(), 0.0, succeeded=False).succeeded
    assert observation_from_report(KEY, report(), 0.0, task="other").task == "other"


def test_an_observation_is_json() -> None:
    value = observation(1.0, 2.0, seconds_per_unit=0.5)
    assert msgspec.json.decode(msgspec.json.encode(value), type=Observation) == value


# --- resolving ----------------------------------------------------------------------------------


def test_the_hint_without_observations() -> None:
    assert resolved() == ResolvedResources(
        memory_base_gb=0.125,
        memory_per_worker_gb=0.25,
        seconds_per_unit=None,
        samples=0,
        source="plugin hint",
    )
    assert resolve_resources(TASK, SQUARES, SETTINGS) == resolved()


def test_a_type_without_a_hint_has_the_default() -> None:
    plain = dataclasses.replace(SQUARES, hint=ResourceHint())
    result = resolve(TASK, plain, SETTINGS)
    assert (result.memory_per_worker_gb, result.source) == (6.0, "default")


def test_a_command_has_the_resources_of_its_settings_whatever_was_observed() -> None:
    settings_ = CommandSettings(image="i", args=[], cores=4, memory_gb=8.0, gpus=1, scratch_gb=20.0)
    task = TaskSpec(id="c", type="command")
    expected = ResolvedResources(
        memory_base_gb=0.0,
        memory_per_worker_gb=8.0,
        scratch_gb=20.0,
        gpus=1,
        workers=1,
        cores_per_worker=4,
        source="settings",
    )
    assert resolve(task, COMMAND, settings_, [observation(1, 50.0)]) == expected


def test_one_observation_times_the_margin_without_float_noise() -> None:
    result = resolved(observation(1, 3.0, seconds_per_unit=3.0))
    assert Fraction("1.1") == MARGIN and 3.0 * 1.1 != 3.3
    assert result.memory_per_worker_gb == 3.3
    assert (result.samples, result.source, result.seconds_per_unit) == (
        1,
        "learned from 1 run",
        3.0,
    )
    assert (result.memory_base_gb, result.scratch_gb, result.gpus) == (0.125, 0.0, 0)


def test_the_95th_percentile_by_nearest_rank() -> None:
    assert nearest_rank(range(1, 21)) == 19  # of 20 values the second largest
    assert nearest_rank(range(1, 101)) == 95
    assert nearest_rank(range(1, 20)) == 19  # of 19 or fewer the largest
    assert nearest_rank([3.0]) == 3.0
    assert nearest_rank([5, 1, 4, 2, 3], 50) == 3
    with pytest.raises(ValueError, match="no values"):
        nearest_rank([])


def test_resolve_takes_the_95th_percentile_of_the_window_times_the_margin() -> None:
    observations = [observation(i, float(i)) for i in range(1, 21)]
    random.Random(7).shuffle(observations)
    result = resolved(*observations)
    assert result.memory_per_worker_gb == 20.9  # 19 * 1.1
    assert (result.samples, result.source) == (20, "learned from 20 runs")


def test_the_window_is_the_last_twenty_observations() -> None:
    old = [observation(i, 100.0) for i in range(5)]
    recent = [observation(10 + i, float(f"1.{i:02d}")) for i in range(WINDOW)]
    assert WINDOW == 20
    result = resolved(*recent, *old)
    assert result.memory_per_worker_gb == float(Fraction("1.18") * MARGIN)
    assert result.samples == 20
    # one more old value inside the window is the 95th percentile's second largest
    result = resolved(*recent[1:], old[-1])
    assert result.samples == 20 and result.memory_per_worker_gb == float(Fraction("1.19") * MARGIN)


def test_runs_are_counted_once() -> None:
    observations = [observation(i, 1.0, run="r1", worker=f"w{i}") for i in range(3)]
    result = resolved(*observations, observation(9, 1.0, run="r2"))
    assert (result.samples, result.source) == (4, "learned from 2 runs")


def test_a_kill_for_memory_sets_a_floor_of_one_and_a_half_times_its_memory() -> None:
    measured = observation(1, 2.0)
    killed = observation(2, 4.0, oom=True, run="killed")
    result = resolved(measured, killed)
    assert RETRY_FACTOR == 1.5
    assert result.memory_per_worker_gb == 6.0  # over 2.0 * 1.1
    assert (result.samples, result.source) == (1, "learned from 2 runs")
    alone = resolved(killed)
    assert (alone.memory_per_worker_gb, alone.samples, alone.source) == (
        6.0,
        0,
        "learned from 1 run",
    )


def test_a_kill_is_no_observation_of_the_window() -> None:
    result = resolved(observation(1, 2.0), observation(2, 1.0, oom=True))
    assert (result.memory_per_worker_gb, result.samples) == (2.2, 1)  # 1.5 is below 2.2


def test_a_later_success_lifts_the_floor_of_a_kill() -> None:
    killed = observation(2, 4.0, oom=True, run="killed")
    success = observation(3, 2.0, run="later")
    result = resolved(observation(1, 2.0), killed, success)
    assert (result.memory_per_worker_gb, result.source) == (2.2, "learned from 2 runs")
    # a success before the kill or at its time does not
    assert resolved(observation(1, 2.0), killed).memory_per_worker_gb == 6.0
    at_once = observation(2, 2.0, run="same time")
    assert resolved(killed, at_once).memory_per_worker_gb == 6.0
    # nor does a later observation which did not succeed
    failed = observation(3, 2.0, succeeded=False)
    assert resolved(observation(1, 2.0), killed, failed).memory_per_worker_gb == 6.0


def test_the_highest_of_several_kills_sets_the_floor() -> None:
    kills = [observation(1, 4.0, oom=True), observation(2, 6.0, oom=True)]
    assert resolved(*kills).memory_per_worker_gb == 9.0


def test_the_median_seconds_of_a_unit_over_the_window() -> None:
    seconds = [4.0, 1.0, 3.0, 2.0]
    observations = [observation(i, seconds_per_unit=s) for i, s in enumerate(seconds)]
    assert resolved(*observations).seconds_per_unit == 2.5
    assert resolved(*observations[:3]).seconds_per_unit == 3.0
    without = observation(9, seconds_per_unit=None)
    assert resolved(*observations[:3], without).seconds_per_unit == 3.0
    assert resolved(without).seconds_per_unit is None
    old = [observation(-100 + i, seconds_per_unit=100.0) for i in range(30)]
    recent = [observation(i, seconds_per_unit=1.0) for i in range(WINDOW)]
    assert resolved(*old, *recent).seconds_per_unit == 1.0


def test_an_override_wins() -> None:
    observations = [observation(1, 2.0, seconds_per_unit=1.5), observation(2, 9.0, oom=True)]
    override = ResourceOverride(workers=3, memory_per_worker_gb=1.5, scratch_gb=4.0, gpus=1)
    assert resolved(*observations, override=override) == ResolvedResources(
        memory_base_gb=0.125,
        memory_per_worker_gb=1.5,
        scratch_gb=4.0,
        gpus=1,
        workers=3,
        seconds_per_unit=1.5,
        samples=0,
        source="override",
    )


def test_the_override_of_the_task_by_default() -> None:
    task = TaskSpec(
        id="fit", type="demo.squares", resources=ResourceOverride(memory_per_worker_gb=3.0)
    )
    result = resolve(task, SQUARES, SETTINGS, [observation(1, 2.0)])
    assert (result.memory_per_worker_gb, result.source) == (3.0, "override")


def test_an_override_without_memory_keeps_the_learned_memory() -> None:
    override = ResourceOverride(workers=2, scratch_gb=0.0)
    result = resolved(observation(1, 2.0), override=override)
    assert (result.memory_per_worker_gb, result.workers, result.source) == (
        2.2,
        2,
        "learned from 1 run",
    )


# --- expected seconds ---------------------------------------------------------------------------


def plan_of(units: int | None, pods: int, processes: int) -> TaskPlan:
    pod = PodShape(
        cores=processes,
        memory_gb=1,
        processes=processes,
        per_worker_gb=0.25,
        retry_memory_gb=1,
        retry_per_worker_gb=0.375,
    )
    return TaskPlan(
        task_id="fit",
        pods=pods,
        shape=pod,
        base_priority="simrun-owner-base",
        extra_priority="simrun-owner-extra",
        units=units,
    )


@pytest.mark.parametrize(
    ("units", "pods", "processes", "seconds"),
    [(10, 2, 2, 0.3), (8, 2, 2, 0.2), (1, 1, 1, 0.1), (100, 8, 4, 0.4)],
)
def test_expected_seconds_are_the_rounds_of_the_units(
    units: int, pods: int, processes: int, seconds: float
) -> None:
    assert expected_seconds(plan_of(units, pods, processes), 0.1) == seconds


def test_no_expected_seconds_unsplit_or_unlearned() -> None:
    assert expected_seconds(plan_of(None, 1, 1), 2.0) is None
    assert expected_seconds(plan_of(10, 1, 1), None) is None


def test_learned_seconds_limit_the_pods_of_a_plan() -> None:
    nodes = [Node(name=f"n{i}", cores=2, memory_gb=24.0) for i in range(12)]
    observations = [observation(i, 0.2, seconds_per_unit=1.0) for i in range(3)]
    resources = resolved(*observations)
    plan = plan_task(TASK, SQUARES, resources, nodes, SplitMode.FASTEST, Priority.OWNER, 100)
    assert (plan.pods, plan.shape.processes, plan.shape.per_worker_gb) == (5, 2, 0.22)
    assert expected_seconds(plan, resources.seconds_per_unit) == 10.0


# --- properties ---------------------------------------------------------------------------------

MEMORY = st.decimals(min_value=0, max_value=64, places=3).map(lambda d: float(str(d)))
OBSERVATIONS = st.lists(
    st.tuples(st.integers(0, 1000), MEMORY, st.booleans(), st.booleans()), max_size=40
)


@settings(max_examples=300, deadline=None)
@given(OBSERVATIONS)
def test_property_the_request_covers_the_window_and_the_open_kills(
    values: list[tuple[int, float, bool, bool]],
) -> None:
    observations = [
        observation(at, memory, oom=oom, succeeded=ok and not oom, worker=f"w{i}")
        for i, (at, memory, oom, ok) in enumerate(values)
    ]
    result = resolved(*observations)
    request = Fraction(str(result.memory_per_worker_gb))
    ordered = sorted(observations, key=lambda o: o.time)
    window = [Fraction(str(o.per_worker_gb)) for o in ordered if not o.oom][-WINDOW:]
    successes = [o.time for o in ordered if o.succeeded]
    kills = [
        Fraction(str(o.per_worker_gb))
        for o in ordered
        if o.oom and (not successes or o.time >= max(successes))
    ]
    assert result.samples == len(window)
    if window:
        assert request >= sorted(window)[-2 if len(window) == WINDOW else -1] * MARGIN
        assert request <= max(
            [max(window) * MARGIN, *(k * RETRY_FACTOR for k in kills), MIN_LEARNED_PER_WORKER_GB]
        )
        assert request >= MIN_LEARNED_PER_WORKER_GB
    for kill in kills:
        assert request >= kill * RETRY_FACTOR
    if not window and not any(kill * RETRY_FACTOR > Fraction("0.25") for kill in kills):
        assert (result.memory_per_worker_gb, result.source) == (0.25, "plugin hint")


def test_a_measurement_below_the_base_learns_the_least_memory_per_worker() -> None:
    result = resolved(observation(1, 0.0))
    assert result.memory_per_worker_gb == float(MIN_LEARNED_PER_WORKER_GB) == 0.0625
    assert result.source == "learned from 1 run"
