"""The GPUs of a machine and of a process, as CUDA names them. Pure: the texts are read by the
callers (`simrun_api.backends.local_gpus`, the harness's report).

A GPU is named by what `CUDA_VISIBLE_DEVICES` accepts: its index (`3`) or its UUID
(`GPU-8f3a...`). `CUDA_VISIBLE_DEVICES` lists the GPUs a process may use, comma-separated, as
Ray and Slurm read it; set but empty, it allows none.
"""

from __future__ import annotations

from collections.abc import Mapping

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
"""The variable that names the GPUs a process may use (CUDA, Ray, Slurm)."""
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
"""The variable the NVIDIA device plugin of Kubernetes names the GPUs of a container with."""
NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=index,uuid,memory.total", "--format=csv,noheader")
"""The command that lists the GPUs of a machine, one line each: `0, GPU-8f3a..., 81559 MiB`."""
_NOT_DEVICES = frozenset({"", "all", "none", "void"})
"""Values of `NVIDIA_VISIBLE_DEVICES` that name no device list."""


def parse_visible_devices(text: str) -> list[str]:
    """The GPUs of a `CUDA_VISIBLE_DEVICES` value, in its order: `"3,5"` is `["3", "5"]`, `""`
    none. As CUDA reads it, the list ends at the first negative index (`"0,-1,2"` is `["0"]`)
    and at the first GPU named twice (`"3,3,5"` is `["3"]`): a GPU is never counted, nor given
    to two tasks, twice."""
    devices: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if not name or name.startswith("-") or name in devices:
            break
        devices.append(name)
    return devices


def parse_nvidia_smi(text: str) -> list[str]:
    """The GPUs of the output of `NVIDIA_SMI_QUERY`, by UUID (by index when a line has none):
    a UUID names the same GPU whatever order CUDA enumerates them in."""
    devices: list[str] = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if not fields[0]:
            continue
        uuid = fields[1] if len(fields) > 1 else ""
        devices.append(uuid if uuid.startswith(("GPU-", "MIG-")) else fields[0])
    return devices


def visible_devices(environ: Mapping[str, str]) -> list[str] | None:
    """The GPUs a process was given, None when its environment does not say:
    `CUDA_VISIBLE_DEVICES` (locally and on Slurm), else a device list of
    `NVIDIA_VISIBLE_DEVICES` (a pod on Kubernetes)."""
    if CUDA_VISIBLE_DEVICES in environ:
        return parse_visible_devices(environ[CUDA_VISIBLE_DEVICES])
    nvidia = environ.get(NVIDIA_VISIBLE_DEVICES, "").strip()
    if nvidia.lower() in _NOT_DEVICES:
        return [] if nvidia.lower() in ("none", "void") else None
    return parse_visible_devices(nvidia)
