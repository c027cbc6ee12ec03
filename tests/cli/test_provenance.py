"""The git provenance of a source, read from real repositories: the changed files as porcelain
status lines, `diff_sha256` the tree hash a snapshot of the tree would have."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cli_helpers import git

from simrun_cli.provenance import (
    SourceError,
    git_provenance,
    parse_source,
    scan,
    source_provenances,
)
from simrun_core.snapshot import FileEntry, tree_hash


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository on branch `main` with one commit of `model.py` and `data/values.txt`."""
    path = tmp_path / "model"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "model.py").write_text("VALUE = 1\n")
    (path / "data").mkdir()
    (path / "data" / "values.txt").write_text("1 2 3\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "first")
    return path


def test_a_clean_tree_has_its_branch_and_commit_and_no_changes(repo: Path) -> None:
    source = git_provenance("model", repo)
    assert source.name == "model"
    assert source.path == str(repo.resolve())
    assert source.branch == "main"
    assert source.commit == git(repo, "rev-parse", "HEAD")
    assert source.dirty is False
    assert source.changed == []
    assert source.snapshot is None and source.patch is None


def test_the_diff_hash_is_the_tree_hash_a_snapshot_would_have(repo: Path) -> None:
    files = [
        FileEntry(path="data/values.txt", mode=0o444, sha256=sha256(b"1 2 3\n")),
        FileEntry(path="model.py", mode=0o444, sha256=sha256(b"VALUE = 1\n")),
    ]
    assert git_provenance("model", repo).diff_sha256 == tree_hash(files)
    assert git_provenance("model", repo).diff_sha256 == tree_hash(scan(repo).files)


def test_a_relative_path_is_recorded_absolute(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo.parent)
    assert git_provenance("model", Path("model")).path == str(repo.resolve())


def test_changes_are_status_lines_and_the_hash_follows_the_tree(repo: Path) -> None:
    clean = git_provenance("model", repo).diff_sha256
    (repo / "model.py").write_text("VALUE = 2\n")
    first = git_provenance("model", repo)
    assert first.dirty is True
    assert first.changed == ["M model.py"]
    assert first.diff_sha256 is not None and len(first.diff_sha256) == 64
    assert first.diff_sha256 != clean

    assert git_provenance("model", repo).diff_sha256 == first.diff_sha256

    (repo / "model.py").write_text("VALUE = 3\n")
    second = git_provenance("model", repo)
    assert second.changed == ["M model.py"]
    assert second.diff_sha256 != first.diff_sha256

    (repo / "model.py").write_text("VALUE = 1\n")
    assert git_provenance("model", repo).diff_sha256 == clean, "the same tree, the same hash"


def test_staged_and_changed_again_keeps_both_letters(repo: Path) -> None:
    (repo / "model.py").write_text("VALUE = 2\n")
    git(repo, "add", "model.py")
    assert git_provenance("model", repo).changed == ["M model.py"]
    (repo / "model.py").write_text("VALUE = 3\n")
    assert git_provenance("model", repo).changed == ["MM model.py"]


def test_untracked_files_are_listed_one_by_one_and_hashed(repo: Path) -> None:
    (repo / "new").mkdir()
    (repo / "new" / "a.txt").write_text("a\n")
    (repo / "new" / "b.txt").write_text("b\n")
    source = git_provenance("model", repo)
    assert source.dirty is True
    assert source.changed == ["?? new/a.txt", "?? new/b.txt"]

    (repo / "new" / "b.txt").write_text("changed\n")
    assert git_provenance("model", repo).diff_sha256 != source.diff_sha256


def test_an_ignored_file_is_no_change_and_not_hashed(repo: Path) -> None:
    (repo / ".gitignore").write_text("*.log\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore")
    before = git_provenance("model", repo)
    (repo / "run.log").write_text("noise\n")
    after = git_provenance("model", repo)
    assert after.changed == [] and after.diff_sha256 == before.diff_sha256


def test_a_mode_change_changes_the_hash(repo: Path) -> None:
    before = git_provenance("model", repo).diff_sha256
    (repo / "model.py").chmod(0o755)
    after = git_provenance("model", repo)
    assert after.changed == ["M model.py"]
    assert after.diff_sha256 != before


def test_staged_deleted_and_renamed_files_are_changes(repo: Path) -> None:
    git(repo, "mv", "model.py", "renamed.py")
    (repo / "data" / "values.txt").unlink()
    source = git_provenance("model", repo)
    assert source.changed == ["D data/values.txt", "R model.py -> renamed.py"]


def test_a_file_with_spaces_keeps_its_name(repo: Path) -> None:
    (repo / "with space.txt").write_text("x\n")
    assert git_provenance("model", repo).changed == ["?? with space.txt"]


def test_a_detached_head_has_no_branch(repo: Path) -> None:
    git(repo, "checkout", "-q", "--detach")
    source = git_provenance("model", repo)
    assert source.branch is None
    assert source.commit == git(repo, "rev-parse", "HEAD")


def test_a_repository_without_commits_has_no_commit(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "a.txt").write_text("a\n")
    source = git_provenance("model", tmp_path)
    assert source.commit is None
    assert source.branch == "main"
    assert source.changed == ["?? a.txt"]
    assert source.diff_sha256 == tree_hash(
        [FileEntry(path="a.txt", mode=0o444, sha256=sha256(b"a\n"))]
    )


def test_a_directory_inside_a_repository_reports_the_repository(repo: Path) -> None:
    (repo / "model.py").write_text("VALUE = 5\n")
    source = git_provenance("data", repo / "data")
    assert source.path == str((repo / "data").resolve())
    assert source.commit == git(repo, "rev-parse", "HEAD")
    assert source.changed == ["M model.py"], "the state of the repository"
    only = [FileEntry(path="values.txt", mode=0o444, sha256=sha256(b"1 2 3\n"))]
    assert source.diff_sha256 == tree_hash(only), "the files of the directory"


def test_a_directory_outside_git_is_named(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(SourceError, match=r"source 'lib': .*plain is no git working tree"):
        git_provenance("lib", plain)


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"source 'lib': .*missing is no directory"):
        git_provenance("lib", tmp_path / "missing")


def test_parse_source_splits_name_and_path() -> None:
    assert parse_source("model=.") == ("model", Path("."))
    assert parse_source("lib=~/git/lib") == ("lib", Path.home() / "git" / "lib")
    assert parse_source("a=b=c") == ("a", Path("b=c"))
    for bad in ("model", "=path", "model=", " = "):
        with pytest.raises(SourceError, match="NAME=PATH"):
            parse_source(bad)


def test_a_source_name_is_given_once(repo: Path) -> None:
    [source] = source_provenances([f"model={repo}"])
    assert source.name == "model"
    with pytest.raises(SourceError, match="'model' is given twice"):
        source_provenances([f"model={repo}", f"model={repo}"])
