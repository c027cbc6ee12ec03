"""The environment of a run resolved with uv: the build requirements of its sources and the lock
of the model with its snapshotted libraries (spec 28). The edge of `simrun_core.environment`,
which has the pure parts (the temporary project, the Dockerfile, the names).

Blocking: `uv` runs as a subprocess (the service calls these in a thread). Neither function
writes into a snapshot, which is named by its content and read-only: uv and the build backends
write into shadow trees (`simrun_core.editable.shadow_tree`: its directories, links to its
files) in a temporary directory, removed at the end.

uv runs with an environment of its own: the variables of paths, locale, proxies, certificates,
git and ssh, and `UV_*` (an index of the service, its credentials, `UV_OFFLINE`), but none of
the service's settings, tokens or cluster credentials, since a build backend runs code of the
model (a `setup.py`). Its errors are RuntimeErrors with the end of what it said.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from simrun_core.editable import remove_tree, shadow_tree, uv_binary
from simrun_core.environment import (
    BUILD_CONSTRAINTS,
    ENVIRONMENT_GROUP,
    STORE_LINKS,
    Environment,
    build_system,
    exported_requirements,
    hook_pins,
    load_constraints,
    lock_constraints,
    lock_sha256,
    locked_versions,
    package_name,
    project_pyproject,
)
from simrun_core.provenance import SourceProvenance
from simrun_core.toml_text import dumps

__all__ = ["UV_TIMEOUT_S", "build_requirements", "resolve_environment", "uv_environment"]

UV_TIMEOUT_S: Final = 900.0
"""The longest one call of uv may take (a lock of a large model downloads its metadata)."""
TAIL_CHARS: Final = 4000
"""The end of what uv said that an error carries."""
PASSED: Final = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LANG",
        "LANGUAGE",
        "TMPDIR",
        "TEMP",
        "TMP",
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "NETRC",
        "SSH_AUTH_SOCK",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
    }
)
PASSED_PREFIXES: Final = ("UV_", "LC_", "GIT_")
NOT_PASSED: Final = frozenset(
    {"UV_FROZEN", "UV_LOCKED", "UV_NO_SYNC", "UV_PROJECT", "UV_PROJECT_ENVIRONMENT"}
)
"""What would make `uv lock` skip the lock or another project be locked."""

HOOK: Final = '''\
"""Ask a build backend what an editable build needs (PEP 660), in the source tree."""
import importlib
import json
import os
import sys

out, reference, *backend_path = sys.argv[1:]
for entry in reversed(backend_path):
    sys.path.insert(0, os.path.abspath(entry))
module, _, attribute = reference.partition(":")
backend = importlib.import_module(module.strip())
for part in filter(None, attribute.strip().split(".")):
    backend = getattr(backend, part)
if not hasattr(backend, "build_editable"):
    answer = {"error": f"the build backend {reference} has no build_editable hook (PEP 660)"}
else:
    hook = getattr(backend, "get_requires_for_build_editable", None)
    answer = {"requires": list(hook({})) if hook is not None else []}
with open(out, "w") as file:
    json.dump(answer, file)
'''


def uv_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment uv runs with (see the module), from `environ` (this process's)."""
    environ = os.environ if environ is None else environ
    return {
        name: value
        for name, value in environ.items()
        if (name in PASSED or name.startswith(PASSED_PREFIXES)) and name not in NOT_PASSED
    }


