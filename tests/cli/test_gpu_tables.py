"""The GPUs in the tables of the command line: `estimate` shows the GPUs of a pod, `status` the
GPUs each pod was given, both only when some task has GPUs."""

from __future__ import annotations

import io
from types import SimpleNamespace

import msgspec
from cli_helpers import plan
from rich.console import Console, RenderableType

from simrun_cli.render import estimate_table, pods_table
from simrun_core.resources import ResolvedResources
from simrun_core.wire import PodView, RunView, TaskEstimate


def lines(renderable: RenderableType) -> list[str]:
    console = Console(file=io.StringIO(), width=100, color_system=None, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def estimate(gpus: int) -> TaskEstimate:
    planned = plan("train", None)
    shape = msgspec.structs.replace(planned.shape, gpus=gpus)
    return TaskEstimate(
        resources=ResolvedResources(memory_base_gb=0, memory_per_worker_gb=1, gpus=gpus),
        plan=msgspec.structs.replace(planned, shape=shape),
        seconds=None,
    )


def test_estimate_shows_the_gpus_of_a_pod_when_a_task_has_some() -> None:
    table = lines(estimate_table({"train": estimate(2), "plot": estimate(0)}))
    assert "GPUs/pod" in table[0]
    train = next(line for line in table if "train" in line).split()
    plot = next(line for line in table if "plot" in line).split()
    assert (train[5], plot[5]) == ("2", "0"), table
    assert "GPUs" not in "\n".join(lines(estimate_table({"plot": estimate(0)})))


def pod(worker: str, gpus: list[str] | None) -> PodView:
    return PodView(
        worker=worker,
        attempt=0,
        state="running",
        node="here",
        exit_code=None,
        oom=False,
        oom_kills=[],
        peak_memory_gb=None,
        processes=1,
        units_done=0,
        gpus=gpus,
    )


def run_of(*pods: PodView) -> RunView:
    """A run of one task `train` with `pods`: what the pods table reads of a run."""
    return SimpleNamespace(tasks={"train": SimpleNamespace(pods=list(pods))})  # type: ignore[return-value]


def test_status_shows_the_gpus_each_pod_was_given() -> None:
    table = lines(pods_table(run_of(pod("w0", ["3"]), pod("w1", []))))
    assert "GPUs" in table[0]
    assert any(line.split()[:2] == ["train", "w0"] and " 3 " in line for line in table), table
    without = lines(pods_table(run_of(pod("w0", None))))
    assert "GPUs" not in "\n".join(without)
