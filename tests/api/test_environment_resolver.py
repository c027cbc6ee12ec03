"""The environments of runs resolved by real uv: offline, from a wheelhouse of the tests
(`environment_models`), but for the tests marked `network`, which ask PyPI for real backends.

The same snapshots lock to the same hash from stores at two paths; the lock keeps the versions
of the model's `uv.lock` and pins the backends; nothing is written into a snapshot; a snapshot
without `pyproject.toml`, a model without `uv.lock` and a local package that is no source are
refused, and what uv cannot do is a RuntimeError saying what uv said.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import httpx
import pytest
from environment_models import (
    CONSTRAINTS,
    LIBRARY_PYPROJECT,
    Wheelhouse,
    make_sources,
    snapshot,
    uv_offline,
    write_tree,
)

from simrun_api.environment_resolver import (
    build_requirements,
    resolve_environment,
    uv_environment,
)
from simrun_core.environment import BUILD_CONSTRAINTS, ENVIRONMENT_GROUP, load_constraints
from simrun_core.provenance import SourceProvenance

PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture
def wheelhouse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Wheelhouse:
    wheels = Wheelhouse(tmp_path / "wheels")
    uv_offline(monkeypatch, wheels)
    return wheels


@pytest.fixture
def sources(tmp_path: Path, wheelhouse: Wheelhouse) -> tuple[Path, Path]:
    """The model (locked with tiny-dep 1.0, and 2.0 published since) and its library."""
    trees = make_sources(tmp_path / "src", PYTHON)
    wheelhouse.add_newer_dep()
    return trees


@pytest.fixture
def constraints(tmp_path: Path) -> Path:
    path = tmp_path / "constraints.txt"
    path.write_text(CONSTRAINTS)
    return path


def resolve(store: Path, model: SourceProvenance, libraries: list[SourceProvenance], pins: Path):
    return resolve_environment(
        store, model, libraries, PYTHON, simrun_version="0.1.0", build_constraints=pins
    )


def tree_state(tree: Path) -> list[tuple[str, int, float]]:
    return sorted(
        (str(path.relative_to(tree)), path.stat().st_mode, path.stat().st_mtime)
        for path in tree.rglob("*")
    )


def test_the_same_snapshots_lock_to_the_same_hash_from_two_store_paths(
    tmp_path: Path, sources: tuple[Path, Path], constraints: Path
) -> None:
    model_tree, library_tree = sources
    environments = []
    for store in (tmp_path / "store", tmp_path / "mnt" / "cluster" / "elsewhere"):
        model = snapshot(store, "envmodel", model_tree)
        library = snapshot(store, "tinylib", library_tree)
        before = tree_state(store / "snapshots")
        environments.append((resolve(store, model, [library], constraints), model, library))
        assert tree_state(store / "snapshots") == before, "nothing is written into a snapshot"
    (first, model, library), (second, _, _) = environments
    assert first.lock == second.lock and first.lock_sha256 == second.lock_sha256
    assert str(tmp_path) not in first.lock.replace(str(tmp_path / "wheels"), "")
    assert first.editable == [model.snapshot, library.snapshot]
    lock = tomllib.loads(first.lock)
    packages = {package["name"]: package for package in lock["package"]}
    assert packages["tinylib"]["source"] == {"editable": ".simrun-store/tinylib"}
    assert packages["envmodel"]["source"] == {"editable": "."}
    # the versions of the model's uv.lock stay (tiny-dep 2.0 is newer), the backends are pinned
    # (tiny-editables 2.0 is newer), and a pin no source uses is not in the lock
    assert packages["tiny-dep"]["version"] == "1.0"
    assert packages["tiny-editables"]["version"] == "1.0"
    assert "unused-backend" not in first.lock
    assert lock["manifest"]["constraints"] == [
        {"name": "tiny-backend", "specifier": "==1.0"},
        {"name": "tiny-editables", "specifier": "==1.0"},
    ]
    # the build backends of the model and the library, as the hook of the backend says
    assert first.build_requirements == ("tiny-backend", "tiny-editables")
    group = packages["envmodel"]["dev-dependencies"][ENVIRONMENT_GROUP]
    assert {item["name"] for item in group} == {"tiny-backend", "tiny-editables", "tinylib"}
    # the third party requirements: neither the model nor the library
    assert first.requirements.splitlines() == [
        "tiny-backend==1.0",
        "tiny-dep==1.0",
        "tiny-editables==1.0",
    ]


def test_an_edit_of_the_code_locks_the_same_and_one_of_a_dependency_does_not(
    tmp_path: Path, sources: tuple[Path, Path], constraints: Path
) -> None:
    model_tree, library_tree = sources
    store = tmp_path / "store"
    library = snapshot(store, "tinylib", library_tree)
    first = resolve(store, snapshot(store, "envmodel", model_tree), [library], constraints)
    (model_tree / "envmodel.py").write_text(
        "# changed\n" + (model_tree / "envmodel.py").read_text()
    )
    changed = snapshot(store, "envmodel", model_tree)
    second = resolve(store, changed, [library], constraints)
    assert second.lock_sha256 == first.lock_sha256 and second.editable[0] == changed.snapshot
    (library_tree / "pyproject.toml").write_text(
        LIBRARY_PYPROJECT.replace("dependencies = []", 'dependencies = ["tiny-dep>=2"]')
    )
    third = resolve(store, changed, [snapshot(store, "tinylib", library_tree)], constraints)
    assert third.lock_sha256 != first.lock_sha256
    assert "tiny-dep==2.0" in third.requirements.splitlines()


def test_a_snapshot_without_pyproject_or_a_model_without_lock_is_refused(
    tmp_path: Path, sources: tuple[Path, Path], constraints: Path
) -> None:
    model_tree, library_tree = sources
    store = tmp_path / "store"
    bare = snapshot(store, "bare", write_tree(tmp_path / "bare", {"run.py": "print(1)\n"}))
    with pytest.raises(ValueError, match=r"the snapshot of bare .* has no pyproject.toml"):
        resolve(store, bare, [], constraints)
    model = snapshot(store, "envmodel", model_tree)
    with pytest.raises(ValueError, match=r"the snapshot of bare .* has no pyproject.toml"):
        resolve(store, model, [bare], constraints)
    (model_tree / "uv.lock").unlink()
    unlocked = snapshot(store, "envmodel", model_tree)
    library = snapshot(store, "tinylib", library_tree)
    with pytest.raises(ValueError, match=r"has no uv.lock: lock it"):
        resolve(store, unlocked, [library], constraints)


def test_a_local_dependency_that_is_no_source_is_refused(
    tmp_path: Path, sources: tuple[Path, Path], constraints: Path
) -> None:
    model_tree, _ = sources
    store = tmp_path / "store"
    model = snapshot(store, "envmodel", model_tree)  # tinylib is a path source, not a library
    with pytest.raises(
        ValueError,
        match=r"depends on the local package 'tinylib' .*path = '../tinylib'.*no snapshotted "
        "source of the run",
    ):
        resolve(store, model, [], constraints)


def test_what_uv_cannot_lock_is_a_runtime_error_with_what_it_said(
    tmp_path: Path, sources: tuple[Path, Path], constraints: Path
) -> None:
    model_tree, library_tree = sources
    store = tmp_path / "store"
    text = (model_tree / "pyproject.toml").read_text()
    (model_tree / "pyproject.toml").write_text(text.replace('"tiny-dep"', '"tiny-missing"'))
    model = snapshot(store, "envmodel", model_tree)
    library = snapshot(store, "tinylib", library_tree)
    with pytest.raises(RuntimeError, match="uv cannot lock the environment of the model envmodel"):
        try:
            resolve(store, model, [library], constraints)
        except RuntimeError as error:
            assert "tiny-missing" in str(error)
            raise


def test_a_backend_that_cannot_be_loaded_is_a_runtime_error(
    tmp_path: Path, wheelhouse: Wheelhouse
) -> None:
    source = write_tree(
        tmp_path / "lib",
        {
            "pyproject.toml": '[project]\nname = "lib"\nversion = "1"\n\n[build-system]\n'
            'requires = ["tiny-backend"]\nbuild-backend = "nobackend.here"\n'
        },
    )
    with pytest.raises(RuntimeError, match=r"nobackend.here of lib cannot tell") as failed:
        build_requirements(source, "lib", PYTHON, {"tiny-backend": "1.0"})
    assert "ModuleNotFoundError" in str(failed.value)
    in_tree = write_tree(
        tmp_path / "in-tree",
        {
            "pyproject.toml": '[project]\nname = "t"\nversion = "1"\n\n[build-system]\n'
            'requires = []\nbuild-backend = "backend"\nbackend-path = ["_build"]\n',
            "_build/backend.py": "def build_wheel(*args):\n    pass\n",
        },
    )
    with pytest.raises(RuntimeError, match=r"t cannot be installed editable: .*no build_editable"):
        build_requirements(in_tree, "t", PYTHON)
    assert not (in_tree / "_build" / "__pycache__").exists(), "the hook ran in a shadow tree"


def test_uv_runs_without_the_settings_and_credentials_of_the_service() -> None:
    env = uv_environment(
        {
            "PATH": "/bin",
            "HOME": "/root",
            "UV_INDEX_URL": "https://index",
            "UV_FROZEN": "1",
            "KUBECONFIG": "/secret",
            "SIMRUN_CONFIG": "/etc/simrun",
            "GIT_SSH_COMMAND": "ssh -i key",
            "LC_ALL": "C.UTF-8",
        }
    )
    assert env == {
        "PATH": "/bin",
        "HOME": "/root",
        "UV_INDEX_URL": "https://index",
        "GIT_SSH_COMMAND": "ssh -i key",
        "LC_ALL": "C.UTF-8",
    }


# -- real backends from PyPI ----------------------------------------------------------------------


def pypi_reachable() -> bool:
    if os.environ.get("UV_OFFLINE"):
        return False
    try:
        return httpx.head("https://pypi.org/simple/hatchling/", timeout=5).status_code < 500
    except httpx.HTTPError:
        return False


@pytest.mark.network
@pytest.mark.parametrize(
    ("build_system", "expected"),
    [
        (
            'requires = ["hatchling"]\nbuild-backend = "hatchling.build"',
            ["hatchling", "editables~=0.3"],
        ),
        (
            'requires = ["flit_core>=3.2,<5"]\nbuild-backend = "flit_core.buildapi"',
            ["flit_core>=3.2,<5"],
        ),
        (None, ["setuptools>=40.8.0"]),  # the legacy backend of setuptools
    ],
)
def test_the_hook_of_a_real_backend_says_what_an_editable_build_needs(
    tmp_path: Path, build_system: str | None, expected: list[str]
) -> None:
    if not pypi_reachable():
        pytest.skip("PyPI is not reachable")
    pyproject = '[project]\nname = "real"\nversion = "1.0"\ndescription = "A source"\n'
    if build_system is not None:
        pyproject += f"\n[build-system]\n{build_system}\n"
    source = write_tree(tmp_path / "real", {"pyproject.toml": pyproject, "real.py": ""})
    pins = load_constraints(BUILD_CONSTRAINTS)
    assert build_requirements(source, "real", PYTHON, pins) == expected
    assert not (source / "real.egg-info").exists()
