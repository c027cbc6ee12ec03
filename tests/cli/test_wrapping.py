"""Names in table cells wrap at their word boundaries (`simrun_cli.wrapping`)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from simrun_cli.wrapping import Name, words, wrap_name

NAME = "parameter-scan-of-the-hepatic-clearance-model"


def test_the_words_of_a_name_keep_their_separators() -> None:
    assert words("a-b.c_d/e f") == ["a-", "b.", "c_", "d/", "e ", "f"]
    assert "".join(words(NAME)) == NAME
    assert words("") == []


def test_a_name_wraps_after_its_separators() -> None:
    assert wrap_name(NAME, 12) == ["parameter-", "scan-of-the-", "hepatic-", "clearance-", "model"]
    assert wrap_name(NAME, 100) == [NAME]
    assert wrap_name("alice agent", 8) == ["alice", "agent"], "spaces at a line's end are dropped"
    assert wrap_name("", 4) == [""]


def test_only_a_word_wider_than_the_column_is_folded() -> None:
    assert wrap_name("abcdefgh-ij", 3) == ["abc", "def", "gh-", "ij"]
    for width in range(1, 50):
        lines = wrap_name(NAME, width)
        assert all(len(line) <= width for line in lines)
        assert "".join(lines) == NAME


def test_a_table_of_names_at_a_narrow_width_cuts_no_word() -> None:
    table = Table("id", "workflow", "group")
    table.add_row("20250102-030405-abcdef", Name(NAME), Name("fit-of-every-liver-model"))
    console = Console(file=io.StringIO(), width=50, color_system=None)
    console.print(table)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert all(len(line) <= 50 for line in text.splitlines())
    for word in (*NAME.split("-"), "every", "liver"):
        assert word in text, f"{word!r} is cut:\n{text}"