def build_requirements(
    directory: Path, name: str, python: str, pins: dict[str, str] | None = None
) -> list[str]:
    """What building a source editable needs: its build system and its backend's hook.

    `directory` is the snapshot of the source with its `pyproject.toml`, `name` names it in
    messages, `python` is the version the hook runs with and `pins` the versions of the build
    backends (`load_constraints`), applied to the environment the hook runs in: an environment
    of `uv run` with the static requirements (`[build-system].requires`, setuptools without
    one), in a shadow tree of the snapshot. Returns the static requirements and the result of
    the backend's `get_requires_for_build_editable`.

    ValueError: the source has no `pyproject.toml` or a malformed `[build-system]`.
    RuntimeError: the backend cannot be loaded, has no editable build, or its hook fails.
    """
    pyproject = _read_pyproject(directory, name)
    system = build_system(pyproject, f"the pyproject.toml of {name}")
    with tempfile.TemporaryDirectory(prefix="simrun-build-requires-") as temporary:
        work = Path(temporary)
        source = shadow_tree(directory, work / "source")
        lines = list(system.requires)
        if pins:
            constraints = work / "constraints.txt"
            constraints.write_text("".join(f"{pin}=={pins[pin]}\n" for pin in sorted(pins)))
            lines.append(f"-c {constraints}")
        requirements = work / "requirements.txt"
        requirements.write_text("".join(f"{line}\n" for line in lines))
        hook = work / "hook" / "simrun_build_requires.py"
        hook.parent.mkdir()
        hook.write_text(HOOK)
        answer_file = work / "answer.json"
        command = ["run", "--no-project", "--isolated", "--no-progress", "--python", python]
        command += ["--with-requirements", str(requirements), "python", str(hook)]
        command += [str(answer_file), system.backend, *system.backend_path]
        what = (
            f"the build backend {system.backend} of {name} cannot tell what an editable build needs"
        )
        _uv(command, source, what)
        try:
            answer = json.loads(answer_file.read_text())
        except (OSError, ValueError) as error:
            raise RuntimeError(f"{what}: its hook gave no answer ({error})") from None
    if "error" in answer:
        raise RuntimeError(f"{name} cannot be installed editable: {answer['error']}")
    requires = answer.get("requires")
    if not isinstance(requires, list) or not all(isinstance(item, str) for item in requires):
        raise RuntimeError(f"{what}: get_requires_for_build_editable gave {requires!r}")
    return list(dict.fromkeys([*system.requires, *requires]))


def resolve_environment(
    store: Path,
    model: SourceProvenance,
    libraries: list[SourceProvenance],
    python: str = "3.14",
    *,
    simrun_version: str,
    build_constraints: Path = BUILD_CONSTRAINTS,
) -> Environment:
    """Lock the dependencies of the model with its libraries as snapshot paths.

    `store` is the root of the run store, `model` the snapshot of the model repository (with
    the `pyproject.toml`), `libraries` the snapshots of the libraries: each replaces the entry
    of `[tool.uv.sources]` of its package name, the other entries are kept. `python` is the
    python version of the image, `simrun_version` the version of the simrun wheel of the image
    (part of the hash) and `build_constraints` the pins of the build backends: a pin of a
    package the `uv.lock` of the model does not have constrains the lock, and only a pin of a
    package the lock then has is kept in it (a pin of a backend no source uses changes no lock).

    The lock is resolved in a temporary project: a writable shadow tree of the model with its
    `pyproject.toml` changed (`project_pyproject`) and a copy of its `uv.lock`, and a shadow
    tree of every library at `.simrun-store/<source>`. Its requirements are what `uv export`
    gives of it (the default groups of the model and `ENVIRONMENT_GROUP`) without the model and
    the local packages.

    ValueError: a snapshot has no `pyproject.toml`, the model has no `uv.lock` (it would resolve
    against the live index and the hash would drift), or the model depends on a local package
    which is not a snapshotted source. RuntimeError: uv fails to lock, or a build backend
    cannot tell what an editable build needs.
    """
    model_dir = _snapshot_dir(store, model, "the model")
    pyproject = _read_pyproject(model_dir, model.name)
    try:
        model_lock = (model_dir / "uv.lock").read_text()
    except FileNotFoundError:
        raise ValueError(
            f"the model {model.name} ({model.snapshot}) has no uv.lock: lock it (uv lock) and "
            "submit again; without one it would be resolved against the live index and its "
            "image would drift"
        ) from None
    locked_versions(model_lock)  # ValueError: no TOML
    library_dirs: dict[str, tuple[SourceProvenance, Path]] = {}
    for library in libraries:
        if library.name in (model.name, *(entry.name for entry, _ in library_dirs.values())):
            raise ValueError(f"two sources of the run are named {library.name!r}")
        directory = _snapshot_dir(store, library, "the library")
        name = package_name(
            _read_pyproject(directory, library.name), f"the pyproject.toml of {library.name}"
        )
        if name in library_dirs:
            raise ValueError(
                f"the libraries {library_dirs[name][0].name} and {library.name} are both the "
                f"package {name}"
            )
        library_dirs[name] = (library, directory)
    constraints = load_constraints(build_constraints)
    relative = {name: f"{STORE_LINKS}/{source.name}" for name, (source, _) in library_dirs.items()}
    pinned = lock_constraints(constraints, model_lock)
    requirements: list[str] = []

    def project(with_constraints: Sequence[str]) -> str:
        data = project_pyproject(
            pyproject,
            libraries=relative,
            requirements=requirements,
            constraints=with_constraints,
            model=f"the model {model.name}",
        )
        return dumps(data)

    project(pinned)  # ValueError (a local package that is no source) before anything runs
    pins = hook_pins(constraints, model_lock)
    for source, directory in [(model, model_dir), *library_dirs.values()]:
        requirements += build_requirements(directory, source.name, python, pins)
    requirements[:] = list(dict.fromkeys(requirements))
    text = project(pinned)
    with tempfile.TemporaryDirectory(prefix="simrun-environment-") as temporary:
        root = shadow_tree(model_dir, Path(temporary) / "project")
        _replace(root / "pyproject.toml", text)
        _replace(root / "uv.lock", model_lock)
        links = root / STORE_LINKS
        remove_tree(links)
        links.mkdir()
        for source, directory in library_dirs.values():
            shadow_tree(directory, links / source.name)
        what = f"uv cannot lock the environment of the model {model.name}"
        lock_command = ["lock", "--python", python, "--no-progress"]
        _uv(lock_command, root, what)
        lock = (root / "uv.lock").read_text()
        versions = locked_versions(lock)
        used = [pin for pin in pinned if pin.split("==", 1)[0] in versions]
        if used != pinned:  # the pins of packages the lock has, nothing else
            _replace(root / "pyproject.toml", project(used))
            _uv(lock_command, root, what)
            lock = (root / "uv.lock").read_text()
        exported = _uv(
            [
                "export",
                "--frozen",
                "--format",
                "requirements-txt",
                "--no-hashes",
                "--no-header",
                "--no-annotate",
                "--no-emit-project",
                "--no-emit-local",
                "--group",
                ENVIRONMENT_GROUP,
                "--no-progress",
            ],
            root,
            f"uv cannot export the requirements of the environment of the model {model.name}",
        )
    return Environment(
        lock=lock,
        lock_sha256=lock_sha256(lock, python),
        python=python,
        simrun_version=simrun_version,
        editable=[str(model.snapshot), *(str(source.snapshot) for source in libraries)],
        requirements=exported_requirements(exported),
        build_requirements=tuple(requirements),
    )


