"""Editable installs of snapshots: the writable shadow tree of a read-only snapshot, and the
command of the installer (uv, else pip) that installs shadow trees without their dependencies.

Shared by the harness (a pod installs the snapshots of its run into the python of its image,
`simrun_harness.sources`) and the local backend (a venv per run with snapshots,
`simrun_api.backends.local_env`), which differ in where the build backends may come from: a pod
builds without isolation and without an index (the image has the backends), a local venv with
the installer's defaults (the index, or the installer's cache).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal

from simrun_core.snapshot import is_snapshot_name

Installer = Literal["uv", "pip"]

UV: Final = "uv"
PIP_MODULE: Final = "pip"


def shadow_tree(source: Path, target: Path) -> Path:
    """A writable tree of a read-only one: its directories, links to its files.

    A build backend may write into the tree it builds (a version file, metadata, a build
    directory); it writes into the writable directories of the shadow, and never into the
    source, whose files it can only read through the links. A link (to a file or a directory)
    of the source is the same link in the shadow, and a linked directory is not descended
    into. `target` is replaced when it exists. Returns `target`. OSError when the source
    cannot be read or the shadow cannot be written.
    """
    source = source.resolve(strict=True)
    if not source.is_dir():
        raise NotADirectoryError(f"{source} is no directory to shadow")
    remove_tree(target)
    target.mkdir(parents=True)
    for directory, dirnames, filenames in os.walk(source, followlinks=False, onerror=_raise):
        here = Path(directory)
        there = target / here.relative_to(source)
        for name in list(dirnames):
            if (here / name).is_symlink():
                os.symlink(os.readlink(here / name), there / name)
                dirnames.remove(name)
            else:
                (there / name).mkdir()
        for name in filenames:
            file = here / name
            link = os.readlink(file) if file.is_symlink() else str(file)
            os.symlink(link, there / name)
    return target


def remove_tree(tree: Path) -> None:
    """Remove a tree (a shadow, an environment) if it is there, read-only directories too; a
    link is removed, never followed."""
    if tree.is_symlink() or tree.is_file():
        tree.unlink()
        return
    if not tree.exists():
        return
    for directory, _, _ in os.walk(tree, followlinks=False):
        with contextlib.suppress(OSError):
            os.chmod(directory, stat.S_IMODE(os.lstat(directory).st_mode) | 0o700)
    shutil.rmtree(tree, ignore_errors=True)
    if tree.exists():
        shutil.rmtree(tree)  # what could not be removed, raised now


def shadow_names(snapshots: Sequence[str | Path]) -> list[str]:
    """The directory names of the shadow trees of snapshots, one each and distinct: the
    source's name for a snapshot of the store (`snapshots/<name>/<hash>`), else the
    directory's name, with `-2`, `-3`, ... after a name taken already."""
    names: list[str] = []
    for snapshot in snapshots:
        path = Path(snapshot)
        base = path.parent.name if is_snapshot_name(path.name) and path.parent.name else path.name
        base = base or "source"
        name, number = base, 1
        while name in names:
            number += 1
            name = f"{base}-{number}"
        names.append(name)
    return names


def uv_binary() -> str | None:
    """The uv executable: `uv` on `PATH`, else the one of the `uv` package; None without."""
    found = shutil.which(UV)
    if found:
        return found
    if importlib.util.find_spec("uv") is None:
        return None
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found,unused-ignore]

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        return None


def has_pip() -> bool:
    """Whether pip is importable here (and so by a venv that sees these site directories)."""
    return importlib.util.find_spec(PIP_MODULE) is not None


def installer_command(python: str | Path) -> tuple[Installer, list[str]] | None:
    """The command which installs into the environment of `python`, before its arguments:
    `uv pip install --python PY` when uv is there, else `PY -m pip install`; None without
    either."""
    uv = uv_binary()
    if uv is not None:
        return "uv", [uv, "pip", "install", "--python", str(python)]
    if has_pip():
        return "pip", [str(python), "-m", PIP_MODULE, "install"]
    return None


PROJECT_FILES = ("pyproject.toml", "setup.py", "setup.cfg")
"""The files that make a tree a Python project an installer can install."""


def is_project(tree: Path) -> bool:
    """Whether a tree (a snapshot or its shadow) is a Python project an installer can install;
    one that is not (a model of scripts) is only imported from: its root is on the import
    path."""
    return any((tree / name).is_file() for name in PROJECT_FILES)


def editable_arguments(
    installer: Installer, trees: Sequence[str | Path], *, isolated: bool
) -> list[str]:
    """The arguments after the installer's command that install `trees` editable without
    their dependencies. Not `isolated`: the build backends are those of the environment,
    without build isolation and without an index (uv `--offline`, pip `--no-index`)."""
    arguments = ["--no-deps"]
    if installer == "pip":
        arguments += ["--disable-pip-version-check", "--no-input"]
    if not isolated:
        arguments += ["--no-build-isolation", "--offline" if installer == "uv" else "--no-index"]
    for tree in trees:
        arguments += ["-e", str(tree)]
    return arguments


def _raise(error: OSError) -> None:
    raise error
