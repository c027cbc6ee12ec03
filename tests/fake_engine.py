"""A fake container engine for the tests of `local_commands: docker` (no docker or podman is
installed here): a script named `docker` (or `podman`) that records its argv in
`$FAKE_ENGINE_LOG` and runs the command of `run` with the variables of its `--env` options in its
`--workdir`, as a container of an image with python would (without the client's GPU variables;
its `--gpus` and `--device` options are recorded only); `kill` is recorded only."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

FAKE_ENGINE = """\
#!PYTHON
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_ENGINE_LOG"], "a") as log:
    log.write(json.dumps({"argv": sys.argv, "uid": os.getuid()}) + "\\n")
if args[0] == "kill":
    sys.exit(0)
assert args[0] == "run", args
# a container has none of its client's GPU variables: only those of its --env options
hidden = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
env = {key: value for key, value in os.environ.items() if key not in hidden}
workdir, rest = None, args[1:]
with_value = {"--name", "--user", "--volume", "--workdir", "--env", "--gpus", "--device"}
while rest[0].startswith("-"):
    option = rest.pop(0)
    if option in with_value:
        value = rest.pop(0)
        if option == "--env":
            key, _, text = value.partition("=")
            env[key] = text
        elif option == "--workdir":
            workdir = value
image, argv = rest[0], rest[1:]
env["FAKE_IMAGE"] = image
os.chdir(workdir)
os.execvpe(argv[0], argv, env)
"""


def fake_engine(directory: Path, name: str) -> Path:
    """The fake engine `name` (`docker` or `podman`) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(FAKE_ENGINE.replace("PYTHON", sys.executable))
    path.chmod(0o755)
    return path


def without_engines() -> str:
    """The PATH of this process without a directory that has docker or podman."""
    keep = [
        part
        for part in os.environ.get("PATH", os.defpath).split(os.pathsep)
        if part and not any(os.access(Path(part) / name, os.X_OK) for name in ("docker", "podman"))
    ]
    return os.pathsep.join(keep)


def calls(root: Path) -> list[dict[str, Any]]:
    """The calls of the fake engine whose log is `root/engine.jsonl`: argv and uid each."""
    log = root / "engine.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
