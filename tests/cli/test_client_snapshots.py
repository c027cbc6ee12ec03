"""Snapshots of sources from real git repositories: the scan of a working tree, the snapshot a
client writes into a store, and who snapshots when against the real local service (`--local
--snapshot` through the `simrun` command, an upload of a client without the store mounted)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import msgspec
import pytest
from cli_helpers import cli_env, git, run_simrun, write_squares

from simrun_cli.client import Client, ServiceError
from simrun_cli.local import read_service, stop_local
from simrun_cli.provenance import SourceError, git_provenance, scan
from simrun_cli.snapshots import (
    ATTEMPTS,
    PROVENANCE,
    SourcePolicy,
    local_store,
    prepare_sources,
    record_sources,
    snapshot_source,
    source_policy,
    upload_source,
    write_tar,
)
from simrun_core.provenance import SourceProvenance
from simrun_core.snapshot import FileEntry, Scan, manifest_path
from simrun_core.wire import RunView


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_repo(path: Path) -> Path:
    """A repository on `main`: `model.py`, an executable `bin/run.sh`, `data/values.txt`, a
    link `latest -> data/values.txt`, a `.gitignore` of `*.log`; committed."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "model.py").write_text("VALUE = 1\n")
    (path / "bin").mkdir()
    (path / "bin" / "run.sh").write_text("#!/bin/sh\necho run\n")
    (path / "bin" / "run.sh").chmod(0o755)
    (path / "data").mkdir()
    (path / "data" / "values.txt").write_text("1 2 3\n")
    (path / "latest").symlink_to("data/values.txt")
    (path / ".gitignore").write_text("*.log\n")
    git(path, "add", ".")
    git(path, "commit", "-q", "-m", "first")
    return path


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "model")


def inodes(snapshot: Path) -> dict[str, int]:
    """The inode of every regular file below a snapshot, by its path."""
    return {
        str(file.relative_to(snapshot)): file.lstat().st_ino
        for file in snapshot.rglob("*")
        if file.is_file() and not file.is_symlink()
    }


# -- the scan ------------------------------------------------------------------------------------


def test_a_scan_lists_tracked_and_untracked_files_with_modes_and_links(repo: Path) -> None:
    (repo / "notes.txt").write_text("untracked\n")
    (repo / "run.log").write_text("ignored\n")
    found = scan(repo, "model")
    by_path = {entry.path: entry for entry in found.files}
    assert set(by_path) == {
        ".gitignore",
        "bin/run.sh",
        "data/values.txt",
        "latest",
        "model.py",
        "notes.txt",
    }
    assert by_path["model.py"] == FileEntry(
        path="model.py", mode=0o444, sha256=sha256(b"VALUE = 1\n")
    )
    assert by_path["bin/run.sh"].mode == 0o555
    assert by_path["latest"] == FileEntry(path="latest", mode=0o555, link="data/values.txt")
    assert by_path["notes.txt"].sha256 == sha256(b"untracked\n")
    assert found.branch == "main" and found.commit == git(repo, "rev-parse", "HEAD")
    assert found.dirty and found.changed_files == ["?? notes.txt"]
    assert found.patch == b"", "an untracked file is no change of the diff"


def test_a_scan_keeps_the_modes_of_the_directories_that_hold_files(repo: Path) -> None:
    (repo / "data").chmod(0o2750)
    (repo / "empty").mkdir()
    found = scan(repo, "model")
    assert found.dirs == {"bin": 0o755, "data": 0o2750}


def test_a_scan_leaves_out_submodules_and_nested_repositories(tmp_path: Path, repo: Path) -> None:
    library = make_repo(tmp_path / "library")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(library), "lib")
    git(repo, "commit", "-q", "-m", "submodule")
    nested = repo / "vendor" / "nested"
    nested.mkdir(parents=True)
    git(nested, "init", "-q")
    (nested / "inner.py").write_text("x\n")
    paths = [entry.path for entry in scan(repo, "model").files]
    assert ".gitmodules" in paths
    assert not any(path == "lib" or path.startswith(("lib/", "vendor/")) for path in paths)


