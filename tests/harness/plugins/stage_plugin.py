"""A split type that stages its input (a test of `stage` on a split task, issue 15), found as
`stage_plugin:READ`: unit i notes where it read the input port `data` (its path and whether it
is below the scratch directory) and the content of the file `<i>.txt` there; the merge notes
where it read it too."""

import json

import msgspec

from simrun_core.plugins import ResourceHint, TaskPaths, TaskType


class ReadSettings(msgspec.Struct, forbid_unknown_fields=True):
    n: int


def count_units(settings: ReadSettings) -> int:
    return settings.n


def setup(settings: ReadSettings, paths: TaskPaths) -> None:
    (paths.out / "seen").mkdir(parents=True, exist_ok=True)


def _seen(paths: TaskPaths) -> dict[str, object]:
    data = paths.inputs["data"]
    return {"path": str(data), "in_scratch": data.is_relative_to(paths.scratch)}


def compute_unit(settings: ReadSettings, index: int, paths: TaskPaths) -> None:
    seen = {**_seen(paths), "text": (paths.inputs["data"] / f"{index}.txt").read_text()}
    (paths.out / "seen" / f"{index}.json").write_text(json.dumps(seen))


def merge(settings: ReadSettings, paths: TaskPaths) -> None:
    units = [json.loads((paths.out / "seen" / f"{i}.json").read_text()) for i in range(settings.n)]
    summary = {"merge": _seen(paths), "texts": [unit["text"] for unit in units]}
    (paths.out / "summary.json").write_text(json.dumps(summary))


READ = TaskType(
    name="test.read",
    settings=ReadSettings,
    inputs=("data",),
    outputs=("seen",),
    hint=ResourceHint(memory_base_gb=0.0, memory_per_worker_gb=0.25),
    count_units="stage_plugin:count_units",
    setup="stage_plugin:setup",
    compute_unit="stage_plugin:compute_unit",
    merge="stage_plugin:merge",
)
