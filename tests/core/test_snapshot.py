"""Snapshots: the path checks against hostile file lists (property tests), the tree hash, and
assembling and uploading snapshots into a real store directory."""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import tarfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simrun_core.snapshot import (
    FileEntry,
    MissingContent,
    Scan,
    SnapshotError,
    check_files,
    check_name,
    check_scan,
    manifest_path,
    tree_hash,
)
from simrun_core.snapshot_store import assemble, latest, missing, remove_leftovers, upload

COMMIT = "a" * 40


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def regular(path: str, data: bytes = b"x", mode: int = 0o444) -> FileEntry:
    return FileEntry(path=path, mode=mode, sha256=sha(data))


# -- the checks -----------------------------------------------------------------------------------

HOSTILE_PATHS = [
    "/etc/passwd",
    "../up",
    "a/../../up",
    "a/..",
    ".git/config",
    "a/.git/hooks/pre-commit",
    "a/.GIT/x",
    "a\0b",
    "",
    "./a",
    "a//b",
    "a/",
    "a/./b",
    "a\\b",
]


@pytest.mark.parametrize("path", HOSTILE_PATHS)
def test_a_path_that_could_escape_is_refused_naming_it(path: str) -> None:
    with pytest.raises(SnapshotError, match="path"):
        check_files([regular(path)])


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (regular("a", mode=0o644), "more than read and execute"),
        (regular("a", mode=0o4555), "more than read and execute"),
        (regular("a", mode=0o1444), "more than read and execute"),
        (FileEntry(path="a", mode=0o444), "either a sha256 or a link"),
        (FileEntry(path="a", mode=0o444, sha256="00", link="b"), "either a sha256 or a link"),
        (FileEntry(path="a", mode=0o444, sha256="nothex"), "no hex digest"),
        (FileEntry(path="a", mode=0o555, link="/etc"), "absolute target"),
        (FileEntry(path="a/b", mode=0o555, link="../../etc"), "leaves the tree"),
        (FileEntry(path="a", mode=0o555, link=".git/config"), "in '.git'"),
    ],
)
def test_an_entry_a_snapshot_cannot_hold_is_refused(entry: FileEntry, why: str) -> None:
    with pytest.raises(SnapshotError, match=why):
        check_files([entry])


def test_duplicates_and_files_below_files_are_refused() -> None:
    with pytest.raises(SnapshotError, match="listed twice"):
        check_files([regular("a"), regular("a")])
    with pytest.raises(SnapshotError, match="below the file 'a'"):
        check_files([regular("a"), regular("a/b")])


def test_a_link_inside_the_tree_is_accepted() -> None:
    check_files([regular("a/b"), FileEntry(path="a/c", mode=0o555, link="../a/b")])


_SEGMENT = st.sampled_from(["a", "b", "..", ".", ".git", "", "c d", "/", "\0", "x\\y", "..."])


@given(st.lists(st.lists(_SEGMENT, min_size=1, max_size=5).map("/".join), max_size=6))
def test_an_accepted_file_list_never_leaves_the_tree(paths: list[str]) -> None:
    files = [regular(path) for path in paths]
    try:
        check_files(files)
    except SnapshotError:
        return
    root = "/root/tree"
    for entry in files:
        joined = posixpath.normpath(posixpath.join(root, entry.path))
        assert joined.startswith(root + "/"), entry.path
        assert ".git" not in entry.path.split("/")
        assert "\0" not in entry.path
    assert len({entry.path for entry in files}) == len(files)


@given(
    st.text(alphabet="ab./", min_size=1, max_size=6),
    st.text(alphabet="ab./", min_size=1, max_size=12),
)
def test_an_accepted_link_resolves_inside_the_tree(path: str, target: str) -> None:
    try:
        check_files([FileEntry(path=path, mode=0o555, link=target)])
    except SnapshotError:
        return
    root = "/root/tree"
    resolved = posixpath.normpath(posixpath.join(root, posixpath.dirname(path), target))
    assert resolved == root or resolved.startswith(root + "/"), (path, target)


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a/b", "a b", "..", "é"])
def test_a_source_name_that_is_no_directory_name_is_refused(name: str) -> None:
    with pytest.raises(SnapshotError, match="source name"):
        check_name(name)


def test_a_scan_with_a_bad_commit_or_directory_is_refused() -> None:
    files = [regular("src/a.py")]
    check_scan(Scan(branch="main", commit=COMMIT, dirty=False, files=files, dirs={"src": 0o755}))
    with pytest.raises(SnapshotError, match="commit"):
        check_scan(Scan(branch="main", commit="HEAD", dirty=False, files=files))
    with pytest.raises(SnapshotError, match="holds no file"):
        check_scan(Scan(branch=None, commit=COMMIT, dirty=False, files=files, dirs={"lib": 0o755}))
    with pytest.raises(SnapshotError, match="beyond permissions"):
        check_scan(Scan(branch=None, commit=COMMIT, dirty=False, files=files, dirs={"src": 0o4755}))


def test_the_tree_hash_follows_paths_modes_and_contents_not_the_order() -> None:
    a, b = regular("a", b"1"), regular("b", b"2")
    assert tree_hash([a, b]) == tree_hash([b, a])
    assert tree_hash([a, b]) != tree_hash([a, regular("b", b"3")])
    assert tree_hash([a]) != tree_hash([regular("a", b"1", mode=0o555)])
    assert tree_hash([a]) != tree_hash([regular("c", b"1")])
    assert tree_hash([a]) != tree_hash([FileEntry(path="a", mode=0o444, link=sha(b"1"))])