def _snapshot_dir(store: Path, source: SourceProvenance, role: str) -> Path:
    if not source.snapshot:
        raise ValueError(f"{role} {source.name} has no snapshot to resolve an environment of")
    directory = store / source.snapshot
    if not directory.is_dir():
        raise ValueError(f"the snapshot {source.snapshot} of {source.name} is not in the store")
    return directory


def _read_pyproject(directory: Path, name: str) -> dict[str, Any]:
    try:
        text = (directory / "pyproject.toml").read_text()
    except FileNotFoundError:
        raise ValueError(
            f"the snapshot of {name} ({directory.name}) has no pyproject.toml"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"the pyproject.toml of {name} is no TOML: {error}") from None


def _replace(path: Path, text: str) -> None:
    """A file of the shadow (a link into the snapshot) made a file of its own."""
    remove_tree(path)
    path.write_text(text)


def _uv(arguments: list[str], cwd: Path, what: str) -> str:
    """Run uv in `cwd`; its output. RuntimeError `what` with the end of its errors."""
    uv = uv_binary()
    if uv is None:
        raise RuntimeError(
            f"{what}: uv is not installed (the service resolves environments with it: "
            "pip install 'simrun[cluster]')"
        )
    try:
        done = subprocess.run(
            [uv, *arguments],
            cwd=cwd,
            env=uv_environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=UV_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"{what}: uv {arguments[0]} took longer than {UV_TIMEOUT_S:g} s"
        ) from None
    except OSError as error:
        raise RuntimeError(f"{what}: uv cannot be run: {error}") from None
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip())[-TAIL_CHARS:]
        raise RuntimeError(f"{what}: uv {arguments[0]} exited with {done.returncode}: {said}")
    return done.stdout
