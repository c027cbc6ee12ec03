"""The built-in type `command`: a command of its own, without the harness of simrun."""

import msgspec

from simrun_core.plugins import ResourceHint, TaskType


class CommandSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Settings of a plain command task: its image, argv and resources."""

    image: str
    args: list[str]
    cores: int
    memory_gb: float
    gpus: int = 0
    scratch_gb: float = 0.0


COMMAND = TaskType(
    name="command",
    settings=CommandSettings,
    outputs=("out",),
    hint=ResourceHint(memory_base_gb=0.0, memory_per_worker_gb=1.0),
    description="A command in an image of its own",
)
