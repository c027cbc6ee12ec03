"""Models and libraries whose environments uv resolves offline, for the tests of environments.

Nothing comes from an index: `Wheelhouse` writes small wheels into a directory that uv reads as
its only source of packages (`UV_FIND_LINKS`, `UV_NO_INDEX`, `UV_OFFLINE`, see `uv_offline`):

- `tiny-backend`, a build backend (PEP 517 and 660, `tinybackend`) of a flat module named as its
  project, whose editable build is a `.pth` of the source tree and which needs, for an editable
  build only, `tiny-editables` (as hatchling needs `editables`): its hook says so, and its
  `build_editable` imports it;
- `tiny-editables` 1.0 and 2.0, and `tiny-dep` 1.0 (and 2.0 once `add_newer_dep` ran), the
  third party dependency of the model.

`make_sources` writes the working trees of the model `envmodel` (a task type `envprobe.squares`
whose units use the library) and of the library `tinylib`, side by side as in a checkout, with
the model's `uv.lock` made by uv there (`tinylib` a path source `../tinylib`, `tiny-dep` locked
at 1.0), and `snapshot` copies a tree into the snapshots of a store as the client does.
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import subprocess
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from simrun_core.editable import uv_binary
from simrun_core.provenance import SourceProvenance
from simrun_core.snapshot import FileEntry, Scan
from simrun_core.snapshot_store import assemble

COMMIT = "c" * 40
CONSTRAINTS = "tiny-backend==1.0\ntiny-editables==1.0\nunused-backend==9.9\n"
"""The build constraints of the tests: a pin of the backend, one of what its editable build
needs (not the newest), and one of a backend no source uses."""

TINY_BACKEND = '''\
"""A build backend of the tests: a wheel of the module named as the project, editable by a
.pth of the source tree (PEP 517, PEP 660)."""
import base64
import hashlib
import os
import tomllib
import zipfile


def _project():
    with open("pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return ["tiny-editables"]


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    module = _project()["name"].replace("-", "_")
    with open(module + ".py", "rb") as file:
        return _write(wheel_directory, {module + ".py": file.read()})


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    import tiny_editables  # what the hook asked for

    module = _project()["name"].replace("-", "_")
    return _write(wheel_directory, {module + ".pth": tiny_editables.pth(os.getcwd())})


def _write(wheel_directory, files):
    project = _project()
    dist = project["name"].replace("-", "_") + "-" + project["version"]
    info = dist + ".dist-info/"
    metadata = "Metadata-Version: 2.1\\nName: %s\\nVersion: %s\\n" % (
        project["name"], project["version"])
    for requirement in project.get("dependencies", []):
        metadata += "Requires-Dist: %s\\n" % requirement
    files = dict(files)
    files[info + "METADATA"] = metadata.encode()
    files[info + "WHEEL"] = (
        b"Wheel-Version: 1.0\\nGenerator: tinybackend\\nRoot-Is-Purelib: true\\n"
        b"Tag: py3-none-any\\n"
    )
    points = project.get("entry-points", {})
    if points:
        text = ""
        for group, entries in points.items():
            text += "[%s]\\n" % group + "".join("%s = %s\\n" % item for item in entries.items())
        files[info + "entry_points.txt"] = text.encode()
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (name, digest, len(data)))
    record.append(info + "RECORD,,")
    files[info + "RECORD"] = ("\\n".join(record) + "\\n").encode()
    name = dist + "-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as archive:
        for path, data in files.items():
            archive.writestr(zipfile.ZipInfo(path, (1980, 1, 1, 0, 0, 0)), data)
    return name
'''

TINY_EDITABLES = """\
def pth(directory):
    return (directory + "\\n").encode()
"""

MODEL_PYPROJECT = """\
[project]
name = "envmodel"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["tiny-dep", "tinylib"]

[project.entry-points."simrun.task_types"]
"envprobe.squares" = "envmodel:SQUARES"

[build-system]
requires = ["tiny-backend"]
build-backend = "tinybackend"

