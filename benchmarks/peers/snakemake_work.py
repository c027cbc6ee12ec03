"""The work in Snakemake: a Snakefile generated into the work's directory, `--cores` the cores.

    python snakemake_work.py check                           # exits 0 when snakemake imports
    python snakemake_work.py squares UNITS SLEEP_S OUT       # one work
    python snakemake_work.py chain TASKS SLEEP_S OUT

A work writes `OUT/Snakefile` (a rule per unit, wildcard `index`; a rule summing them; or a
rule per chained task) whose jobs are `shell:` commands running a step of `work.py` (a job is a
process, Snakemake's model; its `run:` blocks would each spawn a whole Snakemake), then runs
Snakemake's command line in this process, as `snakemake --cores N --scheduler greedy` would
(greedy: half the time of the default ILP scheduler at 100 jobs here), and prints its phases
(`work.figures`). Snakemake has no service: its whole start is part of every work. Exits
`work.MISSING_EXIT` when snakemake cannot be imported.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import work

HERE = Path(__file__).resolve().parent


def snakefile(job: work.Work) -> str:
    """The Snakefile of a work."""
    step = f"{shlex.quote(sys.executable)} {shlex.quote(str(HERE / 'work.py'))}"
    if job.kind == "squares":
        return (
            'rule all:\n    input: "summary.json"\n\n'
            'rule unit:\n    output: "squares/{index}.json"\n'
            f'    shell: "{step} unit . {{wildcards.index}} {job.sleep_s!r}"\n\n'
            f'rule total:\n    input: expand("squares/{{index}}.json", index=range({job.count}))\n'
            '    output: "summary.json"\n'
            f'    shell: "{step} sum . {job.count}"\n'
        )
    rules = [f'rule all:\n    input: "t{job.count}/summary.json"\n']
    for number in range(1, job.count + 1):
        after = f'    input: "t{number - 1}/summary.json"\n' if number > 1 else ""
        rules.append(
            f'rule t{number}:\n{after}    output: "t{number}/summary.json"\n'
            f'    shell: "{step} chain-task . {number} {job.sleep_s!r}"\n'
        )
    return "\n".join(rules)


def run(job: work.Work) -> None:
    """Write the Snakefile of the work, run snakemake on it here; print its phases."""
    try:
        from snakemake.cli import main as snakemake
    except ImportError as error:
        work.missing("snakemake", error)
    imported = work.time.perf_counter()
    job.out.mkdir(parents=True, exist_ok=True)
    path = job.out / "Snakefile"
    path.write_text(snakefile(job))
    cores = len(os.sched_getaffinity(0))
    argv = ["--snakefile", str(path), "--directory", str(job.out), "--cores", str(cores)]
    try:
        snakemake([*argv, "--scheduler", "greedy", "--quiet", "all"])
    except SystemExit as exit:
        if exit.code not in (0, None):
            raise SystemExit(f"snakemake exited {exit.code}") from None
    done = work.time.perf_counter()
    work.check(job)
    work.figures(imports_s=imported - work.STARTED, work_s=done - imported)


if __name__ == "__main__":
    if sys.argv[1:] == ["check"]:
        try:
            import snakemake  # noqa: F401
        except ImportError as error:
            work.missing("snakemake", error)
    else:
        run(work.parse_work(sys.argv[1:]))
