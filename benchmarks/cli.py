"""cli: what a `simrun` command costs of its own against a running local service.

The wall of `simrun status --local RUN` (the table), `simrun status --local RUN --json` and
`simrun list --local` from the start of the console script to its exit: python, its imports
(cyclopts, httpx, the structs of the wire), the probes of the local service (`service.json`,
`GET /local/instance`, `GET /me`, the environment of the command from
`.simrun/environment.json`), the request, the printing and the end. The service answers each
request in about a millisecond, so the wall is the command's own. The commands run as a user's
do: in the warm command process of the directory (`simrun_cli/warm.py`), which the first of
the warm-up commands starts; the same command run by itself (`SIMRUN_WARM=0`) is measured
alongside and given in the notes. The baseline is the floor of
any python client: a fresh `python -c` of the same interpreter that makes the same GET with the
token with the standard library's urllib. `python -c pass` (the start of this interpreter with
its `site`) and a python that imports only cyclopts and httpx (as the commands do: without
trio, anyio and httpx's own command line), the floor of the chosen libraries, are measured
alongside and given in the notes.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import Context, Row, interleaved, median, simrun_command, timed
from benchmarks.service import ServiceFailed, environment, start_service, stop_service

GOAL_S = 0.08
COMMAND_TIMEOUT_S = 60.0
LIBRARIES = (
    "import sys\n"
    "sys.modules.update(dict.fromkeys(('httpx._main', 'trio', 'anyio')))\n"
    "import cyclopts, httpx\n"
)


def urllib_get(url: str, token: str) -> list[str]:
    """A fresh python that GETs `url` with the token by urllib (no proxies) and reads it all."""
    code = (
        "import sys, urllib.request as r\n"
        "opener = r.build_opener(r.ProxyHandler({}))\n"
        "request = r.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[2]})\n"
        "opener.open(request).read()\n"
    )
    return [sys.executable, "-c", code, url, token]


def run_quietly(command: list[str], cwd: Path, **extra: str) -> None:
    """Run a command in `cwd`, its output dropped; ServiceFailed with its stderr if it fails."""
    done = subprocess.run(
        command,
        cwd=cwd,
        env={**environment(), **extra},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=COMMAND_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise ServiceFailed(f"{' '.join(command)} exited {done.returncode}: {done.stderr!r}")


def run(ctx: Context) -> list[Row]:
    """Measure the commands against their urllib baselines; the rows of the table."""
    reps = ctx.size.cli_reps
    project = ctx.scratch / "project"
    service = start_service(project)
    try:
        workflow = {
            "name": "one",
            "tasks": [{"id": "one", "type": "demo.squares", "settings": {"n": 2}}],
        }
        run_id = service.submit(workflow)["id"]
        service.wait(run_id)
        simrun = simrun_command()
        commands = {
            "status": ([*simrun, "status", "--local", run_id], f"/runs/{run_id}"),
            "status_json": ([*simrun, "status", "--local", run_id, "--json"], f"/runs/{run_id}"),
            "list": ([*simrun, "list", "--local"], "/runs"),
        }
        for command, path in commands.values():  # warm: the page cache, the environment file
            run_quietly(command, project)
            run_quietly(urllib_get(service.url + path, service.token), project)

        def wall(command: list[str], **extra: str) -> Callable[[int], float]:
            return lambda rep: timed(lambda: run_quietly(command, project, **extra))

        figures: dict[str, tuple[list[float], list[float]]] = {}
        for name, (command, path) in commands.items():
            ctx.log(f"{name}: {reps} reps")
            figures[name] = interleaved(
                reps, wall(command), wall(urllib_get(service.url + path, service.token))
            )
        starts, libraries = interleaved(
            reps, wall([sys.executable, "-c", "pass"]), wall([sys.executable, "-c", LIBRARIES])
        )
        by_itself = {
            name: median([wall(command, SIMRUN_WARM="0")(rep) for rep in range(reps)])
            for name, (command, _) in commands.items()
        }
    finally:
        stop_service(service)
    python_start, floor = median(starts), median(libraries)
    ctx.log(
        ", ".join(
            f"{name} {median(ours):.3f} s (by itself {by_itself[name]:.3f} s, urllib "
            f"{median(theirs):.3f} s)"
            for name, (ours, theirs) in figures.items()
        )
        + f"; python -c pass {python_start:.3f} s, cyclopts and httpx imported {floor:.3f} s"
    )
    shown = {
        "status": "`simrun status --local RUN` (the table)",
        "status_json": "`simrun status --local RUN --json`",
        "list": "`simrun list --local` (the table)",
    }
    rows = []
    for name, (ours, theirs) in figures.items():
        rows.append(
            Row(
                key=f"cli.{name}",
                benchmark=f"cli: {shown[name]}, wall against the running local service",
                simrun=median(ours),
                baseline=median(theirs),
                unit="s",
                goal=f"<= {GOAL_S:g} s",
                met=median(ours) <= GOAL_S,
                note=(
                    "the whole command, from the console script's start to its exit; baseline: "
                    "a fresh python making the same GET with urllib. The command by itself "
                    f"(`SIMRUN_WARM=0`, no warm process) {by_itself[name]:.3f} s. The start of "
                    "python "
                    f"(`python -c pass`, its site) is {python_start:.3f} s of both; a python "
                    f"that imports cyclopts and httpx only takes {floor:.3f} s"
                ),
            )
        )
    return rows
