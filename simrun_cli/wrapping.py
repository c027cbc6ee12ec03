"""Names in the cells of a table, wrapped at their word boundaries.

Rich wraps a cell at spaces only and folds a word wider than its column anywhere, so a name such
as `parameter-scan-of-the-liver` in a narrow column read `parameter` / `-scan-of-` / `the-liv` /
`er`. A `Name` breaks after a hyphen, an underscore, a dot, a slash or a space instead, and folds
only a word wider than the whole column.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.style import StyleType
from rich.text import Text

WORD = re.compile(r"[^\s\-_./]*[\s\-_./]*")
"""A word of a name with the separators after it, where a line may end."""


def words(name: str) -> list[str]:
    """The words of a name, each with the separators that follow it: `a-b.c` is `a-`, `b.`,
    `c`. Joined they are the name again."""
    return [word for word in WORD.findall(name) if word]


def wrap_name(name: str, width: int) -> list[str]:
    """The lines of a name in `width` cells: as many whole words on a line as fit (its spaces
    at the end dropped), a word wider than `width` folded into pieces of `width`."""
    width = max(1, width)
    lines: list[str] = []
    line = ""
    for word in words(name):
        if cell_len((line + word).rstrip()) <= width:
            line += word
            continue
        if line:
            lines.append(line.rstrip())
        line = ""
        for piece in _fold(word, width):
            if cell_len(piece.rstrip()) < width:
                line = piece
            else:
                lines.append(piece.rstrip())
    if line.rstrip() or not lines:
        lines.append(line.rstrip())
    return lines


def _fold(word: str, width: int) -> Iterator[str]:
    """A word in pieces of at most `width` cells (the last one shorter)."""
    piece = ""
    for char in word:
        if piece and cell_len(piece + char) > width:
            yield piece
            piece = ""
        piece += char
    yield piece


class Name:
    """A name in a table cell: wrapped at its word boundaries, its widest word the least width
    it asks for, its whole length the most."""

    def __init__(self, name: str, style: StyleType = "") -> None:
        self.name = name
        self.style = style

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = wrap_name(self.name, options.max_width)
        yield Text("\n".join(lines), style=self.style, no_wrap=True, overflow="fold")

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widest = max((cell_len(word.rstrip()) for word in words(self.name)), default=0)
        return Measurement(widest, cell_len(self.name))
