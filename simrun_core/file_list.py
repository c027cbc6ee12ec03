"""A file list (`{"files": [entry, ...]}`, the body of `POST /snapshots/{name}/missing`) read
as it arrives: each entry decoded and checked (`FileListCheck`) as soon as it is whole, so a
list that passes a limit is refused at its first bad entry, never decoded whole first, and
what is kept is the entries, not the text. Pure: it is fed bytes.

The body is one JSON object with the one key `files`, an array of flat objects (an entry has
strings, numbers and nulls only); whitespace anywhere JSON allows it.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

from simrun_core.errors import validation_problem
from simrun_core.snapshot import DEFAULT_LIMITS, FileEntry, FileListCheck, PathLimits

_WHITESPACE: Final = b" \t\r\n"
_ENTRY: Final = re.compile(rb'\{(?:"(?:[^"\\]|\\.)*+"|[^"{}\[\]])*+\}', re.DOTALL)
"""A flat JSON object: strings (with escapes) and anything but brackets outside them."""
_HEAD: Final = re.compile(rb'\s*\{\s*"files"\s*:\s*\[\s*')
_entry_decoder = msgspec.json.Decoder(FileEntry)


class FileListSyntax(ValueError):
    """A body that is no file list of this shape; the message says where."""


class FileListReader:
    """Reads a file list fed in chunks (`feed`), then `finish` answers its entries.

    SnapshotError (from `FileListCheck`) for an entry, or a list, that is refused;
    FileListSyntax for a body of another shape."""

    def __init__(self, limits: PathLimits = DEFAULT_LIMITS) -> None:
        self.check = FileListCheck(limits)
        self.entries: list[FileEntry] = []
        self._buffer = bytearray()
        self._state = "head"  # head, entry, separator, tail
        # An entry holds a path and a link target of at most PATH_MAX bytes each, a digest
        # and a mode; in JSON each character may take 6 (an escape), with room for the keys.
        self._entry_max = 12 * limits.path_bytes + 1024

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the body: decode and check the entries they complete."""
        self._buffer += data
        self._advance(final=False)

    def finish(self) -> list[FileEntry]:
        """The body ended: the entries once the whole list is checked."""
        self._advance(final=True)
        if self._state != "end":
            raise FileListSyntax("the body ended before the end of the file list")
        self.check.finish()
        return self.entries

    def _advance(self, final: bool) -> None:
        buffer = self._buffer
        position = 0
        while self._state != "end":
            if self._state == "head":
                found = _HEAD.match(buffer)
                if found is None:
                    if final or len(buffer) > 64 or _mismatch_head(buffer):
                        raise FileListSyntax('the body is no file list: {"files": [...]}')
                    break
                position = found.end()
                self._state = "first"
                continue
            position = _skip(buffer, position)
            if self._state == "tail":
                if position < len(buffer) and not _only_close(buffer, position):
                    raise FileListSyntax("the file list is followed by more than its '}'")
                if final:
                    if not _only_close(buffer, position):
                        raise FileListSyntax("the file list ends without its '}'")
                    self._state = "end"
                break
            if position == len(buffer):
                break
            if self._state == "separator" or (self._state == "first" and buffer[position] == 93):
                mark = buffer[position]
                if mark == 93:  # ]
                    self._state = "tail"
                elif mark == 44 and self._state == "separator":  # ,
                    self._state = "entry"
                else:
                    raise FileListSyntax(self._where("is followed by neither ',' nor ']'", -1))
                position += 1
                continue
            found = _ENTRY.match(buffer, position)
            if found is None:
                if final or len(buffer) - position > self._entry_max:
                    raise FileListSyntax(
                        self._where("is no flat JSON object of a path, mode, sha256 or link")
                    )
                break
            self._take(found.group())
            position = found.end()
            self._state = "separator"
        del buffer[:position]

    def _take(self, text: bytes) -> None:
        try:
            entry = _entry_decoder.decode(text)
        except msgspec.ValidationError as error:
            problem = validation_problem(error).under(f"files[{len(self.entries)}]")
            raise FileListSyntax(f"the file list: {problem.text()}") from None
        except msgspec.DecodeError as error:
            raise FileListSyntax(self._where(f"is no JSON: {error}")) from None
        self.check.add(entry)
        self.entries.append(entry)

    def _where(self, what: str, offset: int = 0) -> str:
        return f"the file list: the entry files[{len(self.entries) + offset}] {what}"


def _skip(buffer: bytearray, position: int) -> int:
    """The position of the first byte from `position` on that is no whitespace."""
    while position < len(buffer) and buffer[position] in _WHITESPACE:
        position += 1
    return position


def _only_close(buffer: bytearray, position: int) -> bool:
    """Whether the buffer from `position` holds the closing brace and whitespace only."""
    return bytes(buffer[position:]).strip(_WHITESPACE) == b"}"


def _mismatch_head(start: bytearray) -> bool:
    """Whether the start of a body can no longer become the head of a file list."""
    compact = bytes(start).translate(None, _WHITESPACE)
    expected = b'{"files":['
    return not (expected.startswith(compact) or compact.startswith(expected))


def read_file_list(body: bytes, limits: PathLimits = DEFAULT_LIMITS) -> list[FileEntry]:
    """The entries of a whole file list (`FileListReader` fed at once)."""
    reader = FileListReader(limits)
    reader.feed(body)
    return reader.finish()
