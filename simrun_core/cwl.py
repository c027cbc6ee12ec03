"""The CWL v1.2 `Workflow` of a run, for cwltool on one machine or Toil on Slurm (spec 33).

The same run as `simrun_core.argo.workflow`, with the same harness commands and the same
environment (`Launch.to_env()` of `launch_for`), as one CWL `Workflow` of command line tools.
The steps work on the run store by absolute path and communicate through it: the ledger and the
outputs live in the store, which every step writes in place. The workflow inputs:

- `store` (a `string`, not a `Directory`): the run store, a local directory or the NFS mount of
  a Slurm cluster, the same path on every machine. A `Directory` would be staged (copied or
  linked read-only into each step's working directory, or into Toil's job store); a string is
  only a value, which each step's environment carries (`SIMRUN_TASK_DIR=$(inputs.store)/runs/
  <run>/tasks/<task>`), so the harness writes the ledger, the outputs and the reports in place.
- `scratch` (a `string`): the local scratch; a worker's is `<scratch>/<run>/<task>/<worker>`
  (`<scratch>/<run>/<task>/merge` for a merge, `<scratch>/<run>/<task>` for an unsplit task),
  created by the step before its command starts.

The steps of a task:

- a split task: `<task>-w0`, the coordinator (worker `w0`, `SIMRUN_ROLE=base`), which returns
  once the ledger is complete and merges (`SIMRUN_MERGE=1`, `TaskPlan.coordinator_merges`);
  `<task>-extra`, scattered over the worker indices `1..pods - 1` (workers `w<index>`,
  `SIMRUN_ROLE=extra`; left out for one pod), which exit when nothing is pending. Every exit
  code of an extra worker is one of its `successCodes`: a failed extra worker never fails the
  workflow (Argo's `continueOn`), the coordinator releases its claims once its heartbeat is
  stale and computes them, and a unit that fails deterministically fails the workflow through
  `<task>-w0`. A plan whose coordinator does not merge has `<task>-merge` (`simrun-merge`) after
  `<task>-w0`. With `cwltool --parallel` the coordinator and the extra workers run side by side;
  without it one after the other, and the run still ends: either one worker computes everything
  or the next finds nothing pending.
- an unsplit task: one step `<task>` running `simrun-exec` (a plugin type) or the argv of a
  `command` task, its `{settings}`, `{out}` and `{input}` as paths below `store`.

A task waits for the tasks it reads from: for the merge of a split one (`<task>-w0`, else
`<task>-merge`). The only CWL output of a step is its standard output (`log`), which exists to
order the steps: a reader takes the `log` of each task it reads from as its input `after`.

The settings of every task are written to `<task dir>/settings.json` before the workflow runs
(`simrun export`); the document does not carry them. The image of a task (a `command`'s own, its
type's, the run's) is only a `DockerRequirement` hint, so `cwltool --no-container` (and Toil with
`--no-container`) runs the commands in the environment where the runner runs; the cores and the
memory of the plan are a `ResourceRequirement` hint, which Toil asks Slurm for.

`to_cwl` is pure and returns plain dicts; `export_cwl` writes a document as YAML and validates
it with cwl-utils (the optional extra `cwl`: `pip install "simrun[cwl]"`, with cwltool).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, Final, Unpack

from simrun_core import events as ev
from simrun_core import launch as contract
from simrun_core.errors import Problem, WorkflowError
from simrun_core.fold import RunRecord
from simrun_core.planner import (
    MAX_PIECES,
    Node,
    PodShape,
    TaskPlan,
    shape,
)
from simrun_core.planning import SubmissionOptions, submitted_offline
from simrun_core.plugins import TaskType
from simrun_core.pod_command import COMMAND_TYPE, pod_command
from simrun_core.resources import ResolvedResources
from simrun_core.workflow import TaskSpec, Workflow

CWL_VERSION: Final = "v1.2"
STORE: Final = "store"
"""The workflow input of the run store, a path every step sees."""
SCRATCH: Final = "scratch"
"""The workflow input of the local scratch directory."""
DEFAULT_SCRATCH: Final = "/tmp/simrun-scratch"
LOG: Final = "log"
"""The one output of a step: its standard output, which orders the steps."""
AFTER: Final = "after"
"""The input of a step that takes the logs of the steps it waits for."""
INDEX: Final = "index"
"""The input of `<task>-extra` its scatter runs over: the worker index."""
MERGE_WORKER: Final = "merge"
"""The worker id of a `<task>-merge` step (`simrun-merge`'s default)."""
BACKEND: Final = "cwl"
"""The backend of a run prepared for CWL (`Submitted.backend`)."""
EVERY_EXIT_CODE: Final = (*range(256), *range(-1, -65, -1))
"""The `successCodes` of an extra worker: whatever its exit, the workflow goes on; a negative
code is a kill by the signal of its number (as cwltool and Toil report one)."""
SHELL_PREFIX: Final = ("sh", "-c", 'mkdir -p "$SIMRUN_SCRATCH" && exec "$@"', "simrun-step")
"""The `baseCommand` of every step: create the scratch directory, then run the command (the
`arguments`) in place of the shell, so the runner sees its exit code and its signals."""
CWL_EXTRA: Final = 'the optional extra "cwl" (pip install "simrun[cwl]")'

_STORE_REF: Final = "\x00store\x00"
_SCRATCH_REF: Final = "\x00scratch\x00"
_INDEX_REF: Final = "\x00index\x00"
_REFERENCES: Final = {
    _STORE_REF: f"$(inputs.{STORE})",
    _SCRATCH_REF: f"$(inputs.{SCRATCH})",
    _INDEX_REF: f"$(inputs.{INDEX})",
}
"""Placeholders of the values known only when a step runs, and their CWL parameter references
(`ToolTexts`)."""
_PLACEHOLDERS: Final = re.compile("(" + "|".join(map(re.escape, _REFERENCES)) + ")")
TEXT_INPUT: Final = "text"
"""The prefix of the inputs of a tool that hold a piece of its text literally (`ToolTexts`)."""
_SAMPLE_EXTRA: Final = "w1"
"""An extra worker whose launch tells what the extra workers' environment has of its own."""


def needs_parsing(text: str) -> bool:
    """Whether CWL reads a string of a field it interpolates (`arguments`, `envValue`) as a
    template: one with `$(` or `${`; any other is taken as it is."""
    return "$(" in text or "${" in text


class ToolTexts:
    """The strings of a command line tool (its arguments and variables) as CWL reads them back
    exactly: the placeholders (`$(inputs.store)`, ...) as parameter references, the rest literal.

    A string CWL does not interpolate (no `$(`, no `${`, no placeholder) stays as it is. In one
    it does, a piece of literal text that CWL would read otherwise (a `$`, a backslash, white
    space at an end of the string, which an interpolated string loses) becomes an input of the
    tool whose default is the piece (`text1`, ...) and a reference to it: the value of an input
    is never interpolated, so a command's argv reaches its process byte for byte.
    """

    def __init__(self) -> None:
        self.inputs: dict[str, dict[str, str]] = {}

    def field(self, value: str) -> str:
        pieces = _PLACEHOLDERS.split(value)
        if len(pieces) == 1 and not needs_parsing(value):
            return value
        parts = []
        last = len(pieces) - 1
        for position, piece in enumerate(pieces):
            if piece in _REFERENCES:
                parts.append(_REFERENCES[piece])
            elif _plain(piece, position == 0, position == last):
                parts.append(piece)
            else:
                name = f"{TEXT_INPUT}{len(self.inputs) + 1}"
                self.inputs[name] = {"type": "string", "default": piece}
                parts.append(f"$(inputs.{name})")
        return "".join(parts)


def _plain(piece: str, first: bool, last: bool) -> bool:
    """Whether a piece of literal text reads back as it is within an interpolated string."""
    if "$" in piece or "\\" in piece:
        return False
    return not ((first and piece[:1].isspace()) or (last and piece[-1:].isspace()))


def to_cwl(
    record: RunRecord,
    types: Mapping[str, TaskType],
    *,
    store: str | None = None,
    scratch: str = DEFAULT_SCRATCH,
    grace_s: float = contract.DEFAULT_GRACE_S,
) -> dict[str, Any]:
    """The CWL workflow of a run (see the module), from its record: its workflow, plans,
    resources, sources and image. Pure.

    `store` is the default of the workflow input `store` (None: the input is required), and
    `scratch` the default of `scratch`; `grace_s` the seconds a worker has after SIGTERM.

    Raises WorkflowError naming the task: one without a plan, of an unknown type, without a
    command, staging a port which is no input, or whose step id is another task's.
    """
    builder = _Builder(record, types, grace_s)
    for task in record.workflow.order():
        builder.add(task)
    return builder.document(store, scratch)


def export_cwl(path: Path, document: Mapping[str, Any]) -> Path:
    """Write a CWL document as YAML and validate it with cwl-utils; returns the path.

    Raises:
        ImportError: cwl-utils is not installed (`CWL_EXTRA`); nothing is written.
        ValueError: The document is no valid CWL v1.2 (the message is cwl-utils'); the file
            is removed again.
    """
    import yaml

    try:
        parser = importlib.import_module("cwl_utils.parser")
    except ImportError as error:
        raise ImportError(f"validating CWL needs cwl-utils, {CWL_EXTRA}: {error}") from None
    path = Path(path)
    text = yaml.dump(
        dict(document), Dumper=_dumper(), sort_keys=False, width=100, default_flow_style=None
    )
    path.write_text(text)
    try:
        parser.load_document_by_yaml(yaml.safe_load(text), path.resolve().as_uri())
    except Exception as error:  # schema-salad's and cwl-utils' errors share no base class
        path.unlink(missing_ok=True)
        raise ValueError(f"{path}: no valid CWL {CWL_VERSION}: {error}") from error
    return path


def _dumper() -> type[Any]:
    import yaml

    class Dumper(yaml.SafeDumper):
        """YAML for people: a string of many lines as a block, collections of scalars in one
        line."""

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return Dumper


def planned_submission(
    workflow: Workflow,
    types: Mapping[str, TaskType],
    nodes: Sequence[Node],
    *,
    run_id: str,
    time: datetime,
    submitted_by: str,
    max_pods: int = MAX_PIECES,
    **options: Unpack[SubmissionOptions],
) -> tuple[ev.Submitted, dict[str, Any]]:
    """The `submitted` event of a run of `workflow` planned on `nodes` for CWL
    (`submitted_offline`; its log written by `simrun export`, `ev.Writer.EXPORT`), and the
    settings of its tasks as submitted (what `<task dir>/settings.json` holds). Pure.

    Raises WorkflowError with every problem of the workflow, or of its planning; a workflow
    that reserves a node is refused (a CWL runner places the steps itself).
    """
    refusals = []
    if (options.get("reserve") or workflow.reserve) is not None:
        message = "a CWL run cannot reserve a node: its runner places the steps"
        refusals.append(Problem(message, field="reserve"))
    submitted = submitted_offline(
        workflow,
        types,
        nodes,
        run_id=run_id,
        time=time,
        submitted_by=submitted_by,
        backend=BACKEND,
        writer=ev.Writer.EXPORT,
        max_pods=max_pods,
        refusals=refusals,
        **options,
    )
    settings = {task.id: task.settings for task in workflow.tasks}
    return submitted, settings


class _Builder:
    """The steps of a workflow, added task by task in topological order."""

    def __init__(self, record: RunRecord, types: Mapping[str, TaskType], grace_s: float) -> None:
        self.record = record
        self.types = types
        self.grace_s = grace_s
        self.steps: list[dict[str, Any]] = []
        self.step_tasks: dict[str, str] = {}
        """Every step's id, with the task it is of."""
        self.scatter = False
        self.store = PurePosixPath(_STORE_REF)

    # -- the steps of a task --------------------------------------------------------------------

    def add(self, task: TaskSpec) -> None:
        task_type = self.types.get(task.type)
        if task_type is None:
            raise WorkflowError(Problem(f"unknown task type {task.type!r}", task.id, field="type"))
        plan = self.record.plans.get(task.id)
        if plan is None:
            raise WorkflowError(Problem("the run has no plan of it", task.id))
        for port in task.stage:
            if port not in task.inputs:
                known = ", ".join(sorted(task.inputs)) or "none"
                message = f"stages the port {port!r}, which is no input (inputs: {known})"
                raise WorkflowError(Problem(message, task.id, field="stage"))
        after = [self._final_step(dep) for dep in task.dependencies()]
        if plan.units is None:
            scratch = self._scratch(task, None)
            launch = self._launch(task, task_type, task.id, plan.shape, scratch)
            command = self._command(task, task_type, launch)
            env = self._env(launch)
            self._step(task, task.id, self._tool(task, task_type, command, env, plan.shape), after)
            return
        self._split(task, task_type, plan, after)

    def _split(self, task: TaskSpec, task_type: TaskType, plan: TaskPlan, after: list[str]) -> None:
        """The coordinator, the extra workers and a merge when the coordinator does not."""
        w0 = contract.COORDINATOR
        launch = self._launch(task, task_type, w0, plan.shape, self._scratch(task, w0))
        command = self._command(task, task_type, launch)
        tool = self._tool(task, task_type, command, self._env(launch), plan.shape)
        self._step(task, f"{task.id}-{w0}", tool, after)
        if plan.pods > 1:
            env = self._extra_env(task, task_type, plan.shape)
            tool = self._tool(task, task_type, command, env, plan.shape, extra=True)
            indices = list(range(1, plan.pods))
            self._step(task, f"{task.id}-extra", tool, after, indices=indices)
        if not plan.coordinator_merges:
            merge_shape = self._merge_shape(task, task_type, plan.shape)
            scratch = self._scratch(task, MERGE_WORKER)
            launch = self._launch(task, task_type, MERGE_WORKER, merge_shape, scratch)
            tool = self._tool(task, task_type, ["simrun-merge"], self._env(launch), merge_shape)
            self._step(task, f"{task.id}-merge", tool, [f"{task.id}-{w0}"])

    def _extra_env(self, task: TaskSpec, task_type: TaskType, pod: PodShape) -> dict[str, str]:
        """The environment of the extra workers: a sample extra worker's, its worker id and
        scratch those of the index of the scatter."""

        def env_of(worker: str) -> dict[str, str]:
            scratch = self._scratch(task, worker)
            return self._env(self._launch(task, task_type, worker, pod, scratch))

        sample, other = env_of(_SAMPLE_EXTRA), env_of("w2")
        varying = {key for key in sample if sample[key] != other.get(key)}
        if varying != {contract.WORKER, contract.SCRATCH}:
            raise RuntimeError(f"the launch contract changed: the workers differ in {varying}")
        worker = f"w{_INDEX_REF}"
        return {
            **sample,
            contract.WORKER: worker,
            contract.SCRATCH: self._scratch(task, worker),
        }

    # -- the values of a step -------------------------------------------------------------------

    def _scratch(self, task: TaskSpec, worker: str | None) -> str:
        path = PurePosixPath(_SCRATCH_REF) / self.record.id / task.id
        return str(path / worker if worker else path)

    def _launch(
        self, task: TaskSpec, task_type: TaskType, worker: str, pod: PodShape, scratch: str
    ) -> contract.Launch:
        """The launch of a worker, as the step sees the store and its scratch; no snapshot
        is installed (the steps run in the runner's environment) and the memory is that of
        the harness's process tree (a step has no cgroup of its own); the memory of the plan
        is the step's to keep (Toil asks Slurm for it), so the harness enforces it."""
        return contract.launch_for(
            self.record,
            task.id,
            worker,
            0,
            task_type=task_type,
            store=self.store,
            scratch=scratch,
            node="cwl",
            cores=pod.cores,
            grace_s=self.grace_s,
            memory_source="process",
            memory_enforced=True,
            retry_memory=False,
        )

    def _env(self, launch: contract.Launch) -> dict[str, str]:
        """The variables of a step: its launch's but the node (the harness takes the host's
        name), and `PYTHONPATH` the root of the run's model."""
        env = launch.to_env()
        env.pop(contract.NODE, None)
        root = self._import_root()
        if root is not None:
            env["PYTHONPATH"] = root
        return env

    def _import_root(self) -> str | None:
        """The root of the model, which a task imports from first: the snapshot of the run's
        first source below the store, else its working tree."""
        if not self.record.sources:
            return None
        model = self.record.sources[0]
        if model.snapshot:
            return str(self.store / model.snapshot)
        return model.path or None

    def _command(self, task: TaskSpec, task_type: TaskType, launch: contract.Launch) -> list[str]:
        """The argv of a step: its harness entry, or a `command` task's args with its settings
        file, its output and its inputs below the store."""
        return pod_command(task, task_type, launch, self.store)

    def _image(self, task: TaskSpec, task_type: TaskType) -> str | None:
        """The image of a task: a `command`'s own, else its type's, else the run's; None
        without one (the hint is left out)."""
        if task_type.name == COMMAND_TYPE:
            image = getattr(task_type.decode_settings(task.settings), "image", None)
            if isinstance(image, str) and image:
                return image
        return task_type.image or self.record.image

    def _merge_shape(self, task: TaskSpec, task_type: TaskType, pod: PodShape) -> PodShape:
        """One process on one core, sized by the planner as the workers are."""
        resolved = self.record.resources.get(task.id)
        base = resolved.memory_base_gb if resolved else task_type.hint.memory_base_gb
        one = ResolvedResources(memory_base_gb=base, memory_per_worker_gb=pod.per_worker_gb)
        return shape(one, [Node(name=MERGE_WORKER, cores=1, memory_gb=float(pod.memory_gb))], 1)

    def _tool(
        self,
        task: TaskSpec,
        task_type: TaskType,
        command: list[str],
        env: Mapping[str, str],
        pod: PodShape,
        *,
        extra: bool = False,
    ) -> dict[str, Any]:
        """The command line tool of a step: the command after `SHELL_PREFIX`, its environment
        (`EnvVarRequirement`), the image and the resources as hints; its standard output is
        its one output."""
        texts = ToolTexts()
        arguments = [texts.field(part) for part in command]
        env_def = [{"envName": name, "envValue": texts.field(value)} for name, value in env.items()]
        inputs: dict[str, Any] = {STORE: "string", SCRATCH: "string"}
        if extra:
            inputs[INDEX] = "int"
        inputs[AFTER] = {"type": {"type": "array", "items": "File"}, "default": []}
        inputs.update(texts.inputs)
        hints: list[dict[str, Any]] = []
        image = self._image(task, task_type)
        if image is not None:
            hints.append({"class": "DockerRequirement", "dockerPull": image})
        hints.append(
            {"class": "ResourceRequirement", "coresMin": pod.cores, "ramMin": pod.memory_gb * 1024}
        )
        tool: dict[str, Any] = {
            "class": "CommandLineTool",
            "baseCommand": list(SHELL_PREFIX),
            "arguments": arguments,
            "inputs": inputs,
            "outputs": {LOG: "stdout"},
            "stdout": f"{LOG}.txt",
            "requirements": [{"class": "EnvVarRequirement", "envDef": env_def}],
            "hints": hints,
        }
        if extra:
            tool["successCodes"] = list(EVERY_EXIT_CODE)
        return tool

    # -- the workflow ---------------------------------------------------------------------------

    def _final_step(self, task_id: str) -> str:
        """The step a reader of a task waits for: its one step, else its merge."""
        plan = self.record.plans.get(task_id)
        if plan is None or plan.units is None:
            return task_id
        if plan.coordinator_merges:
            return f"{task_id}-{contract.COORDINATOR}"
        return f"{task_id}-merge"

    def _step(
        self,
        task: TaskSpec,
        step_id: str,
        tool: dict[str, Any],
        after: list[str],
        *,
        indices: list[int] | None = None,
    ) -> None:
        other = self.step_tasks.get(step_id)
        if other is not None:
            message = f"its CWL step {step_id!r} is also one of task {other!r}: rename a task"
            raise WorkflowError(Problem(message, task.id, field="id"))
        self.step_tasks[step_id] = task.id
        step_in: dict[str, Any] = {STORE: STORE, SCRATCH: SCRATCH}
        if after:
            step_in[AFTER] = {
                "source": [f"{step}/{LOG}" for step in after],
                "linkMerge": "merge_flattened",
            }
        step: dict[str, Any] = {"id": step_id}
        if indices is not None:
            self.scatter = True
            step_in[INDEX] = {"default": indices}
            step["scatter"] = INDEX
        step.update({"run": tool, "in": step_in, "out": [LOG]})
        self.steps.append(step)

    def document(self, store: str | None, scratch: str) -> dict[str, Any]:
        record = self.record
        store_input: dict[str, Any] = {
            "type": "string",
            "doc": "The run store, an absolute path every step sees (e.g. the NFS mount); "
            "the steps write into it in place.",
        }
        if store is not None:
            store_input["default"] = store
        requirements: list[dict[str, Any]] = [{"class": "MultipleInputFeatureRequirement"}]
        if self.scatter:
            requirements.append({"class": "ScatterFeatureRequirement"})
        return {
            "cwlVersion": CWL_VERSION,
            "class": "Workflow",
            "label": f"simrun run {record.id} of workflow {record.workflow.name}",
            "doc": "The steps write the run store in place: run with cwltool --no-container "
            "(--parallel), or toil-cwl-runner with the store on a shared file system.",
            "requirements": requirements,
            "hints": [{"class": "WorkReuse", "enableReuse": False}],
            "inputs": {
                STORE: store_input,
                SCRATCH: {
                    "type": "string",
                    "default": scratch,
                    "doc": "The local scratch directory of the steps.",
                },
            },
            "outputs": {},
            "steps": self.steps,
        }
