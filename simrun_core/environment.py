"""Environments: the one a process runs simrun in, and the one the pods of a run run in.

`environment()` is the environment of this process: its python, simrun version and task types.
A local service records it in `service.json`; a command whose environment differs restarts an
idle service, so a new venv, plugin or simrun takes effect.

`Environment` is the environment of a run on a cluster (spec 28): a lock of the model and its
snapshotted libraries (`simrun_api.environment_resolver.resolve_environment` runs uv for it),
and the image of its third party dependencies and build backends (`dockerfile`, `image_ref`).
The code of the model and the libraries is never in the image: the pods mount the snapshots
read-only and install them editable at start (`SIMRUN_EDITABLE`), so a change of the code never
rebuilds an image and a change of a dependency does. What the lock is resolved from is the
temporary project of `project_pyproject`: the model's `pyproject.toml` with every library a
path source `.simrun-store/<source>` (a relative path, so the same snapshots give the same lock
wherever the store is mounted) and the build requirements of every source in the dependency
group `ENVIRONMENT_GROUP`, pinned by the constraints file of the service (`BUILD_CONSTRAINTS`)
where the model's `uv.lock` does not have them.

Pure but for `environment()` (the installed distributions) and `load_constraints` (a file).
"""

from __future__ import annotations

import copy
import hashlib
import re
import shlex
import sys
import tomllib
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from pathlib import Path, PurePosixPath
from typing import Any, Final, NamedTuple

import msgspec

import simrun_core
from simrun_core.plugins import ENTRY_POINT_GROUP

BUILD_CONSTRAINTS: Final = Path(__file__).with_name("build_constraints.txt")
"""The pins of the build backends the service resolves with (package data of simrun_core)."""
STORE_LINKS: Final = ".simrun-store"
"""The directory of the temporary project that holds a shadow tree of every library."""
ENVIRONMENT_GROUP: Final = "simrun-environment"
"""The dependency group of the temporary project with what the image needs beyond the model's
dependencies: the build requirements of the sources and the libraries."""
IMAGE_REPOSITORY: Final = "simrun-env"
"""The repository of the images of environments in the cluster's registry."""
UV_CACHE: Final = "/root/.cache/uv"
"""The cache of uv in a build: a cache mount of BuildKit, outside of the image."""
REQUIREMENTS_FILE: Final = "/opt/simrun/requirements.txt"
"""Where an image keeps its pinned requirements (the constraints of the simrun layer too)."""
WHEEL_DIR: Final = "/opt/simrun"
HARNESS_REQUIREMENTS: Final = ("msgspec>=0.18.6", "pyyaml>=6")
"""What the harness imports beyond the standard library (simrun_core and simrun_harness): the
simrun wheel is installed without its dependencies, which are the service's."""
LEGACY_BACKEND: Final = "setuptools.build_meta:__legacy__"
LEGACY_REQUIRES: Final = ("setuptools>=40.8.0",)
"""The build system of a source without `[build-system]` (PEP 517, PEP 518)."""
LOCAL_SOURCE_KEYS: Final = ("path", "workspace")
"""The keys of a `[tool.uv.sources]` entry of a package that is no published one."""

_NAME: Final = re.compile(r"\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)")
_SEPARATORS: Final = re.compile(r"[-_.]+")
_PIN: Final = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*==\s*([^\s;,=<>!~*]+)")
_PACKAGE: Final = re.compile(r"[a-z0-9][a-z0-9+.-]+")
_HEREDOC: Final = "REQUIREMENTS"
_TAG_CHARS: Final = 32


