"""Tiny python projects for the tests of editable installs: a plugin of simrun in a working tree.

A project has an in-tree build backend (`backend-path`, PEP 517 and 660) that needs nothing
installed and no index, so it builds offline with and without build isolation, with pip and
with uv: its editable wheel is a `.pth` file with the project's `src/` and the metadata with
the entry points. Like setuptools writing `*.egg-info`, the backend writes into the tree it
builds (`_build/built-by.txt`), which is what a shadow tree is for.

`snapplug` is a plugin of one task type, `snap.echo`, whose command (`python -m
snapplug.run {settings} {out}`) writes `out/result.json`: the package's `VERSION`, the file it
was imported from, the prefix of the python that ran it and the command line of its parent (the
harness). Its one input port, `after`, makes a task wait for another.

`treeplug` is a plugin nothing installs, of types only its working tree has: `tree.sum`, split
(unit i writes i * FACTOR * scale, the merge sums them, FACTOR a constant of the tree), and
`tree.note`, a command noting what the sum wrote; `brokenplug`'s type raises on import.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

BACKEND = '''\
"""A PEP 517/660 build backend of a test project: an editable wheel of a `.pth` file."""
import base64, hashlib, json, os, zipfile

META = json.loads(open(os.path.join(os.path.dirname(__file__), "meta.json")).read())
NAME, VERSION = META["name"], META["version"]
INFO = f"{NAME}-{VERSION}.dist-info"


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    if META.get("fail"):
        raise SystemExit("the test backend fails as asked: " + META["fail"])
    if META.get("sleep_s"):
        import time
        time.sleep(META["sleep_s"])
    with open(os.path.join("_build", "built-by.txt"), "w") as built:
        built.write("the backend writes into the tree it builds\\n")
    files = {
        f"{INFO}/METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n",
        f"{INFO}/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\n"
        "Tag: py3-none-any\\n",
        f"{INFO}/entry_points.txt": META.get("entry_points", ""),
        f"_{NAME}_editable.pth": os.path.abspath("src") + "\\n",
    }
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, text in files.items():
            data = text.encode()
            wheel.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{path},sha256={digest.decode()},{len(data)}")
        record.append(f"{INFO}/RECORD,,")
        wheel.writestr(f"{INFO}/RECORD", "\\n".join(record) + "\\n")
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise NotImplementedError("the test backend builds editable wheels only")


def build_sdist(sdist_directory, config_settings=None):
    raise NotImplementedError("the test backend builds editable wheels only")
'''

PLUGIN_INIT = '''\
"""A plugin of simrun in a working tree (a test)."""
import msgspec

from simrun_core.plugins import ResourceHint, TaskType

VERSION = {version!r}


class EchoSettings(msgspec.Struct, forbid_unknown_fields=True):
    word: str = "hello"
    sleep_s: float = 0.0


ECHO = TaskType(
    name="snap.echo",
    settings=EchoSettings,
    inputs=("after",),
    command=("python", "-m", "snapplug.run", "{{settings}}", "{{out}}"),
    hint=ResourceHint(memory_base_gb=0.1, memory_per_worker_gb=0.1),
    description="writes which code ran it",
)
'''

PLUGIN_RUN = """\
import json, os, pathlib, sys, time

import snapplug

settings = json.loads(pathlib.Path(sys.argv[1]).read_text())
time.sleep(settings.get("sleep_s", 0.0))
out = pathlib.Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
result = {
    "version": snapplug.VERSION,
    "file": snapplug.__file__,
    "prefix": sys.prefix,
    "executable": sys.executable,
    "word": settings.get("word", "hello"),
    "harness": pathlib.Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\\0"),
}
(out / "result.json").write_text(json.dumps(result))
"""

ENTRY_POINTS = "[simrun.task_types]\nsnap.echo = snapplug:ECHO\n"


def write_project(
    root: Path,
    name: str,
    version: str,
    modules: dict[str, str],
    entry_points: str = "",
    **meta: object,
) -> Path:
    """A project at `root` with the test backend, its package `src/<name>/` of `modules` (a
    relative path each, e.g. `__init__.py`); `meta` is read by the backend (`fail`, a message
    to fail with; `sleep_s`, a wait before the build)."""
    (root / "_build").mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\n'
        'backend-path = ["_build"]\n\n'
        f'[project]\nname = "{name}"\nversion = "{version}"\n'
    )
    (root / "_build" / "backend.py").write_text(BACKEND)
    info = {"name": name, "version": version, "entry_points": entry_points, **meta}
    (root / "_build" / "meta.json").write_text(json.dumps(info))
    (root / ".gitignore").write_text("_build/built-by.txt\n__pycache__/\n")
    for path, text in modules.items():
        file = root / "src" / name / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(text)
    return root


def write_plugin(root: Path, version: str, **meta: object) -> Path:
    """The working tree of `snapplug` (version 0.2 of the project) with `VERSION = version`."""
    modules = {"__init__.py": PLUGIN_INIT.format(version=version), "run.py": PLUGIN_RUN}
    return write_project(root, "snapplug", "0.2", modules, ENTRY_POINTS, **meta)


def set_version(root: Path, version: str) -> None:
    """Change `VERSION` of the plugin's working tree (an uncommitted change)."""
    (root / "src" / "snapplug" / "__init__.py").write_text(PLUGIN_INIT.format(version=version))


def install_copy(site_packages: Path, version: str) -> None:
    """An installed copy of the plugin (version 0.1 of the project, `VERSION = version`) in a
    site directory, as `pip install` of a release would leave it: the package and its
    metadata with the entry point of `snap.echo`."""
    package = site_packages / "snapplug"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PLUGIN_INIT.format(version=version))
    (package / "run.py").write_text(PLUGIN_RUN)
    info = site_packages / "snapplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: snapplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)


