"""Writing snapshots into the store: from files on the machine of the store (`assemble`), or from
a scan and a tar of the contents the store lacks (`upload`). Shared by a client with the store
mounted and by the service.

A snapshot is assembled in a directory of its own beside the snapshots of its name (`.tmp-*`),
its files hard links to the latest snapshot of the name where it has their content with the same
mode (else copies), its directories given the modes of the scan, then renamed into place under
its tree hash; one that exists already is kept. Nothing half-written is ever under a snapshot's
name: a refusal removes what it wrote, and what a killed process left (`.tmp-*`, `.upload-*`)
is removed by `remove_leftovers`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Final

from simrun_core.provenance import SourceProvenance
from simrun_core.snapshot import (
    DEFAULT_LIMITS,
    LATEST,
    OWNER_BITS,
    STORED_DIRECTORY_BITS,
    FileEntry,
    MissingContent,
    PathLimits,
    Scan,
    SnapshotError,
    check_files,
    check_name,
    check_scan,
    decode_manifest,
    encode_manifest,
    is_snapshot_name,
    manifest_path,
    patch_path,
    snapshot_dir,
    snapshots_dir,
    tree_hash,
)
from simrun_core.store import write_atomic

ASSEMBLING: Final = ".tmp-"
UPLOADING: Final = ".upload-"
CHUNK: Final = 1 << 20

Content = Callable[[str], Path | bytes]
"""The content of a path of a scan: the file to copy (or move) or the bytes; FileNotFoundError
leaves the path out, MissingContent refuses the snapshot."""


def latest(store: Path, name: str) -> tuple[Path, list[FileEntry]] | None:
    """The latest snapshot of a source with its files, None when there is none (or its
    manifest cannot be read: then nothing is linked to it)."""
    base = snapshots_dir(store, name)
    try:
        digest = (base / LATEST).read_text().strip()
    except OSError:
        return None
    if not is_snapshot_name(digest):
        return None
    snapshot = base / digest
    try:
        return snapshot, decode_manifest(manifest_path(snapshot).read_bytes())
    except (OSError, SnapshotError):
        return None


def missing(
    store: Path, name: str, files: list[FileEntry], limits: PathLimits = DEFAULT_LIMITS
) -> list[str]:
    """The paths of the regular files whose content the latest snapshot of a source lacks (all
    of them without one); SnapshotError for a name or a file list that is refused."""
    check_name(name)
    check_files(files, limits)
    return lacking(store, name, files)


def lacking(store: Path, name: str, files: list[FileEntry]) -> list[str]:
    """`missing` of a name and a file list checked already."""
    found = latest(store, name)
    have = {entry.sha256 for entry in found[1] if entry.sha256} if found else set()
    return [entry.path for entry in files if entry.sha256 and entry.sha256 not in have]


def assemble(
    store: Path,
    name: str,
    scan: Scan,
    files: Content,
    *,
    move: bool = False,
    limits: PathLimits = DEFAULT_LIMITS,
) -> SourceProvenance:
    """Write a scanned tree into `snapshots/<name>/` and return its provenance.

    The files whose content the latest snapshot has (with the same mode) are hard links to it,
    the others come from `files`; with `move` a file given is renamed into the snapshot (its
    content trusted to have the hash of the scan). A file that is gone is left out, and the
    snapshot is named by what it holds. SnapshotError for a scan that is refused;
    MissingContent when `files` raises it.
    """
    check_name(name)
    check_scan(scan, limits)
    base = snapshots_dir(store, name)
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=ASSEMBLING, dir=base))
    try:
        written = _write_tree(work, scan, files, move, latest(store, name))
        digest = tree_hash(written)
        target = snapshot_dir(store, name, digest)
        write_atomic(manifest_path(target), encode_manifest(written), 0o444)
        try:
            work.rename(target)
        except OSError:
            if not target.is_dir():
                raise
        write_atomic(base / LATEST, digest.encode() + b"\n")
    finally:
        _remove(work)
    patch = None
    if scan.patch:
        kept = patch_path(store, name, scan.patch)
        if not kept.exists():
            kept.parent.mkdir(exist_ok=True)
            write_atomic(kept, scan.patch, 0o444)
        patch = str(kept.relative_to(store))
    return SourceProvenance(
        name=name,
        path=None,
        branch=scan.branch,
        commit=scan.commit,
        dirty=scan.dirty,
        changed=list(scan.changed_files),
        diff_sha256=digest,
        snapshot=str(target.relative_to(store)),
        patch=patch,
    )


def _write_tree(
    work: Path,
    scan: Scan,
    files: Content,
    move: bool,
    previous: tuple[Path, list[FileEntry]] | None,
) -> list[FileEntry]:
    """Write the files of a scan below `work`; the entries written."""
    linkable: dict[tuple[str, int], Path] = {}
    if previous is not None:
        for entry in previous[1]:
            if entry.sha256 is not None:
                linkable.setdefault((entry.sha256, entry.mode), previous[0] / entry.path)
    written: list[FileEntry] = []
    for entry in scan.files:
        destination = work / entry.path
        destination.parent.mkdir(parents=True, exist_ok=True)
        if entry.link is not None:
            os.symlink(entry.link, destination)
            written.append(entry)
            continue
        assert entry.sha256 is not None
        source = linkable.get((entry.sha256, entry.mode))
        if source is not None:
            try:
                os.link(source, destination, follow_symlinks=False)
                written.append(entry)
                continue
            except FileNotFoundError:
                pass  # the latest snapshot lost it meanwhile: its content must come from files
        try:
            content = files(entry.path)
        except FileNotFoundError:
            continue
        if isinstance(content, bytes):
            if hashlib.sha256(content).hexdigest() != entry.sha256:
                raise SnapshotError(f"path {entry.path!r}: its content does not match its sha256")
            destination.write_bytes(content)
        elif move:
            os.rename(content, destination)
        else:
            with open(content, "rb") as stream:
                if _copy_hashed(stream, destination) != entry.sha256:
                    raise SnapshotError(f"path {entry.path!r}: changed while it was copied")
        os.chmod(destination, entry.mode)
        written.append(entry)
    _set_directory_modes(work, scan.dirs)
    return written


def _set_directory_modes(work: Path, modes: dict[str, int]) -> None:
    """Give each directory below `work` the mode of the scan (0o755 when it has none), without
    write bits for group and others or special bits (`STORED_DIRECTORY_BITS`), and with the
    owner's bits. Walks the tree made (its memory the depth of a path, not every directory's
    path at once)."""
    top = str(work)
    for directory, _, _ in os.walk(top):
        if directory == top:
            continue
        relative = directory[len(top) + 1 :]
        mode = modes.get(relative, 0o755)
        os.chmod(directory, (mode & STORED_DIRECTORY_BITS) | OWNER_BITS)


class UploadTooLarge(SnapshotError):
    """A tar whose members declare more bytes than the upload may write (`max_bytes`)."""


def declared_bytes(archive: IO[bytes], max_bytes: int) -> int:
    """The bytes the members of a tar declare (of a sparse member its size with the holes: what
    extracting it writes), read from their headers without writing anything; UploadTooLarge as
    soon as they pass `max_bytes`, SnapshotError for a tar that cannot be read. `archive` is
    rewound to its start."""
    total = 0
    try:
        with tarfile.open(fileobj=archive, mode="r|*") as tar:
            for member in tar:
                total += max(0, member.size)
                if total > max_bytes:
                    raise UploadTooLarge(
                        f"the members of the upload's tar declare more than the {max_bytes} "
                        "bytes this service takes (max_upload_bytes); nothing was written"
                    )
    except (tarfile.TarError, EOFError, zlib.error) as error:
        raise SnapshotError(f"the upload is no readable tar: {error}") from None
    finally:
        archive.seek(0)
    return total


def upload(
    store: Path,
    name: str,
    scan: Scan,
    archive: IO[bytes],
    *,
    max_bytes: int | None = None,
    limits: PathLimits = DEFAULT_LIMITS,
) -> SourceProvenance:
    """Write a snapshot from a scan and a tar of the contents the store lacks.

    With `max_bytes` the sizes the members declare count against it before anything is
    written (`declared_bytes`: a small compressed or sparse tar may expand to far more).
    Every member of the tar is a regular file of the scan, sent once, whose content has the
    hash of the scan; it is extracted under a name of its own into `.upload-*` beside the
    snapshots of the name, then renamed into the snapshot. SnapshotError naming every refused
    member (or a tar that cannot be read); MissingContent for a file whose content neither the
    tar nor the latest snapshot has. Nothing of a refused upload stays in the store.
    """
    check_name(name)
    check_scan(scan, limits)
    if max_bytes is not None:
        declared_bytes(archive, max_bytes)
    wanted = {entry.path: entry for entry in scan.files if entry.sha256 is not None}
    base = snapshots_dir(store, name)
    base.mkdir(parents=True, exist_ok=True)
    spool = Path(tempfile.mkdtemp(prefix=UPLOADING, dir=base))
    try:
        extracted = _extract(archive, wanted, spool)

        def content(path: str) -> Path:
            found = extracted.get(path)
            if found is None:
                raise MissingContent(
                    f"path {path!r}: its content is neither in the upload nor in the store; "
                    "ask again which contents are missing"
                )
            return found

        return assemble(store, name, scan, content, move=True, limits=limits)
    finally:
        _remove(spool)


def _extract(archive: IO[bytes], wanted: dict[str, FileEntry], spool: Path) -> dict[str, Path]:
    """The members of a tar, each checked and written to a file of its own in `spool`."""
    extracted: dict[str, Path] = {}
    refused: list[str] = []
    try:
        with tarfile.open(fileobj=archive, mode="r|*") as tar:
            for number, member in enumerate(tar):
                entry = wanted.get(member.name)
                if not member.isfile():
                    refused.append(f"{member.name!r}: not a regular file")
                elif entry is None:
                    refused.append(f"{member.name!r}: not a regular file of the scan")
                elif member.name in extracted:
                    refused.append(f"{member.name!r}: sent twice")
                else:
                    stream = tar.extractfile(member)
                    assert stream is not None
                    file = spool / str(number)
                    if _copy_hashed(stream, file) != entry.sha256:
                        refused.append(f"{member.name!r}: its content does not match its sha256")
                        file.unlink()
                    else:
                        extracted[member.name] = file
    except (tarfile.TarError, EOFError, zlib.error) as error:
        raise SnapshotError(f"the upload is no readable tar: {error}") from None
    if refused:
        raise SnapshotError("refused members of the upload: " + "; ".join(refused))
    return extracted


def _copy_hashed(stream: IO[bytes], file: Path) -> str:
    """Copy a stream into a new file; the sha256 of what was copied."""
    digest = hashlib.sha256()
    with open(file, "xb") as out:
        while chunk := stream.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def remove_leftovers(store: Path) -> int:
    """Remove the assemblies and uploads a killed process left below `snapshots/`; how many."""
    removed = 0
    for leftover in (store / "snapshots").glob(f"*/{ASSEMBLING}*"):
        _remove(leftover)
        removed += 1
    for leftover in (store / "snapshots").glob(f"*/{UPLOADING}*"):
        _remove(leftover)
        removed += 1
    return removed


def remove_snapshot(snapshot: Path) -> None:
    """Remove a snapshot and its manifest (its directories made writable first)."""
    if snapshot.is_dir():
        _remove(snapshot)
    with contextlib.suppress(FileNotFoundError):
        manifest_path(snapshot).unlink()


def _remove(tree: Path) -> None:
    """Remove a tree (its directories all have the owner's write bit, its files need none)."""
    if tree.is_symlink():
        tree.unlink()
    elif tree.exists():
        shutil.rmtree(tree)
