"""The probe of the task types of a run's environment: `python -m simrun_harness.types_probe`.

Run by the local service with the python of a run's venv (its snapshots installed) for the
tasks whose type the service does not have: it reads a JSON list of `ProbeTask` on stdin,
loads each type by its entry point (`simrun_core.plugins.load_task_type`, as a harness of the
run would), decodes each task's settings with the plugin's settings model and counts its units,
and prints one `ProbeAnswer` as JSON on stdout (`simrun_core.snapshot_types`). A type no entry
point registers is `unknown`; one that cannot be loaded (its import raises, it is no TaskType)
has its error in `errors`. Exit 0 with an answer; 2 for input that is no list of tasks (the
error on stderr); an error of the probe itself is a traceback and exit 1.
"""

from __future__ import annotations

import os
import sys

import msgspec

from simrun_core.errors import Problem, WorkflowError
from simrun_core.plugins import TaskType, UnknownTaskType, load_task_type
from simrun_core.snapshot_types import (
    ProbeAnswer,
    ProbedSettings,
    ProbedType,
    ProbeTask,
    decoded_fields,
    probed_type,
    settings_key,
)


def settings_answer(task_type: TaskType, settings: dict[str, object]) -> ProbedSettings:
    """What a type makes of a task's settings: decoded with their units, or the problems."""
    try:
        decoded = task_type.decode_settings(settings)
    except WorkflowError as error:
        return ProbedSettings(settings=settings, problems=error.problems)
    except Exception as error:  # a plugin's own validation (`__post_init__`) may raise anything
        reason = f"the settings do not decode: {type(error).__name__}: {error}"
        return ProbedSettings(settings=settings, problems=[Problem(reason)])
    fields = decoded_fields(decoded)
    try:
        units = task_type.units(decoded)
    except Exception as error:
        return ProbedSettings(
            settings=settings, decoded=fields, units_error=f"{type(error).__name__}: {error}"
        )
    return ProbedSettings(settings=settings, decoded=fields, units=units)


def probe(tasks: list[ProbeTask]) -> ProbeAnswer:
    """The answer about the types of `tasks` in this environment."""
    found: dict[str, TaskType] = {}
    unknown: list[str] = []
    errors: dict[str, str] = {}
    answers: dict[str, dict[bytes, ProbedSettings]] = {}
    for task in tasks:
        name = task.type
        if name in unknown or name in errors:
            continue
        if name not in found:
            try:
                found[name] = load_task_type(name)
            except UnknownTaskType:
                unknown.append(name)
                continue
            except Exception as error:
                errors[name] = f"{type(error).__name__}: {error}"
                continue
            answers[name] = {}
        key = settings_key(task.settings)
        if key not in answers[name]:
            answers[name][key] = settings_answer(found[name], task.settings)
    types: dict[str, ProbedType] = {
        name: probed_type(task_type, list(answers[name].values()))
        for name, task_type in found.items()
    }
    return ProbeAnswer(types=types, unknown=unknown, errors=errors)


def main() -> int:
    """Read the tasks on stdin, print the answer on stdout."""
    try:
        tasks = msgspec.json.decode(sys.stdin.buffer.read(), type=list[ProbeTask])
    except msgspec.DecodeError as error:
        print(f"simrun_harness.types_probe: the tasks on stdin: {error}", file=sys.stderr)
        return 2
    # What a plugin prints while it loads goes to stderr: stdout carries the answer only.
    sys.stdout.flush()
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    try:
        answer = probe(tasks)
    finally:
        sys.stdout.flush()
        os.dup2(answer_fd, 1)
        os.close(answer_fd)
    sys.stdout.buffer.write(msgspec.json.encode(answer) + b"\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