# -- the store ------------------------------------------------------------------------------------


def scan_of(contents: dict[str, bytes], patch: bytes = b"") -> Scan:
    files = [regular(path, data) for path, data in contents.items()]
    return Scan(branch="main", commit=COMMIT, dirty=bool(patch), patch=patch, files=files)


def test_a_snapshot_is_named_by_its_content_read_only_with_a_manifest(tmp_path: Path) -> None:
    store = tmp_path / "store"
    contents = {"model.py": b"VALUE = 1\n", "data/values.txt": b"1 2 3\n"}
    source = assemble(store, "model", scan_of(contents, b"diff"), contents.__getitem__)
    snapshot = store / source.snapshot
    assert snapshot.name == tree_hash(scan_of(contents).files) == source.diff_sha256
    assert (snapshot / "model.py").read_bytes() == b"VALUE = 1\n"
    assert os.stat(snapshot / "model.py").st_mode & 0o777 == 0o444
    assert manifest_path(snapshot).exists()
    assert (store / source.patch).read_bytes() == b"diff"
    assert latest(store, "model")[0] == snapshot
    assert sorted(os.listdir(snapshot.parent)) == sorted(
        [snapshot.name, snapshot.name + ".files.json", ".latest", "patches"]
    )


def test_unchanged_contents_are_hard_links_to_the_latest_snapshot(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first = {"a.py": b"a", "b.py": b"b"}
    one = store / assemble(store, "model", scan_of(first), first.__getitem__).snapshot
    second = {"a.py": b"a", "b.py": b"changed"}
    asked: list[str] = []

    def content(path: str) -> bytes:
        asked.append(path)
        return second[path]

    two = store / assemble(store, "model", scan_of(second), content).snapshot
    assert asked == ["b.py"]
    assert os.stat(one / "a.py").st_ino == os.stat(two / "a.py").st_ino
    assert os.stat(one / "b.py").st_ino != os.stat(two / "b.py").st_ino
    assert missing(store, "model", scan_of({"a.py": b"a", "c.py": b"changed"}).files) == []
    assert missing(store, "model", scan_of({"d.py": b"new"}).files) == ["d.py"]


def test_the_same_tree_twice_is_the_same_snapshot(tmp_path: Path) -> None:
    store = tmp_path / "store"
    contents = {"a.py": b"a"}
    one = assemble(store, "model", scan_of(contents), contents.__getitem__)
    two = assemble(store, "model", scan_of(contents), lambda path: pytest.fail(path))
    assert one.snapshot == two.snapshot
    assert [p.name for p in (store / "snapshots" / "model").iterdir() if p.name[0] == "."] == [
        ".latest"
    ]


def tar_of(members: dict[str, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def test_an_upload_writes_the_same_snapshot_as_the_files(tmp_path: Path) -> None:
    contents = {"model.py": b"VALUE = 1\n", "lib/x.py": b"x"}
    local = assemble(tmp_path / "one", "model", scan_of(contents), contents.__getitem__)
    uploaded = upload(tmp_path / "two", "model", scan_of(contents), tar_of(contents))
    assert local.snapshot == uploaded.snapshot
    assert (tmp_path / "two" / uploaded.snapshot / "lib" / "x.py").read_bytes() == b"x"


def test_an_upload_refuses_every_bad_member_and_leaves_nothing(tmp_path: Path) -> None:
    store = tmp_path / "store"
    contents = {"a.py": b"a", "b.py": b"b"}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in [("a.py", b"a"), ("a.py", b"a"), ("b.py", b"not b"), ("c.py", b"c")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("l")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    buffer.seek(0)
    with pytest.raises(SnapshotError) as refused:
        upload(store, "model", scan_of(contents), buffer)
    message = str(refused.value)
    for why in (
        "'a.py': sent twice",
        "'b.py': its content does not match",
        "'c.py': not a regular file of the scan",
        "'l': not a regular file",
    ):
        assert why in message, message
    assert [p.name for p in (store / "snapshots" / "model").iterdir()] == []


def test_an_upload_lacking_a_content_the_store_lost_is_missing_content(tmp_path: Path) -> None:
    store = tmp_path / "store"
    contents = {"a.py": b"a", "b.py": b"b"}
    with pytest.raises(MissingContent, match=r"'b\.py'"):
        upload(store, "model", scan_of(contents), tar_of({"a.py": b"a"}))
    assert [p.name for p in (store / "snapshots" / "model").iterdir()] == []


def test_a_tar_that_cannot_be_read_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="no readable tar"):
        upload(tmp_path, "model", scan_of({"a.py": b"a"}), io.BytesIO(b"not a tar" * 100))


def test_leftovers_of_a_killed_assembly_are_removed(tmp_path: Path) -> None:
    store = tmp_path / "store"
    (store / "snapshots" / "model" / ".tmp-x1" / "a").mkdir(parents=True)
    (store / "snapshots" / "model" / ".upload-y2").mkdir()
    assert remove_leftovers(store) == 2
    assert list((store / "snapshots" / "model").iterdir()) == []