def environment() -> dict[str, str]:
    """`python` (the interpreter), `version` (of simrun) and `types`, a hash of the entry points
    of the task types with the names and versions of their distributions, so a new, removed or
    upgraded plugin changes it. Distributions are taken once by name, as imports see them (a
    checkout's `*.egg-info` in the working directory does not count twice)."""
    lines = sorted(
        f"{entry.name}={entry.value}@{entry.dist.name if entry.dist else ''}"
        f"=={entry.dist.version if entry.dist else ''}"
        for entry in entry_points(group=ENTRY_POINT_GROUP)
    )
    digest = hashlib.sha256("\n".join(lines).encode())
    return {
        "python": sys.executable,
        "version": simrun_core.__version__,
        "types": digest.hexdigest()[:16],
    }


# -- the environment of a run -------------------------------------------------------------------


class Environment(msgspec.Struct, frozen=True):
    """The resolved environment of a run.

    `lock`: the text of the `uv.lock`; `lock_sha256`: the hash of the lock and the python
    version (`lock_sha256`), the identity of the image; `python`: the python version of the
    image; `simrun_version`: the version of the simrun wheel the image installs, with the hash
    of the wheel when the service has one; `editable`: the snapshot directories of the model and
    the libraries, relative to the store in the order of the sources, installed at pod start;
    `requirements`: the third party dependencies of the lock as pinned requirements, one a
    line, without the model and the snapshotted libraries; `build_requirements`: the
    requirements of the build backends of the sources, which the lock pins with the
    dependencies.
    """

    lock: str
    lock_sha256: str
    python: str
    simrun_version: str
    editable: list[str]
    requirements: str = ""
    build_requirements: tuple[str, ...] = ()


def normalise(name: str) -> str:
    """The normalised name of a package (PEP 503), as `uv.lock` writes it."""
    return _SEPARATORS.sub("-", name).lower()


def requirement_name(requirement: str) -> str:
    """The normalised name of a PEP 508 requirement; ValueError for one without a name."""
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"requirement {requirement!r} has no package name")
    return normalise(match.group(1))


def parse_constraints(text: str, where: str = "the constraints") -> dict[str, str]:
    """The pins of the text of a constraints file by normalised name; comments and blank lines
    are none. ValueError naming the line for one that is no exact pin `name==version`, or a
    package pinned twice."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _PIN.fullmatch(line)
        if match is None:
            raise ValueError(f"{where}: line {number} {line!r} is no exact pin name==version")
        name = normalise(match.group(1))
        if name in pins:
            raise ValueError(f"{where}: line {number}: {name} is pinned twice")
        pins[name] = match.group(2)
    return pins


def load_constraints(path: Path) -> dict[str, str]:
    """The pins of a constraints file by normalised name, e.g. `hatchling==1.33.0`.

    ValueError: a line is no exact pin `==` (or the file cannot be read)."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ValueError(f"the constraints file {path} cannot be read: {error.strerror}") from None
    return parse_constraints(text, f"the constraints file {path}")


def lock_sha256(lock: str, python: str) -> str:
    """The identity of a lock in an image of a python version."""
    return hashlib.sha256(f"python {python}\n{lock}".encode()).hexdigest()


class BuildSystem(NamedTuple):
    """How a source is built (PEP 517, PEP 518): its static requirements, its backend and the
    directories of an in-tree backend (relative to the source)."""

    requires: tuple[str, ...]
    backend: str
    backend_path: tuple[str, ...] = ()


def build_system(pyproject: Mapping[str, Any], where: str = "pyproject.toml") -> BuildSystem:
    """The build system of a parsed `pyproject.toml`: `[build-system]`, or the legacy backend of
    setuptools without one (and its backend without `build-backend`). ValueError naming the key
    of a `[build-system]` that is malformed."""
    table = pyproject.get("build-system")
    if table is None:
        return BuildSystem(LEGACY_REQUIRES, LEGACY_BACKEND)
    if not isinstance(table, Mapping):
        raise ValueError(f"{where}: [build-system] is no table")
    requires = table.get("requires", list(LEGACY_REQUIRES))
    if not isinstance(requires, list) or not all(isinstance(item, str) for item in requires):
        raise ValueError(f"{where}: build-system.requires is no list of requirements")
    backend = table.get("build-backend", LEGACY_BACKEND)
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"{where}: build-system.build-backend is no object reference")
    backend_path = table.get("backend-path", [])
    if not isinstance(backend_path, list) or not all(isinstance(p, str) for p in backend_path):
        raise ValueError(f"{where}: build-system.backend-path is no list of directories")
    for directory in backend_path:
        pure = PurePosixPath(directory)
        if pure.is_absolute() or ".." in pure.parts:
            raise ValueError(
                f"{where}: build-system.backend-path {directory!r} is not inside the source"
            )
    return BuildSystem(tuple(requires), backend, tuple(backend_path))


