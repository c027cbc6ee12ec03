"""A file list read as it arrives (`FileListReader`), its limits (`PathLimits`), and the sizes a
tar's members declare (`declared_bytes`): plain values, no service."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from simrun_core.file_list import FileListReader, FileListSyntax, read_file_list
from simrun_core.snapshot import PathLimits, SnapshotError, check_files
from simrun_core.snapshot_store import UploadTooLarge, declared_bytes

ENTRY = {"mode": 0o444, "sha256": "0" * 64}


def body(paths: list[str]) -> bytes:
    return json.dumps({"files": [dict(ENTRY, path=path) for path in paths]}).encode()


@pytest.mark.parametrize("step", [1, 2, 7, 100, 1 << 20])
def test_a_list_fed_in_any_pieces_reads_the_same(step):
    paths = ['a "quoted" }{ name', "dir/b", "dir/sub/c", "\u00e9t\u00e9"]
    data = b'  {\n "files" :\n [ ' + body(paths)[11:-2] + b" ]\n}\n"
    reader = FileListReader()
    for start in range(0, len(data), step):
        reader.feed(data[start : start + step])
    assert [entry.path for entry in reader.finish()] == paths


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[]", "no file list"),
        (b'{"other": []}', "no file list"),
        (b'{"files": [1]}', "files[0] is no flat JSON object"),
        (b'{"files": [{"path": 3, "mode": 1, "sha256": null}]}', "files[0].path: expected `str`"),
        (b'{"files": [{"path": "a", "mode": 1, "link": "b"} {}]}', "neither ',' nor ']'"),
        (b'{"files": [],]}', "more than its '}'"),
        (b'{"files": [', "ended before the end"),
        (b'{"files": []', "ends without its '}'"),
    ],
)
def test_a_body_of_another_shape_is_named(data, message):
    with pytest.raises(FileListSyntax, match=message.replace("[", r"\[").replace("(", r"\(")):
        read_file_list(data)


def test_the_first_entry_past_a_limit_stops_the_reading():
    limits = PathLimits(entries=3)
    reader = FileListReader(limits)
    data = body([f"f{n}" for n in range(100)])
    with pytest.raises(SnapshotError, match="more than 3 entries"):
        for start in range(0, len(data), 16):
            reader.feed(data[start : start + 16])
    assert len(reader.entries) == 3


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        (["a" * 4096], "4096 bytes long"),
        (["d/" + "n" * 256], "longer than the 255 bytes"),
        (["d/" * 257 + "f"], "257 directories deep: at most 256"),
        (["a", "a-b", "a/c"], "path 'a/c': below the file 'a'"),
        (["x/a", "x/a/b/c"], "path 'x/a/b/c': below the file 'x/a'"),
        ([f"d{n}/e/f" for n in range(6)], "makes 12 directories: at most 10"),
    ],
)
def test_limits_and_nesting_are_refused_naming_them(paths, message):
    with pytest.raises(SnapshotError, match=message):
        read_file_list(body(paths), PathLimits(entries=10))


def test_shared_directories_count_once():
    check_files(
        [dict_entry(path) for path in ["a/b/c", "a/b/d", "a/e", "f", "g/h"]],
        PathLimits(entries=5),
    )  # a, a/b and g: 3 directories; 5 files
    with pytest.raises(SnapshotError, match="makes 3 directories: at most 2"):
        check_files([dict_entry(path) for path in ["a/b/c", "g/h"]], PathLimits(entries=2))


def dict_entry(path: str):
    return read_file_list(body([path]))[0]


def test_the_declared_sizes_of_a_sparse_member_count():
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("holes.bin")
        info.pax_headers = {"GNU.sparse.map": f"{1 << 30},0", "GNU.sparse.size": str(1 << 30)}
        tar.addfile(info, io.BytesIO(b""))
    archive = io.BytesIO(buffer.getvalue())
    assert declared_bytes(archive, 1 << 31) == 1 << 30
    assert archive.tell() == 0
    with pytest.raises(UploadTooLarge, match="max_upload_bytes"):
        declared_bytes(archive, 1 << 20)
    assert archive.tell() == 0
