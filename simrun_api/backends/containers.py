"""`command` tasks of the local backend in their images: `docker run`, or `podman run` where
docker is missing (a run submitted with `local_commands: docker`, `simrun submit --docker`).

The container sees the store and the scratch directory of its attempt at the same paths as the
service (bind mounts), so the paths of the argv and of the launch variables hold inside it; it
runs as the user of the service (`--user uid:gid`; podman also keeps the user's namespace,
`--userns=keep-id`, so the files it writes are the user's), in the task's directory, with the
variables of the launch contract (`simrun_core.launch.Launch.to_env`). It is named after the
run, the task, the worker and the attempt (`container_name`), so a cancel reaches it with
`<engine> kill` even where the engine's client does not pass a signal on.

On a machine with GPUs the container gets those of its attempt alone, as the NVIDIA container
toolkit takes them (`gpu_options`): docker's `--gpus "device=3,5"`, podman's CDI devices
`--device nvidia.com/gpu=3` one each. The container numbers the devices it was given from 0, so
its `CUDA_VISIBLE_DEVICES` is `0,1` there (`gpu_env`); a container of an attempt without GPUs
gets none, its `CUDA_VISIBLE_DEVICES` empty.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from simrun_core.gpus import CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES

ENGINES: Final = ("docker", "podman")
"""The container engines, in the order they are looked for on `PATH`."""


def container_engine(path: str | None = None) -> str | None:
    """The program of the first engine of `ENGINES` on `PATH` (or on `path`), None without."""
    for engine in ENGINES:
        found = shutil.which(engine, path=path)
        if found is not None:
            return found
    return None


def no_engine_message() -> str:
    """Why a run with `local_commands: docker` is refused where no engine is installed."""
    return (
        "neither docker nor podman is installed where the local service runs (none on its "
        "PATH): install one, or submit without --docker to run the command tasks as processes"
    )


def container_name(run_id: str, task: str, worker: str, attempt: int) -> str:
    """The name of the container of an attempt: `simrun-<run>-<task>-<worker>-<attempt>` (each
    part of the characters a container name allows)."""
    return f"simrun-{run_id}-{task}-{worker}-{attempt}"


def container_argv(
    engine: str,
    *,
    name: str,
    image: str,
    args: list[str],
    store: Path,
    scratch: Path,
    workdir: Path,
    env: Mapping[str, str],
    gpus: Sequence[str] | None = None,
) -> list[str]:
    """The argv that runs `args` in `image` with `engine` (see the module): removed when it
    exits, the store and `scratch` mounted at their paths, as this user, in `workdir`, with
    the variables `env` and the GPUs `gpus` of the attempt (None: the machine has none)."""
    argv = [engine, "run", "--rm", "--name", name, "--user", f"{os.getuid()}:{os.getgid()}"]
    if _is_podman(engine):
        argv.append("--userns=keep-id")
    for directory in dict.fromkeys([store, scratch]):
        argv += ["--volume", f"{directory}:{directory}"]
    argv += ["--workdir", str(workdir)]
    argv += gpu_options(engine, gpus or ())
    for key, value in {**env, **gpu_env(gpus)}.items():
        argv += ["--env", f"{key}={value}"]
    return [*argv, image, *args]


def gpu_options(engine: str, gpus: Sequence[str]) -> list[str]:
    """The options that give a container the GPUs `gpus` (indices or UUIDs, as the service
    names them) through the NVIDIA container toolkit; none for none. Docker: `--gpus` with
    `"device=3,5"`, the double quotes part of the value (docker reads it as CSV: bare,
    `device=3,5` is two fields and is refused). Podman: a CDI device `nvidia.com/gpu=<name>`
    each, the names `nvidia-ctk cdi generate` gives them."""
    if not gpus:
        return []
    if _is_podman(engine):
        return [part for gpu in gpus for part in ("--device", f"nvidia.com/gpu={gpu}")]
    return ["--gpus", f'"device={",".join(gpus)}"']


def gpu_env(gpus: Sequence[str] | None) -> dict[str, str]:
    """The GPU variables inside the container of an attempt given `gpus` (None: the machine
    has none, nothing set): `CUDA_VISIBLE_DEVICES` numbers them from 0 as the container sees
    them (`0,1` for GPUs 3 and 5 of the machine); for none it is empty, and
    `NVIDIA_VISIBLE_DEVICES=void` keeps the toolkit from giving GPUs to an image that asks for
    them itself (`ENV NVIDIA_VISIBLE_DEVICES=all` of CUDA images where nvidia is the default
    runtime)."""
    if gpus is None:
        return {}
    if not gpus:
        return {CUDA_VISIBLE_DEVICES: "", NVIDIA_VISIBLE_DEVICES: "void"}
    return {CUDA_VISIBLE_DEVICES: ",".join(str(index) for index in range(len(gpus)))}


def _is_podman(engine: str) -> bool:
    """Whether the program of an engine is podman's."""
    return Path(engine).name.startswith("podman")


def kill_argv(engine: str, name: str, signal_name: str = "KILL") -> list[str]:
    """The argv that sends a signal (`TERM`, `KILL`) to the container `name`."""
    return [engine, "kill", "--signal", signal_name, name]