def package_name(pyproject: Mapping[str, Any], where: str = "pyproject.toml") -> str:
    """The normalised `[project].name` of a parsed `pyproject.toml`; ValueError without one."""
    project = pyproject.get("project")
    name = project.get("name") if isinstance(project, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where} has no [project] name")
    return normalise(name)


def locked_versions(lock: str) -> dict[str, list[str]]:
    """The versions of every package of a `uv.lock` by name (a lock forked by markers can have
    a package in several versions); ValueError for a lock that is no TOML."""
    versions: dict[str, list[str]] = {}
    for package in _packages(lock):
        name, version = package.get("name"), package.get("version")
        if isinstance(name, str):
            found = versions.setdefault(normalise(name), [])
            if isinstance(version, str) and version not in found:
                found.append(version)
    return versions


def locked_from_git(lock: str) -> bool:
    """Whether a package of a `uv.lock` is locked from a git repository (so the image needs
    git to install it)."""
    return any(
        isinstance(package.get("source"), Mapping) and "git" in package["source"]
        for package in _packages(lock)
    )


def _packages(lock: str) -> list[Mapping[str, Any]]:
    try:
        packages = tomllib.loads(lock).get("package", [])
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"the lock is no TOML: {error}") from None
    return [package for package in packages if isinstance(package, Mapping)]


def hook_pins(constraints: Mapping[str, str], lock: str) -> dict[str, str]:
    """The pins the hook of a build backend runs with: the constraints, with the version the
    model's lock has of a package it has in one version (the version the image will have)."""
    versions = locked_versions(lock)
    return {
        name: versions[name][0] if len(versions.get(name, ())) == 1 else pin
        for name, pin in constraints.items()
    }


def lock_constraints(constraints: Mapping[str, str], lock: str) -> list[str]:
    """The constraints of the temporary project: a pin of every package the model's lock does
    not have (the lock keeps its own versions of the others)."""
    locked = locked_versions(lock)
    return [f"{name}=={pin}" for name, pin in constraints.items() if name not in locked]


