"""The task types of a run's snapshots, as the service knows them: metadata, never their code.

A local run with snapshots (`--snapshot`) may have tasks of a type only its snapshots define
(a plugin package in the working tree, installed nowhere). The service learns such a type from
the run's own environment, its venv with the snapshots installed: the probe
(`simrun_harness.types_probe`) runs there, loads the type by its entry point and answers a
`ProbeAnswer`, with a `ProbedType` per type: what the service needs to check, plan, launch and
learn (split or not, the ports, the resource hint, `uses_cores`, `cost_setting`, ...) and what
the plugin made of the settings of each task (`ProbedSettings`: the settings decoded by the
plugin's settings model, its units, or the problems of its fields).

`task_type_of` builds a `TaskType` of a `ProbedType` for the service: a `ProbedTaskType`, whose
settings model has the fields of the plugin's (typed `Any`) and whose `decode_settings` and
`units` answer what the probe answered; its `"module:function"` references are kept (they tell
a split type) but never resolved in the service. The `submitted` event of the run records the
types (`Submitted.snapshot_types`), so the run's actor, its backend and its learning, and a
service started again, have them without asking the environment again (`types_of_run`).
Pure: the probe is the harness's, running it is the service's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from simrun_core.errors import Problem, WorkflowError
from simrun_core.plugins import PluginFailure, TaskType, TaskTypeMetadata, metadata_of

if TYPE_CHECKING:
    from simrun_core.fold import RunRecord


class ProbeTask(msgspec.Struct, frozen=True):
    """A task the probe is asked about: its id, its type and its settings as submitted."""

    task: str
    type: str
    settings: dict[str, Any] = msgspec.field(default_factory=dict)


class ProbedSettings(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the plugin made of the settings of a task: decoded (each field by its name in the
    settings model, as builtins) with their units (None unsplit), or the problems of its
    fields (located below the settings: `n`, `args[0]`), or why counting the units failed."""

    settings: dict[str, Any]
    decoded: dict[str, Any] | None = None
    units: int | None = None
    units_error: str | None = None
    problems: list[Problem] = msgspec.field(default_factory=list)

    @property
    def accepted(self) -> bool:
        """Whether the settings decoded and their units were counted."""
        return self.decoded is not None and self.units_error is None and not self.problems


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProbedType(TaskTypeMetadata):
    """A task type of a run's snapshots, as the probe saw it in the run's environment: the
    metadata of its `TaskType`, the name and fields of its settings model, and the answers
    about the settings of the run's tasks of it. (A dataclass, as its metadata is: msgspec
    encodes and decodes it.)"""

    settings_model: str
    fields: list[str] = dataclasses.field(default_factory=list)
    answers: list[ProbedSettings] = dataclasses.field(default_factory=list)


class ProbeAnswer(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the probe answers: the types it found, those no entry point of the environment
    registers (`unknown`), and why a type cannot be loaded (`errors`, by type)."""

    types: dict[str, ProbedType] = msgspec.field(default_factory=dict)
    unknown: list[str] = msgspec.field(default_factory=list)
    errors: dict[str, str] = msgspec.field(default_factory=dict)


def settings_key(settings: Mapping[str, Any]) -> bytes:
    """The settings of a task as one canonical value (JSON, keys sorted): what an answer is
    found by."""
    return msgspec.json.encode(dict(settings), order="sorted")


def probed_type(task_type: TaskType, answers: list[ProbedSettings]) -> ProbedType:
    """The metadata of a loaded task type with the answers about its tasks' settings."""
    return ProbedType(
        settings_model=task_type.settings.__name__,
        fields=list(task_type.settings.__struct_fields__),
        answers=answers,
        **metadata_of(task_type),
    )


def decoded_fields(settings: msgspec.Struct) -> dict[str, Any]:
    """The fields of decoded settings by their names in the model, as builtins (a value that
    has none, as its text)."""
    decoded: dict[str, Any] = {}
    for field in settings.__struct_fields__:
        value = getattr(settings, field)
        try:
            decoded[field] = msgspec.to_builtins(value)
        except TypeError:
            decoded[field] = str(value)
    return decoded


@dataclasses.dataclass(frozen=True, eq=False)
class ProbedTaskType(TaskType):
    """A task type of a run's snapshots in the service: only metadata. Its settings decode to
    what the plugin decoded them to in the run's environment (`answers`), their units are the
    ones it counted; settings it was not asked about are refused."""

    answers: tuple[ProbedSettings, ...] = ()

    def decode_settings(self, settings: dict[str, Any]) -> msgspec.Struct:
        """The settings as the plugin decoded them; WorkflowError with the problems it found."""
        key = settings_key(settings)
        answer = next((a for a in self.answers if settings_key(a.settings) == key), None)
        if answer is None:
            raise WorkflowError(
                f"the type {self.name!r} of the snapshots was not asked about these settings"
            )
        if answer.problems:
            raise WorkflowError(answer.problems)
        if answer.decoded is None:
            raise WorkflowError(f"the type {self.name!r} of the snapshots decoded no settings")
        return msgspec.convert(answer.decoded, self.settings)

    def units(self, settings: msgspec.Struct) -> int | None:
        """The units the plugin counted for these (decoded) settings, None unsplit;
        PluginFailure with the plugin's error when counting failed."""
        if not self.splittable:
            return None
        key = settings_key(msgspec.to_builtins(settings))
        for answer in self.answers:
            if answer.decoded is not None and settings_key(answer.decoded) == key:
                if answer.units_error is not None:
                    raise PluginFailure(answer.units_error)
                if answer.units is None:
                    break
                return answer.units
        raise PluginFailure(f"the type {self.name!r} of the snapshots counted no units for them")


def task_type_of(probed: ProbedType) -> ProbedTaskType:
    """The task type of the service for a type of the snapshots (`ProbedTaskType`)."""
    model = msgspec.defstruct(probed.settings_model, [(field, Any) for field in probed.fields])
    return ProbedTaskType(settings=model, answers=tuple(probed.answers), **metadata_of(probed))


def recorded(types: Mapping[str, ProbedType]) -> dict[str, ProbedType]:
    """The types as the `submitted` event records them: with the answers that were accepted
    only (those of the run's tasks; a run has no refused settings)."""
    return {
        name: dataclasses.replace(
            probed, answers=[answer for answer in probed.answers if answer.accepted]
        )
        for name, probed in types.items()
    }


def snapshot_types_of(record: RunRecord) -> dict[str, TaskType]:
    """The task types of a run's snapshots its `submitted` event recorded, by name."""
    return {name: task_type_of(probed) for name, probed in record.snapshot_types.items()}


def types_of_run(types: Mapping[str, TaskType], record: RunRecord) -> dict[str, TaskType]:
    """The task types a run's tasks have: the service's, and those of its snapshots it
    recorded (a type the service has is the service's)."""
    if not record.snapshot_types:
        return dict(types)
    return {**snapshot_types_of(record), **types}