def git_commit_all(tree: Path, message: str = "the plugin") -> None:
    """`git init` (once) and commit everything of a working tree."""
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "test",
        "GIT_AUTHOR_EMAIL": "test@example.org",
        "GIT_COMMITTER_NAME": "test",
        "GIT_COMMITTER_EMAIL": "test@example.org",
    }
    if not (tree / ".git").exists():
        subprocess.run(["git", "init", "-q", "-b", "main", str(tree)], check=True, env=env)
    subprocess.run(["git", "-C", str(tree), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(tree), "commit", "-q", "-m", message], check=True, env=env)


def tree_state(tree: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every entry below a tree with its mode and content (a link: its target), to show that
    nothing wrote into it."""
    state: dict[str, tuple[int, bytes | str]] = {}
    for path in sorted(tree.rglob("*")):
        info = path.lstat()
        relative = str(path.relative_to(tree))
        if path.is_symlink():
            state[relative] = (info.st_mode, os.readlink(path))
        elif path.is_file():
            state[relative] = (info.st_mode, path.read_bytes())
        else:
            state[relative] = (info.st_mode, "")
    return state


# -- a plugin only a working tree has ----------------------------------------------------------

TREE_INIT = '''\
"""A plugin of simrun only a working tree has (a test): a split type and a command type."""
import msgspec

from simrun_core.plugins import ResourceHint, TaskType


class SumSettings(msgspec.Struct, forbid_unknown_fields=True):
    n: int
    sleep_s: float = 0.0
    scale: float = 1.0


SUM = TaskType(
    name="tree.sum",
    settings=SumSettings,
    outputs=("values",),
    hint=ResourceHint(memory_base_gb=0.1, memory_per_worker_gb=0.1),
    count_units="treeplug.units:count_units",
    setup="treeplug.units:setup",
    compute_unit="treeplug.units:compute_unit",
    merge="treeplug.units:merge",
    cost_setting="scale",
    description="sums the numbers times a constant of the working tree",
)


class NoteSettings(msgspec.Struct, forbid_unknown_fields=True):
    word: str = "hello"


NOTE = TaskType(
    name="tree.note",
    settings=NoteSettings,
    inputs=("values",),
    command=("python", "-m", "treeplug.note", "{settings}", "{out}", "{input}"),
    hint=ResourceHint(memory_base_gb=0.1, memory_per_worker_gb=0.1),
    description="notes what the sum wrote, with the constant of the working tree",
)
'''

TREE_UNITS = '''\
"""The units of `tree.sum`: unit i writes i * FACTOR * scale; the merge sums them."""
import json
import time

FACTOR = @FACTOR@


def count_units(settings):
    if settings.n > 1000:
        raise ValueError("at most 1000 numbers")
    return settings.n


def setup(settings, paths):
    (paths.out / "values").mkdir(parents=True, exist_ok=True)


def compute_unit(settings, index, paths):
    time.sleep(settings.sleep_s)
    value = index * FACTOR * settings.scale
    (paths.out / "values" / f"{index}.json").write_text(json.dumps(value))


def merge(settings, paths):
    values = [
        json.loads((paths.out / "values" / f"{index}.json").read_text())
        for index in range(settings.n)
    ]
    summary = {"sum": sum(values), "factor": FACTOR, "file": __file__}
    (paths.out / "summary.json").write_text(json.dumps(summary))
'''

TREE_NOTE = """\
import json, pathlib, sys

from treeplug import units

settings = json.loads(pathlib.Path(sys.argv[1]).read_text())
out = pathlib.Path(sys.argv[2])
_, values = sys.argv[3].split("=", 1)
out.mkdir(parents=True, exist_ok=True)
note = {
    "word": settings.get("word", "hello"),
    "values": len(list(pathlib.Path(values).glob("*.json"))),
    "factor": units.FACTOR,
    "prefix": sys.prefix,
}
(out / "note.json").write_text(json.dumps(note))
"""

TREE_ENTRY_POINTS = "[simrun.task_types]\ntree.sum = treeplug:SUM\ntree.note = treeplug:NOTE\n"

BROKEN_INIT = 'raise RuntimeError("the plugin breaks as it is imported")\n'


def write_tree_plugin(root: Path, factor: int, **meta: object) -> Path:
    """The working tree of `treeplug`, a plugin of `tree.sum` (split: unit i writes
    i * FACTOR * scale) and `tree.note` (a command noting the sum's values), with `FACTOR`."""
    modules = {
        "__init__.py": TREE_INIT,
        "units.py": TREE_UNITS.replace("@FACTOR@", repr(factor)),
        "note.py": TREE_NOTE,
    }
    return write_project(root, "treeplug", "0.1", modules, TREE_ENTRY_POINTS, **meta)


def set_factor(root: Path, factor: int) -> None:
    """Change `FACTOR` of `treeplug`'s working tree (an uncommitted change to the unit code)."""
    path = root / "src" / "treeplug" / "units.py"
    path.write_text(TREE_UNITS.replace("@FACTOR@", repr(factor)))


def write_broken_plugin(root: Path) -> Path:
    """The working tree of `brokenplug`, whose type `tree.broken` raises as it is imported."""
    entry_points = "[simrun.task_types]\ntree.broken = brokenplug:BROKEN\n"
    return write_project(root, "brokenplug", "0.1", {"__init__.py": BROKEN_INIT}, entry_points)