def project_pyproject(
    pyproject: Mapping[str, Any],
    *,
    libraries: Mapping[str, str],
    requirements: Sequence[str],
    constraints: Sequence[str],
    model: str = "the model",
) -> dict[str, Any]:
    """The `pyproject.toml` of the temporary project of an environment, as data.

    `pyproject` is the model's, `libraries` the relative directory of each library by its
    normalised package name (`.simrun-store/<source>`), `requirements` the build requirements
    of the sources and `constraints` the pins of `lock_constraints`. Each library replaces the
    entry of `[tool.uv.sources]` of its package name (the others are kept) and is a requirement
    of the dependency group `ENVIRONMENT_GROUP`, with the build requirements; the constraints
    join `tool.uv.constraint-dependencies` but for a package the model constrains itself.

    ValueError: the model depends on a local package which is no snapshotted source (a `path`
    or `workspace` source, or a `file:` reference), or already has the dependency group.
    """
    data = copy.deepcopy(dict(pyproject))
    tool = _table_of(data, "tool", model)
    uv = _table_of(tool, "uv", model, "tool.")
    sources = uv.get("sources", {})
    if not isinstance(sources, Mapping):
        raise ValueError(f"{model}: tool.uv.sources is no table")
    kept: dict[str, Any] = {}
    for key, entry in sources.items():
        if normalise(key) in libraries:
            continue
        for item in entry if isinstance(entry, list) else [entry]:
            local = [k for k in LOCAL_SOURCE_KEYS if isinstance(item, Mapping) and k in item]
            if local:
                raise ValueError(
                    f"{model} depends on the local package {key!r} (tool.uv.sources: "
                    f"{local[0]} = {item[local[0]]!r}), which is no snapshotted source of the "
                    "run: add its working tree as a source of the run, or depend on a "
                    "published version"
                )
        kept[key] = entry
    for name, directory in libraries.items():
        kept[name] = {"path": directory, "editable": True}
    uv["sources"] = kept
    for where, requirement in _requirements_of(data):
        _, at, reference = requirement.partition("@")
        if at and reference.strip().lower().startswith("file:"):
            raise ValueError(
                f"{model} depends on the local package of {where} {requirement!r}, which is no "
                "snapshotted source of the run: add its working tree as a source of the run"
            )
    groups = data.setdefault("dependency-groups", {})
    if not isinstance(groups, dict):
        raise ValueError(f"{model}: [dependency-groups] is no table")
    if ENVIRONMENT_GROUP in groups:
        raise ValueError(
            f"{model} has a dependency group {ENVIRONMENT_GROUP!r}: simrun's environment is "
            "resolved with a group of this name"
        )
    groups[ENVIRONMENT_GROUP] = list(dict.fromkeys([*requirements, *libraries]))
    own = uv.get("constraint-dependencies", [])
    if not isinstance(own, list) or not all(isinstance(item, str) for item in own):
        raise ValueError(f"{model}: tool.uv.constraint-dependencies is no list of requirements")
    constrained = {requirement_name(item) for item in own}
    added = [item for item in constraints if requirement_name(item) not in constrained]
    if own or added:
        uv["constraint-dependencies"] = [*own, *added]
    return data


def _table_of(data: dict[str, Any], key: str, model: str, prefix: str = "") -> dict[str, Any]:
    table = data.setdefault(key, {})
    if not isinstance(table, dict):
        raise ValueError(f"{model}: {prefix}{key} is no table")
    return table