def test_a_tracked_file_that_is_gone_is_left_out(repo: Path) -> None:
    (repo / "data" / "values.txt").unlink()
    found = scan(repo, "model")
    assert "data/values.txt" not in [entry.path for entry in found.files]
    assert found.changed_files == ["D data/values.txt"]
    assert "data" not in found.dirs, "it holds no file any more"


def test_an_unmerged_path_is_listed_once(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "other")
    (repo / "model.py").write_text("VALUE = 'other'\n")
    git(repo, "commit", "-q", "-am", "other")
    git(repo, "checkout", "-q", "main")
    (repo / "model.py").write_text("VALUE = 'main'\n")
    git(repo, "commit", "-q", "-am", "main")
    merge = subprocess.run(["git", "merge", "-q", "other"], cwd=repo, capture_output=True)
    assert merge.returncode != 0, "a conflict"
    found = scan(repo, "model")
    assert [entry.path for entry in found.files].count("model.py") == 1
    assert found.changed_files == ["UU model.py"]


def test_the_patch_turns_the_commit_into_the_working_tree(repo: Path, tmp_path: Path) -> None:
    (repo / "model.py").write_text("VALUE = 2\n")
    (repo / "data" / "blob.bin").write_bytes(bytes(range(256)))
    git(repo, "add", "data/blob.bin")
    found = scan(repo, "model")
    assert found.changed_files == ["A data/blob.bin", "M model.py"]
    assert b"GIT binary patch" in found.patch
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    subprocess.run(["git", "apply", "-"], cwd=clone, input=found.patch, check=True)
    assert (clone / "model.py").read_text() == "VALUE = 2\n"
    assert (clone / "data" / "blob.bin").read_bytes() == bytes(range(256))


def test_a_repository_without_a_commit_is_recorded_but_not_snapshotted(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "a.txt").write_text("a\n")
    with pytest.raises(SourceError, match=rf"source 'model': {tmp_path} has no commit yet"):
        scan(tmp_path, "model")
    policy = SourcePolicy("store", tmp_path / "store")
    with pytest.raises(SourceError, match="has no commit yet"):
        prepare_sources([("model", tmp_path)], policy)
    [recorded] = record_sources([("model", tmp_path)], PROVENANCE)
    assert recorded.commit is None and recorded.path == str(tmp_path)


def test_a_tree_a_snapshot_cannot_hold_is_refused_naming_the_source(repo: Path) -> None:
    (repo / "out").symlink_to("/etc")
    policy = SourcePolicy("store", repo.parent / "store")
    with pytest.raises(SourceError, match=r"source 'model': .*model: link 'out'"):
        prepare_sources([("model", repo)], policy)
    with pytest.raises(SourceError, match="source name"):
        prepare_sources([("no/name", repo)], policy)
    [recorded] = prepare_sources([("model", repo)], PROVENANCE)
    assert recorded.provenance is not None, "provenance only needs no snapshot"


# -- who snapshots when --------------------------------------------------------------------------


def test_the_policy_follows_the_mode_the_flag_and_the_mounted_store(tmp_path: Path) -> None:
    assert source_policy(tmp_path) == PROVENANCE
    assert source_policy(tmp_path, snapshot=True) == SourcePolicy(
        "store", tmp_path.resolve() / ".simrun" / "store"
    )
    mounted = {"SIMRUN_STORE": str(tmp_path)}
    assert source_policy(tmp_path, environ=mounted) == PROVENANCE, "--local ignores it"
    assert source_policy(None, environ=mounted) == SourcePolicy("store", tmp_path.resolve())
    assert source_policy(None, snapshot=True, environ=mounted).mode == "store"
    assert source_policy(None, environ={}) == SourcePolicy("upload")
    assert source_policy(None, environ={"SIMRUN_STORE": "  "}) == SourcePolicy("upload")