[tool.uv.sources]
tinylib = { path = "../tinylib", editable = true }
"""

MODEL_MODULE = '''\
"""A model of the tests: squares computed by its library, each unit saying where the code of
the model and of the library came from."""
import json

import tinylib
from simrun_core.plugins import ResourceHint, TaskType
from simrun_core.task_types.demo import SquaresSettings, write_json_atomic


def compute_unit(settings, index, paths):
    write_json_atomic(
        paths.out / "squares" / f"{index}.json",
        {"index": index, "square": tinylib.square(index)},
    )


def merge(settings, paths):
    total = sum(
        json.loads((paths.out / "squares" / f"{index}.json").read_text())["square"]
        for index in range(settings.n)
    )
    write_json_atomic(
        paths.out / "summary.json",
        {"n": settings.n, "sum": total, "model": __file__, "library": tinylib.__file__},
    )


SQUARES = TaskType(
    name="envprobe.squares",
    settings=SquaresSettings,
    outputs=("squares",),
    hint=ResourceHint(memory_base_gb=0.125, memory_per_worker_gb=0.25),
    count_units="simrun_core.task_types.demo:count_units",
    setup="simrun_core.task_types.demo:setup",
    compute_unit="envmodel:compute_unit",
    merge="envmodel:merge",
)
'''

LIBRARY_PYPROJECT = """\
[project]
name = "tinylib"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = []

[build-system]
requires = ["tiny-backend"]
build-backend = "tinybackend"
"""

LIBRARY_MODULE = "def square(index):\n    return index * index\n"


def make_wheel(
    directory: Path,
    name: str,
    version: str,
    files: Mapping[str, str],
    requires: Sequence[str] = (),
) -> Path:
    """A pure wheel of `files` (path: text) with the metadata of a name and version."""
    dist = f"{name.replace('-', '_')}-{version}"
    info = f"{dist}.dist-info"
    entries = {path: text.encode() for path, text in files.items()}
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    entries[f"{info}/METADATA"] = metadata.encode()
    entries[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for path, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in entries.items():
            archive.writestr(zipfile.ZipInfo(path, (1980, 1, 1, 0, 0, 0)), data)
    return wheel


class Wheelhouse:
    """The directory of wheels uv resolves the environments of the tests from."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        make_wheel(directory, "tiny-backend", "1.0", {"tinybackend.py": TINY_BACKEND})
        for version in ("1.0", "2.0"):
            make_wheel(directory, "tiny-editables", version, {"tiny_editables.py": TINY_EDITABLES})
        make_wheel(directory, "tiny-dep", "1.0", {"tiny_dep.py": "VERSION = 1\n"})

    def add_newer_dep(self) -> None:
        """`tiny-dep` 2.0, newer than the model's lock has."""
        make_wheel(self.directory, "tiny-dep", "2.0", {"tiny_dep.py": "VERSION = 2\n"})


def uv_offline(monkeypatch: pytest.MonkeyPatch, wheelhouse: Wheelhouse) -> None:
    """uv of this process and its children resolves from the wheelhouse only."""
    monkeypatch.setenv("UV_FIND_LINKS", str(wheelhouse.directory))
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("UV_OFFLINE", "1")
    monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")


def write_tree(root: Path, files: Mapping[str, str]) -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def uv(*arguments: str, cwd: Path) -> None:
    binary = uv_binary()
    assert binary is not None, "uv is not installed (pip install uv)"
    subprocess.run([binary, *arguments], cwd=cwd, check=True, capture_output=True, timeout=120)


def make_sources(root: Path, python: str) -> tuple[Path, Path]:
    """The working trees of the model (locked by uv) and of its library, side by side."""
    library = write_tree(
        root / "tinylib", {"pyproject.toml": LIBRARY_PYPROJECT, "tinylib.py": LIBRARY_MODULE}
    )
    model = write_tree(
        root / "envmodel", {"pyproject.toml": MODEL_PYPROJECT, "envmodel.py": MODEL_MODULE}
    )
    uv("lock", "--python", python, cwd=model)
    return model, library


def files_of(tree: Path) -> Iterator[Path]:
    for directory, dirnames, filenames in os.walk(tree):
        dirnames[:] = [name for name in dirnames if name not in (".venv", "__pycache__")]
        for name in filenames:
            yield Path(directory) / name


def snapshot(store: Path, name: str, tree: Path) -> SourceProvenance:
    """A snapshot of a working tree in the store, as the client writes one."""
    entries = []
    for file in sorted(files_of(tree)):
        data = file.read_bytes()
        executable = file.stat().st_mode & stat.S_IXUSR
        entries.append(
            FileEntry(
                path=file.relative_to(tree).as_posix(),
                mode=0o555 if executable else 0o444,
                sha256=hashlib.sha256(data).hexdigest(),
            )
        )
    scan = Scan(branch="main", commit=COMMIT, dirty=False, files=entries)
    return assemble(store, name, scan, lambda path: tree / path)