def _requirements_of(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every requirement string of a parsed `pyproject.toml` with where it is."""
    found: list[tuple[str, str]] = []
    project = data.get("project")
    if isinstance(project, Mapping):
        found += [("project.dependencies", r) for r in _strings(project.get("dependencies"))]
        extras = project.get("optional-dependencies")
        if isinstance(extras, Mapping):
            for extra, items in extras.items():
                found += [(f"the extra {extra!r}", r) for r in _strings(items)]
    groups = data.get("dependency-groups")
    if isinstance(groups, Mapping):
        for group, items in groups.items():
            found += [(f"the dependency group {group!r}", r) for r in _strings(items)]
    return found


def _strings(items: Any) -> list[str]:
    return [item for item in items if isinstance(item, str)] if isinstance(items, list) else []


def exported_requirements(text: str) -> str:
    """The pinned requirements of the output of `uv export`, one a line: its comments, options
    and local packages (`-e`, paths) left out."""
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", "-", ".", "/")):
            continue
        lines.append(line)
    return "\n".join(lines)


# -- the image ------------------------------------------------------------------------------------


def dockerfile(
    env: Environment, base_image: str, wheel: str, system_packages: Sequence[str] = ()
) -> str:
    """The Dockerfile of the image of an environment: its dependencies, build backends and
    simrun, no source (the model and the libraries are installed at pod start).

    The Debian `system_packages` first (the shared libraries wheels link; `git` too when a
    package is locked from git), then the pinned requirements, written with a heredoc (so no
    source is copied from the build context) and installed with their bytecode compiled (a pod
    does not compile the modules it imports) and the downloads of uv in a cache of BuildKit
    (`UV_CACHE`, so a build after a change of a dependency downloads only what changed); simrun
    last, the wheel `wheel` of the context (the only file copied, the harness of the service)
    without its dependencies (the service's) but those of the harness, so a new harness
    rebuilds only that layer. ValueError for a wheel that is no file name of a wheel or a
    system package that is no Debian package name.
    """
    if "/" in wheel or not wheel.endswith(".whl") or wheel.startswith("."):
        raise ValueError(f"wheel {wheel!r} is no file name of a wheel in the build context")
    packages = list(dict.fromkeys(system_packages))
    if locked_from_git(env.lock) and "git" not in packages:
        packages.append("git")
    for package in packages:
        if not _PACKAGE.fullmatch(package):
            raise ValueError(f"system package {package!r} is no Debian package name")
    requirements = [line for line in env.requirements.splitlines() if line.strip()]
    if _HEREDOC in requirements:
        raise ValueError(f"a requirement is {_HEREDOC!r}, the end of the heredoc")
    install = (
        f"RUN --mount=type=cache,id=simrun-uv,target={UV_CACHE} \\\n"
        f"    uv pip install --system --python {shlex.quote(env.python)} --compile-bytecode "
        "--link-mode copy"
    )
    lines = [
        "# The image of an environment of simrun: its third party dependencies and the build",
        "# backends of its sources, then simrun; the model and its libraries are installed",
        "# from their snapshots at pod start.",
        f"FROM {base_image}",
    ]
    if packages:
        lines += [
            "RUN apt-get update \\",
            f"    && apt-get install --yes --no-install-recommends {' '.join(packages)} \\",
            "    && rm -rf /var/lib/apt/lists/*",
        ]
    lines += [
        f"COPY <<{_HEREDOC} {REQUIREMENTS_FILE}",
        "# the third party dependencies and build backends of the lock",
        *requirements,
        _HEREDOC,
    ]
    if requirements:
        lines.append(f"{install} --requirements {REQUIREMENTS_FILE}")
    harness = " ".join(shlex.quote(requirement) for requirement in HARNESS_REQUIREMENTS)
    lines += [
        f"COPY {wheel} {WHEEL_DIR}/{wheel}",
        f"{install} --constraints {REQUIREMENTS_FILE} {harness} \\",
        f"    && uv pip install --system --python {shlex.quote(env.python)} --compile-bytecode "
        f"--link-mode copy --no-deps {WHEEL_DIR}/{wheel}",
        f'LABEL io.simrun.lock-sha256="{env.lock_sha256}" io.simrun.python="{env.python}" '
        f'io.simrun.version="{env.simrun_version}"',
    ]
    return "\n".join(lines) + "\n"


def image_ref(env: Environment, registry: str, dockerfile_text: str) -> str:
    """The reference of the image of an environment in the registry: `simrun-env` tagged by the
    hash of the lock, the python version, the simrun version and the Dockerfile (so another
    base image or other system packages give another image). ValueError without a registry."""
    registry = registry.strip().rstrip("/")
    if not registry:
        raise ValueError("an image of an environment needs the registry of the cluster")
    identity = "\n".join(
        [
            env.lock_sha256,
            env.python,
            env.simrun_version,
            hashlib.sha256(dockerfile_text.encode()).hexdigest(),
        ]
    )
    tag = hashlib.sha256(identity.encode()).hexdigest()[:_TAG_CHARS]
    return f"{registry}/{IMAGE_REPOSITORY}:{tag}"


# -- the store --------------------------------------------------------------------------------


ENVIRONMENTS_DIR: Final = "environments"
"""The directory of the store with the build inputs of the images of environments."""


def build_inputs(store: Path, image: str) -> Path:
    """The directory of the build inputs of an image in the store, `environments/<hash>/`:
    named by the image, so whichever run asks for the image (after a restart too) finds them."""
    return store / ENVIRONMENTS_DIR / hashlib.sha256(image.encode()).hexdigest()[:_TAG_CHARS]