# -- snapshots written by a client with the store ------------------------------------------------


def test_a_snapshot_holds_the_tree_read_only_with_its_patch(repo: Path, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (repo / "model.py").write_text("VALUE = 2\n")
    (repo / "notes.txt").write_text("new\n")
    (repo / "run.log").write_text("ignored\n")
    source = snapshot_source("model", repo, store)
    assert source.path is None and source.snapshot and source.patch
    assert source.changed == ["M model.py", "?? notes.txt"]
    snapshot = store / source.snapshot
    assert snapshot.name == source.diff_sha256 == git_provenance("model", repo).diff_sha256
    assert (snapshot / "model.py").read_text() == "VALUE = 2\n"
    assert (snapshot / "notes.txt").read_text() == "new\n"
    assert not (snapshot / "run.log").exists()
    assert os.readlink(snapshot / "latest") == "data/values.txt"
    assert stat.S_IMODE((snapshot / "bin" / "run.sh").stat().st_mode) == 0o555
    assert stat.S_IMODE((snapshot / "model.py").stat().st_mode) == 0o444
    patch = (store / source.patch).read_bytes()
    assert (
        patch
        == subprocess.run(
            ["git", "diff", "HEAD", "--binary"], cwd=repo, capture_output=True, check=True
        ).stdout
    )
    assert manifest_path(snapshot).exists()


def test_an_unchanged_tree_writes_no_content_and_a_change_only_its_file(
    repo: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    first = snapshot_source("model", repo, store)
    before = inodes(store / first.snapshot)
    again = snapshot_source("model", repo, store)
    assert again == first
    assert inodes(store / again.snapshot) == before
    assert len([p for p in (store / "snapshots" / "model").iterdir() if len(p.name) == 64]) == 1

    (repo / "model.py").write_text("VALUE = 3\n")
    changed = snapshot_source("model", repo, store)
    assert changed.snapshot != first.snapshot
    after = inodes(store / changed.snapshot)
    assert after["model.py"] != before["model.py"]
    assert {p: n for p, n in after.items() if p != "model.py"} == {
        p: n for p, n in before.items() if p != "model.py"
    }, "hard links to the snapshot before"


# -- against the real local service --------------------------------------------------------------


class Project:
    """A project directory with a local service and a model repository with a change."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.model = root / "model"
        self.store = local_store(root)

    def simrun(self, *args: str, env: dict[str, str] | None = None) -> str:
        result = run_simrun(*args, cwd=self.root, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    def submit(self, *args: str, env: dict[str, str] | None = None) -> RunView:
        out = self.simrun("submit", "squares.yaml", "--no-wait", "--json", *args, env=env)
        run = msgspec.json.decode(out, type=RunView)
        self.wait(run.id)
        return run

    def wait(self, run_id: str) -> None:
        """Wait for the end of a run, whichever: what it records is its submission (how a run
        with snapshots runs is the matter of the local environment's tests)."""
        ended = run_simrun("wait", run_id, "--local", cwd=self.root)
        assert ended.returncode in (0, 1), ended.stdout + ended.stderr

    def client(self) -> Client:
        """A client of the project's local service, started when no earlier test started it
        (the tests of a module may run in any order, or in other workers)."""
        info = read_service(self.root)
        if info is None:
            self.simrun("list", "--local")
            info = read_service(self.root)
        assert info is not None
        return Client(info.url, info.token)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    found = Project(tmp_path_factory.mktemp("snapshots"))
    make_repo(found.model)
    (found.model / "model.py").write_text("VALUE = 2\n")
    write_squares(found.root, n=4)
    try:
        yield found
    finally:
        stop_local(found.root, timeout_s=60)


def test_submit_local_snapshot_records_the_snapshot_and_the_patch(project: Project) -> None:
    run = project.submit("--local", "--snapshot", "--source", "model=model")
    [source] = run.sources
    assert source.name == "model" and source.path is None
    assert source.branch == "main" and source.commit == git(project.model, "rev-parse", "HEAD")
    assert source.dirty and source.changed == ["M model.py"]
    assert source.snapshot == f"snapshots/model/{source.diff_sha256}"
    snapshot = project.store / source.snapshot
    assert (snapshot / "model.py").read_text() == "VALUE = 2\n"
    assert source.patch is not None
    patch = (project.store / source.patch).read_text()
    assert "-VALUE = 1\n+VALUE = 2\n" in patch
    status = project.simrun("status", run.id, "--local")
    line = next(line for line in status.splitlines() if line.startswith("source model"))
    commit = source.commit[:10]
    assert f"snapshot {source.diff_sha256[:12]} @ main {commit} +1 changed" in line


def test_submitting_the_unchanged_tree_again_writes_no_file(project: Project) -> None:
    first = project.submit("--local", "--snapshot", "--source", "model=model").sources[0]
    before = inodes(project.store / first.snapshot)
    again = project.submit("--local", "--snapshot", "--source", "model=model").sources[0]
    assert again.snapshot == first.snapshot and again.patch == first.patch
    assert inodes(project.store / again.snapshot) == before


def test_submit_local_without_snapshot_records_the_working_tree(project: Project) -> None:
    snapshotted = project.submit("--local", "--snapshot", "--source", "model=model").sources[0]
    [source] = project.submit("--local", "--source", "model=model").sources
    assert source.path == str(project.model) and source.snapshot is None and source.patch is None
    assert source.changed == ["M model.py"]
    assert source.diff_sha256 == snapshotted.diff_sha256, "the hash its snapshot has"


def test_estimate_takes_snapshot_too(project: Project) -> None:
    out = project.simrun(
        "estimate", "squares.yaml", "--local", "--snapshot", "--source", "model=model", "--json"
    )
    assert json.loads(out)["squares"]["plan"]["units"] == 4


class Recording:
    """A client that notes what `missing` answered and how many files each tar held."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.missing: list[list[str]] = []
        self.members: list[int] = []

    def snapshot_missing(self, name: str, files: list[FileEntry]) -> list[str]:
        found = self.client.snapshot_missing(name, files)
        self.missing.append(found)
        return found

    def upload_snapshot(self, name: str, scanned: Scan, archive: IO[bytes]) -> SourceProvenance:
        start = archive.tell()
        with tarfile.open(fileobj=archive, mode="r") as tar:
            self.members.append(len(tar.getmembers()))
        archive.seek(start)
        return self.client.upload_snapshot(name, scanned, archive)


def test_an_upload_sends_only_what_the_store_lacks(project: Project, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "uploaded")
    (repo / "model.py").write_text("VALUE = 7\n")
    with project.client() as client:
        recording = Recording(client)
        first = upload_source(recording, "uploaded", repo)
        regular = [entry.path for entry in scan(repo, "uploaded").files if entry.sha256]
        assert sorted(recording.missing[0]) == sorted(regular)
        assert recording.members == [len(regular)]
        assert first.snapshot == f"snapshots/uploaded/{first.diff_sha256}"
        assert first.changed == ["M model.py"] and first.patch
        snapshot = project.store / first.snapshot
        assert (snapshot / "model.py").read_text() == "VALUE = 7\n"
        before = inodes(snapshot)

        again = upload_source(recording, "uploaded", repo)
        assert recording.missing[1] == [] and recording.members[1] == 0, "no file sent"
        assert again.snapshot == first.snapshot
        assert inodes(project.store / again.snapshot) == before

        (repo / "data" / "values.txt").write_text("4 5 6\n")
        upload_source(recording, "uploaded", repo)
        assert recording.missing[2] == ["data/values.txt"] and recording.members[2] == 1


def test_a_client_of_a_service_snapshots_every_source(project: Project, tmp_path: Path) -> None:
    """Without --local: no SIMRUN_STORE uploads the snapshot, SIMRUN_STORE writes it there."""
    info = read_service(project.root)
    assert info is not None
    service = cli_env(SIMRUN_URL=info.url, SIMRUN_TOKEN=info.token)
    submit = ("submit", "squares.yaml", "--json", "--source", "model=model")
    first = msgspec.json.decode(project.simrun(*submit, env=service), type=RunView)
    [uploaded] = first.sources
    assert uploaded.snapshot and uploaded.path is None
    assert (project.store / uploaded.snapshot / "model.py").read_text() == "VALUE = 2\n"

    mounted = tmp_path / "mounted"
    mounted.mkdir()
    env = {**service, "SIMRUN_STORE": str(mounted)}
    second = msgspec.json.decode(project.simrun(*submit, env=env), type=RunView)
    [written] = second.sources
    assert written.snapshot == uploaded.snapshot
    assert (mounted / written.snapshot / "model.py").read_text() == "VALUE = 2\n"
    for run in (first, second):
        project.wait(run.id)


def test_a_refused_source_is_named_before_anything_is_sent(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "a.txt").write_text("a\n")
    write_squares(tmp_path)
    args = ("submit", "squares.yaml", "--local", "--snapshot", "--source", "model=.")
    result = run_simrun(*args, cwd=tmp_path)
    assert result.returncode == 1
    assert f"source 'model': {tmp_path} has no commit yet" in result.stderr
    assert not (tmp_path / ".simrun").exists()


class LosingTheLatest(Recording):
    """A client whose store loses the latest snapshot's manifest right after the first answer
    of `missing` (as a removal by the service does): the upload lacks content, 409."""

    def __init__(self, client: Client, store: Path, name: str) -> None:
        super().__init__(client)
        self.store = store
        self.name = name

    def snapshot_missing(self, name: str, files: list[FileEntry]) -> list[str]:
        found = super().snapshot_missing(name, files)
        if len(self.missing) == 1:
            latest = (self.store / "snapshots" / self.name / ".latest").read_text().strip()
            manifest_path(self.store / "snapshots" / self.name / latest).unlink()
        return found


def test_an_upload_the_store_changed_under_asks_again(project: Project, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "lost")
    with project.client() as client:
        first = upload_source(client, "lost", repo)
        losing = LosingTheLatest(client, project.store, "lost")
        again = upload_source(losing, "lost", repo)
    assert losing.missing[0] == [], "the store had every content"
    assert len(losing.missing) == 2 and losing.missing[1], "asked again after the 409"
    assert again.snapshot == first.snapshot


class Conflicting(Recording):
    """A client whose every upload is answered 409."""

    def upload_snapshot(self, name: str, scanned: Scan, archive: IO[bytes]) -> SourceProvenance:
        self.members.append(0)
        raise ServiceError(409, "the latest snapshot changed")


def test_an_upload_that_keeps_conflicting_fails_naming_the_source(
    project: Project, repo: Path
) -> None:
    with project.client() as client:
        conflicting = Conflicting(client)
        with pytest.raises(ServiceError, match=r"source 'model' \(.*model\): its snapshot was not"):
            upload_source(conflicting, "model", repo)
    assert len(conflicting.missing) == ATTEMPTS


def test_a_file_changed_since_the_scan_is_scanned_again(project: Project, repo: Path) -> None:
    stale = scan(repo, "changing")
    (repo / "model.py").write_text("VALUE = 'later'\n")
    with tempfile.TemporaryFile() as archive:
        assert not write_tar(archive, repo, stale, ["model.py"]), "not the content scanned"
    with project.client() as client:
        recording = Recording(client)
        source = upload_source(recording, "changing", repo, stale)
    assert len(recording.missing) == 2 and len(recording.members) == 1
    assert (project.store / source.snapshot / "model.py").read_text() == "VALUE = 'later'\n"
