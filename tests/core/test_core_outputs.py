"""The order and the selection of an output listing: the results before the units."""

from __future__ import annotations

import pytest

from simrun_core.outputs import OUTPUTS_LIMIT, matches, results_first, select_outputs

UNITS = [f"squares/{index}.json" for index in range(600)]


def test_the_summary_and_the_merged_files_come_before_the_units() -> None:
    paths = [*reversed(UNITS), "results/best.json", "summary.json", "report.txt"]
    ordered = results_first(paths)
    assert ordered[:4] == ["summary.json", "results/best.json", "report.txt", "squares/0.json"]
    assert ordered[4:] == UNITS[1:]


def test_numbers_sort_by_value_within_a_directory() -> None:
    paths = ["u/10.json", "u/2.json", "u/1.json", "u/1b.json", "u/a10.json", "u/a9.json"]
    assert results_first(paths) == [
        "u/1.json",
        "u/1b.json",
        "u/2.json",
        "u/10.json",
        "u/a9.json",
        "u/a10.json",
    ]


def test_a_summary_below_a_port_is_no_summary_of_the_task() -> None:
    assert results_first(["b/summary.json", "a.json", "summary.json"])[0] == "summary.json"
    assert results_first(["squares/summary.json", "x/a", "x/b"])[0] == "squares/summary.json"


def test_the_limit_keeps_the_first_and_counts_the_rest() -> None:
    shown, left_out = select_outputs([*UNITS, "summary.json"])
    assert len(shown) == OUTPUTS_LIMIT and shown[0] == "summary.json"
    assert left_out == 601 - OUTPUTS_LIMIT
    assert select_outputs(UNITS, limit=0) == (UNITS, 0)
    assert select_outputs(UNITS[:3], limit=5) == (UNITS[:3], 0)
    with pytest.raises(ValueError, match="cannot be negative"):
        select_outputs(UNITS, limit=-1)


def test_a_glob_matches_the_path_below_out_and_star_crosses_directories() -> None:
    paths = [*UNITS, "summary.json", "plots/a.png"]
    assert select_outputs(paths, glob="summary*") == (["summary.json"], 0)
    assert select_outputs(paths, glob="*.png") == (["plots/a.png"], 0)
    shown, left_out = select_outputs(paths, glob="squares/5?.json", limit=3)
    assert shown == ["squares/50.json", "squares/51.json", "squares/52.json"]
    assert left_out == 7
    assert select_outputs(paths, glob="nothing") == ([], 0)
    assert matches("a/b.json", None) and not matches("a/b.json", "b*")
