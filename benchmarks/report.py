"""The table of the figures, for the terminal and for `RESULTS.md`."""

from __future__ import annotations

from benchmarks.common import Row, Size

HEADER = ("benchmark", "simrun", "baseline", "ratio", "goal", "met?")


def format_value(value: float | None, unit: str) -> str:
    """A figure with its unit, rounded as the unit deserves."""
    if value is None:
        return "-"
    if unit in ("units/s", "events/s", "requests/s"):
        return f"{value:,.0f} {unit}"
    if unit == "MiB":
        return f"{value:,.1f} MiB"
    if unit == "ms":
        return f"{value:,.2f} ms" if value < 100 else f"{value:,.0f} ms"
    if unit == "s":
        return f"{value:.3f} s"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:g} {unit}"


def format_ratio(row: Row) -> str:
    """simrun / baseline."""
    ratio = row.ratio
    if ratio is None:
        return "-"
    return f"{ratio:.3g}" if ratio < 1000 else f"{ratio:,.0f}"


def format_met(met: bool | None) -> str:
    """yes, NO, or - for a figure without a goal."""
    return "-" if met is None else ("yes" if met else "NO")


def cells(row: Row) -> tuple[str, ...]:
    """The cells of a row of the table."""
    return (
        row.benchmark,
        format_value(row.simrun, row.unit),
        format_value(row.baseline, row.unit),
        format_ratio(row),
        row.goal,
        format_met(row.met),
    )


def format_table(rows: list[Row]) -> str:
    """The table as aligned text for a terminal."""
    lines = [HEADER, *(cells(row) for row in rows)]
    widths = [max(len(line[column]) for line in lines) for column in range(len(HEADER))]
    text = []
    for number, line in enumerate(lines):
        text.append("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
        if number == 0:
            text.append("  ".join("-" * width for width in widths))
    return "\n".join(text)


def markdown_table(rows: list[Row]) -> str:
    """The table in Markdown."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in rows:
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells(row)) + " |")
    return "\n".join(lines)


def results_markdown(
    rows: list[Row], facts: dict[str, str], size: Size, failures: list[str]
) -> str:
    """The whole of `RESULTS.md`: machine, table, notes, and the gaps of missed goals."""
    parts = [
        "# Benchmark results",
        "",
        "Written by `benchmarks/run` (see `benchmarks/README.md`); do not edit by hand, run it "
        "again. Each figure is the median of its repetitions (latencies: the median or p99 of "
        "their samples), simrun and baseline interleaved. ratio = simrun / baseline.",
        "",
        "## Machine",
        "",
        *(f"- {key}: {value}" for key, value in facts.items()),
        "",
        "## Figures",
        "",
        markdown_table(rows),
        "",
    ]
    if failures:
        parts += [f"**Benchmarks that failed to run: {', '.join(failures)}** (see their log).", ""]
    notes = [row for row in rows if row.note]
    if notes:
        parts += ["## How each figure is measured", ""]
        parts += [f"- **{row.benchmark}**: {row.note}" for row in notes]
        parts.append("")
    parts += ["## Sizes", "", *size_notes(size), ""]
    missed = [row for row in rows if row.met is False]
    parts += ["## Goals missed: cause and what would close the gap", ""]
    if not missed:
        parts += ["Every goal of the table is met.", ""]
    explained: dict[str, str] = {}
    for row in missed:
        text = row.gap or "(no analysis recorded)"
        if text in explained:
            text = f"The same cause as for *{explained[text]}* above."
        else:
            explained[text] = row.benchmark
        parts += [f"### {row.benchmark}", "", text, ""]
    return "\n".join(parts)


def size_notes(size: Size) -> list[str]:
    """What was scaled down from the sizes of the issue, and why."""
    largest = max(size.ledger_sizes)
    return [
        f"- Profile `{size.name}`: {size.reps} repetitions of every figure.",
        f"- local_overhead: {size.squares_units} units of {size.squares_sleep_s:g} s; a chain of "
        f"{size.chain_tasks} tasks of one unit of {size.chain_sleep_s:g} s.",
        f"- ledger: {', '.join(f'{n:,}' for n in size.ledger_sizes)} units. A full run of "
        f"{largest:,} units takes 7-20 s per repetition for simrun on this disk (10 of them: "
        "1 and 2 workers) and hours for the rename ledger (every claim lists the pending "
        "units), which does not fit 5 minutes. So each repetition times a window of units in "
        f"a ledger of the full size: simrun {min(size.ledger_window, *size.ledger_sizes):,} "
        "units at every size (the same window, so the sizes pay the same write-back and only "
        "the size of the ledger differs; as many fresh ledgers of a size as its windows need) "
        "in a ledger whose earlier windows are done, each worker starting at "
        "a unit no worker claimed yet (its cursor starts where the crc32 of its id says: the "
        f"ids are picked for that); the rename ledger {size.rename_window:,} claims in a ledger "
        "with half of its units pending and half done (the middle of a run, whose listing "
        "costs the average of the run), put back to that state after each repetition. The "
        "file systems are synced before each trial.",
        f"- events: a log of {size.fold_events:,} events; a finished run of "
        f"{size.finished_units:,} units and a live one whose log has {size.live_units:,} "
        "unit-done events, written with simrun_core's own events (see events.py).",
        f"- api: {size.posts} submissions; {size.sse_subscribers} subscribers of a run with "
        f"{size.sse_units} units of {size.sse_sleep_s:g} s.",
        f"- peers: {size.peers_reps} rotated rounds of squares and of the chain (as in "
        "local_overhead); zero-work squares of "
        + (
            ", ".join(
                f"{units:,} units ({reps} rounds)"
                for units, reps in zip(size.peers_zero_units, size.peers_zero_reps, strict=True)
            )
            or "no size"
        )
        + ", scaled down from 5 rounds to stay within minutes; Snakemake (a process per job, "
        f"~30 s per 1,000 units here) {size.peers_snakemake_reps} round(s) of each work, the "
        f"zero-work ones only up to {size.peers_snakemake_max_units:,} units. The peers' "
        "clusters (Dask, Ray) start "
        "once, like the service; every work is a fresh python of its own.",
    ]
