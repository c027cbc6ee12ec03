"""`command` tasks of the local backend in their images: `docker run`, or `podman run` where
docker is missing (a run submitted with `local_commands: docker`, `simrun submit --docker`).

The container sees the store and the scratch directory of its attempt at the same paths as the
service (bind mounts), so the paths of the argv and of the launch variables hold inside it; it
runs as the user of the service (`--user uid:gid`; podman also keeps the user's namespace,
`--userns=keep-id`, so the files it writes are the user's), in the task's directory, with the
variables of the launch contract (`simrun_core.launch.Launch.to_env`). It is named after the
run, the task, the worker and the attempt (`container_name`), so a cancel reaches it with
`<engine> kill` even where the engine's client does not pass a signal on.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Final

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
) -> list[str]:
    """The argv that runs `args` in `image` with `engine` (see the module): removed when it
    exits, the store and `scratch` mounted at their paths, as this user, in `workdir`, with
    the variables `env`."""
    argv = [engine, "run", "--rm", "--name", name, "--user", f"{os.getuid()}:{os.getgid()}"]
    if Path(engine).name.startswith("podman"):
        argv.append("--userns=keep-id")
    for directory in dict.fromkeys([store, scratch]):
        argv += ["--volume", f"{directory}:{directory}"]
    argv += ["--workdir", str(workdir)]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    return [*argv, image, *args]


def kill_argv(engine: str, name: str, signal_name: str = "KILL") -> list[str]:
    """The argv that sends a signal (`TERM`, `KILL`) to the container `name`."""
    return [engine, "kill", "--signal", signal_name, name]
