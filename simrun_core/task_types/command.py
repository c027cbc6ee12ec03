"""The built-in type `command`: a command of its own, without the harness of simrun."""

from typing import Annotated

import msgspec

from simrun_core.plugins import ResourceHint, TaskType


class CommandSettings(msgspec.Struct, forbid_unknown_fields=True):
    """Settings of a plain command task: its image, argv and resources."""

    image: Annotated[
        str,
        msgspec.Meta(
            description="The container image the command runs in on a cluster, and locally "
            "with --docker (else the local service runs the args directly)."
        ),
    ]
    args: Annotated[
        list[str],
        msgspec.Meta(
            description="The argv of the command, no shell: {settings} is the path of the "
            "settings file, {out} the output directory, and a part with {input} is repeated "
            "per input port as PORT=PATH; {{ and }} are a literal brace."
        ),
    ]
    cores: Annotated[int, msgspec.Meta(description="The cores the command uses.")]
    memory_gb: Annotated[float, msgspec.Meta(description="The memory the command needs, GiB.")]
    gpus: Annotated[int, msgspec.Meta(description="The GPUs the command needs.")] = 0
    scratch_gb: Annotated[
        float, msgspec.Meta(description="The local scratch space the command needs, GiB.")
    ] = 0.0


COMMAND = TaskType(
    name="command",
    settings=CommandSettings,
    outputs=("out",),
    hint=ResourceHint(memory_base_gb=0.0, memory_per_worker_gb=1.0),
    description="A command in an image of its own",
)
