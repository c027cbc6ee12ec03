"""The pure parts of the environments of runs: names, constraints, the build system of a source,
the temporary project, the TOML it is written as, the Dockerfile and the image's name."""

from __future__ import annotations

import datetime
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simrun_core.argo.build import parse_ref
from simrun_core.cluster import ClusterConfig
from simrun_core.environment import (
    BUILD_CONSTRAINTS,
    ENVIRONMENT_GROUP,
    HARNESS_REQUIREMENTS,
    LEGACY_BACKEND,
    REQUIREMENTS_FILE,
    Environment,
    build_inputs,
    build_system,
    dockerfile,
    exported_requirements,
    hook_pins,
    image_ref,
    load_constraints,
    lock_constraints,
    lock_sha256,
    locked_from_git,
    locked_versions,
    normalise,
    package_name,
    parse_constraints,
    project_pyproject,
    requirement_name,
)
from simrun_core.toml_text import dumps

ROOT = Path(__file__).parents[2]
LOCK = """\
version = 1
revision = 5
requires-python = ">=3.11"

[[package]]
name = "model"
version = "0.1"
source = { editable = "." }

[[package]]
name = "NumPy"
version = "2.3.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "pkpdsim"
version = "0.4.0"
source = { git = "https://github.com/example/pkpdsim?branch=dev#0123abcd" }

[[package]]
name = "scipy"
version = "1.15.0"
source = { registry = "https://pypi.org/simple" }
resolution-markers = ["python_full_version < '3.12'"]

[[package]]
name = "scipy"
version = "1.16.0"
source = { registry = "https://pypi.org/simple" }
resolution-markers = ["python_full_version >= '3.12'"]
"""


def env_of(lock: str = LOCK, requirements: str = "numpy==2.3.0\nscipy==1.16.0") -> Environment:
    return Environment(
        lock=lock,
        lock_sha256=lock_sha256(lock, "3.14"),
        python="3.14",
        simrun_version="0.1.0 sha256:" + "a" * 64,
        editable=["snapshots/model/" + "b" * 64],
        requirements=requirements,
        build_requirements=("hatchling", "editables"),
    )


# -- names and constraints ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "normalised"),
    [
        ("NumPy", "numpy"),
        ("flit_core", "flit-core"),
        ("a.b__c--d", "a-b-c-d"),
        ("uv-build", "uv-build"),
    ],
)
def test_names_are_normalised_as_the_lock_writes_them(name: str, normalised: str) -> None:
    assert normalise(name) == normalised
    assert requirement_name(f"{name}[extra]>=1; python_version>'3'") == normalised


def test_the_packaged_constraints_pin_the_common_backends_exactly() -> None:
    pins = load_constraints(BUILD_CONSTRAINTS)
    for backend in (
        "setuptools",
        "wheel",
        "hatchling",
        "editables",
        "flit-core",
        "poetry-core",
        "pdm-backend",
        "uv-build",
    ):
        assert pins[backend][0].isdigit(), backend
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "build_constraints.txt" in pyproject["tool"]["setuptools"]["package-data"]["simrun_core"]


def test_a_constraint_that_is_no_exact_pin_is_refused_naming_its_line(tmp_path: Path) -> None:
    assert parse_constraints("# backends\n\nHatchling == 1.33.0  # the pin\n") == {
        "hatchling": "1.33.0"
    }
    for text, why in [
        ("setuptools>=80\n", "line 1 'setuptools>=80' is no exact pin"),
        ("wheel==0.48\nwheel==0.47\n", "line 2: wheel is pinned twice"),
        ("a==1\nhatchling\n", "line 2 'hatchling'"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_constraints(text)
    with pytest.raises(ValueError, match="cannot be read"):
        load_constraints(tmp_path / "missing.txt")


def test_the_harness_requirements_are_those_of_the_distribution() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for requirement in HARNESS_REQUIREMENTS:
        assert requirement in dependencies


# -- the build system -----------------------------------------------------------------------------


def test_a_source_without_a_build_system_is_built_by_the_legacy_backend_of_setuptools() -> None:
    legacy = build_system({"project": {"name": "m"}})
    assert legacy.backend == LEGACY_BACKEND and legacy.requires == ("setuptools>=40.8.0",)
    assert (
        build_system({"build-system": {"requires": ["flit_core>=3.2"]}}).backend == LEGACY_BACKEND
    )
    hatch = build_system(
        {"build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"}}
    )
    assert hatch == (("hatchling",), "hatchling.build", ())
    in_tree = build_system(
        {"build-system": {"requires": [], "build-backend": "b", "backend-path": ["_build"]}}
    )
    assert in_tree.backend_path == ("_build",)


@pytest.mark.parametrize(
    ("table", "why"),
    [
        ({"requires": "hatchling"}, "requires is no list"),
        ({"requires": [], "build-backend": ""}, "build-backend is no object reference"),
        ({"requires": [], "backend-path": ["../out"]}, "is not inside the source"),
        ({"requires": [], "backend-path": ["/abs"]}, "is not inside the source"),
    ],
)
def test_a_malformed_build_system_is_refused_naming_its_key(table: dict, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        build_system({"build-system": table}, "the pyproject.toml of model")


def test_the_package_name_of_a_library_is_its_project_name() -> None:
    assert package_name({"project": {"name": "PkPd_Sim"}}) == "pkpd-sim"
    with pytest.raises(ValueError, match="has no \\[project\\] name"):
        package_name({"tool": {}}, "the pyproject.toml of lib")


# -- the temporary project ------------------------------------------------------------------------

MODEL = {
    "project": {
        "name": "model",
        "version": "0.1",
        "dependencies": ["numpy", "PkPdSim"],
        "optional-dependencies": {"plots": ["matplotlib"]},
    },
    "tool": {
        "uv": {
            "sources": {
                "PkPdSim": {"path": "../pkpdsim", "editable": True},
                "sbmlutils": {"git": "https://github.com/example/sbmlutils", "branch": "dev"},
            },
            "constraint-dependencies": ["setuptools<80"],
        },
        "ruff": {"line-length": 100},
    },
}


def test_a_library_replaces_the_source_of_its_package_and_the_others_stay() -> None:
    project = project_pyproject(
        MODEL,
        libraries={"pkpdsim": ".simrun-store/pkpdsim-repo"},
        requirements=["hatchling", "editables"],
        constraints=["hatchling==1.33.0", "setuptools==84.2.1"],
    )
    sources = project["tool"]["uv"]["sources"]
    assert sources == {
        "sbmlutils": {"git": "https://github.com/example/sbmlutils", "branch": "dev"},
        "pkpdsim": {"path": ".simrun-store/pkpdsim-repo", "editable": True},
    }
    assert project["dependency-groups"] == {
        ENVIRONMENT_GROUP: ["hatchling", "editables", "pkpdsim"]
    }
    # the model's own constraint of setuptools wins over the pin
    assert project["tool"]["uv"]["constraint-dependencies"] == [
        "setuptools<80",
        "hatchling==1.33.0",
    ]
    assert project["project"] == MODEL["project"] and project["tool"]["ruff"] == {
        "line-length": 100
    }
    assert MODEL["tool"]["uv"]["sources"]["PkPdSim"]["path"] == "../pkpdsim"  # not changed
    assert tomllib.loads(dumps(project)) == project


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            {"tool": {"uv": {"sources": {"helper": {"path": "../helper"}}}}},
            "depends on the local package 'helper' \\(tool.uv.sources: path = '../helper'\\)",
        ),
        (
            {"tool": {"uv": {"sources": {"member": [{"workspace": True, "marker": "x"}]}}}},
            "the local package 'member' \\(tool.uv.sources: workspace = True\\)",
        ),
        (
            {"project": {"name": "m", "dependencies": ["helper @ file:///home/u/helper"]}},
            "the local package of project.dependencies 'helper @ file:///home/u/helper'",
        ),
        (
            {"project": {"name": "m"}, "dependency-groups": {"dev": ["x @ file:../x"]}},
            "of the dependency group 'dev'",
        ),
        (
            {"project": {"name": "m"}, "dependency-groups": {ENVIRONMENT_GROUP: []}},
            "has a dependency group 'simrun-environment'",
        ),
    ],
)
def test_a_local_package_that_is_no_source_is_refused(change: dict, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        project_pyproject(
            change, libraries={}, requirements=[], constraints=[], model="the model m"
        )


def test_the_lock_gives_the_pins_and_versions_of_the_environment() -> None:
    versions = locked_versions(LOCK)
    assert versions["numpy"] == ["2.3.0"] and versions["scipy"] == ["1.15.0", "1.16.0"]
    assert locked_from_git(LOCK)
    assert not locked_from_git(LOCK.replace('git = "', 'url = "'))
    constraints = {"numpy": "2.2.0", "scipy": "1.0", "hatchling": "1.33.0"}
    # the hook runs with what the image will have: the lock's single version, else the pin
    assert hook_pins(constraints, LOCK) == {"numpy": "2.3.0", "scipy": "1.0", "hatchling": "1.33.0"}
    # the lock keeps its own versions: only the packages it does not have are pinned
    assert lock_constraints(constraints, LOCK) == ["hatchling==1.33.0"]
    with pytest.raises(ValueError, match="no TOML"):
        locked_versions("[[package")


def test_the_exported_requirements_are_the_pins_without_local_packages() -> None:
    exported = (
        "# This file was autogenerated by uv\n"
        "-e .\n"
        "-e ./.simrun-store/pkpdsim\n"
        "./local\n"
        "colorama==0.4.6 ; sys_platform == 'win32'\n"
        "numpy==2.3.0\n"
        "    # via model\n"
        "pkpdsim @ git+https://github.com/example/pkpdsim@0123abcd\n"
    )
    assert exported_requirements(exported).splitlines() == [
        "colorama==0.4.6 ; sys_platform == 'win32'",
        "numpy==2.3.0",
        "pkpdsim @ git+https://github.com/example/pkpdsim@0123abcd",
    ]


# -- TOML text ------------------------------------------------------------------------------------

KEYS = st.text(min_size=1, max_size=8)
SCALARS = (
    st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.dates()
    | st.datetimes(timezones=st.none() | st.just(datetime.UTC))
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=12,
)


@given(st.dictionaries(KEYS, VALUES, max_size=5))
def test_toml_text_reads_back_as_the_data_it_was_written_of(data: dict) -> None:
    assert tomllib.loads(dumps(data)) == data


def test_toml_text_of_a_pyproject_reads_back() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert tomllib.loads(dumps(data)) == data
    assert tomllib.loads(dumps({"package": [{"name": "a", "wheels": [{"url": "u"}]}, {}]})) == {
        "package": [{"name": "a", "wheels": [{"url": "u"}]}, {}]
    }


# -- the Dockerfile and the image -----------------------------------------------------------------


def instructions_of(text: str) -> list[str]:
    """The first lines of the instructions of a Dockerfile: comments, continued lines and the
    bodies of heredocs left out."""
    found: list[str] = []
    lines = iter(text.splitlines())
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        found.append(line)
        current = line
        while current.endswith("\\"):
            current = next(lines)
        if "<<" in line:
            end = line.split("<<", 1)[1].split()[0]
            while next(lines) != end:
                pass
    return found


def test_the_dockerfile_installs_the_system_packages_the_requirements_then_simrun() -> None:
    text = dockerfile(
        env_of(), "registry:5000/uv:0.13", "simrun-0.1.0-py3-none-any.whl", ["libexpat1"]
    )
    lines = text.splitlines()
    instructions = instructions_of(text)
    assert [line.split()[0] for line in instructions] == [
        "FROM",
        "RUN",
        "COPY",
        "RUN",
        "COPY",
        "RUN",
        "LABEL",
    ]
    assert instructions[0] == "FROM registry:5000/uv:0.13"
    # git: a requirement is locked from git
    assert "apt-get install --yes --no-install-recommends libexpat1 git" in text
    # the requirements in a heredoc: no file of the context but the wheel is copied
    start = lines.index(f"COPY <<REQUIREMENTS {REQUIREMENTS_FILE}")
    end = lines.index("REQUIREMENTS", start)
    assert lines[start + 2 : end] == ["numpy==2.3.0", "scipy==1.16.0"]
    copies = [line for line in instructions if line.startswith("COPY") and "<<" not in line]
    assert copies == [
        "COPY simrun-0.1.0-py3-none-any.whl /opt/simrun/simrun-0.1.0-py3-none-any.whl"
    ]
    installs = [line for line in lines if "uv pip install" in line]
    assert all("--compile-bytecode" in line for line in installs)
    assert text.count("--mount=type=cache,id=simrun-uv,target=/root/.cache/uv") == 2
    assert f"--requirements {REQUIREMENTS_FILE}" in installs[0]
    # simrun last, without its dependencies but the harness's, within the model's pins
    assert (
        lines.index("COPY simrun-0.1.0-py3-none-any.whl /opt/simrun/simrun-0.1.0-py3-none-any.whl")
        > end
    )
    assert f"--constraints {REQUIREMENTS_FILE} 'msgspec>=0.18.6' 'pyyaml>=6'" in text
    assert installs[-1].strip().endswith("--no-deps /opt/simrun/simrun-0.1.0-py3-none-any.whl")


def test_the_dockerfile_has_no_apt_without_system_packages_or_git() -> None:
    plain = env_of(LOCK.replace('git = "', 'url = "'), requirements="")
    text = dockerfile(plain, "base", "simrun-0.1.0-py3-none-any.whl")
    assert "apt-get" not in text
    assert f"--requirements {REQUIREMENTS_FILE}" not in text  # nothing to install
    assert "git" in dockerfile(env_of(), "base", "simrun-0.1.0-py3-none-any.whl")


@pytest.mark.parametrize(
    ("wheel", "packages", "why"),
    [
        ("dist/simrun.whl", (), "no file name of a wheel"),
        ("simrun.tar.gz", (), "no file name of a wheel"),
        ("simrun-0.1.0-py3-none-any.whl", ("libexpat1; rm -rf /",), "no Debian package name"),
    ],
)
def test_the_dockerfile_refuses_what_it_cannot_name(wheel: str, packages: tuple, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        dockerfile(env_of(), "base", wheel, packages)


def test_the_image_is_named_by_the_lock_python_simrun_and_dockerfile() -> None:
    env = env_of()
    text = dockerfile(env, "base", "simrun-0.1.0-py3-none-any.whl", ["libexpat1"])
    ref = image_ref(env, "registry:5000", text)
    parsed = parse_ref(ref)
    assert (parsed.registry, parsed.repository) == ("registry:5000", "simrun-env")
    assert parsed.tag is not None and len(parsed.tag) == 32
    assert image_ref(env_of(), "registry:5000/", text) == ref  # the same environment, the same
    others = {
        image_ref(env_of(LOCK + "\n"), "registry:5000", text),
        image_ref(Environment(**{**_fields(env), "python": "3.13"}), "registry:5000", text),
        image_ref(
            Environment(**{**_fields(env), "simrun_version": "0.2.0"}), "registry:5000", text
        ),
        image_ref(env, "registry:5000", dockerfile(env, "base", "simrun-0.1.0-py3-none-any.whl")),
    }
    assert ref not in others and len(others) == 4
    with pytest.raises(ValueError, match="needs the registry"):
        image_ref(env, " ", text)
    assert lock_sha256(LOCK, "3.14") != lock_sha256(LOCK, "3.13")


def _fields(env: Environment) -> dict:
    return {name: getattr(env, name) for name in env.__struct_fields__}


def test_the_build_inputs_of_an_image_are_named_by_it(tmp_path: Path) -> None:
    first = build_inputs(tmp_path, "registry:5000/simrun-env:" + "1" * 32)
    assert first.parent == tmp_path / "environments" and len(first.name) == 32
    assert first == build_inputs(tmp_path, "registry:5000/simrun-env:" + "1" * 32)
    assert first != build_inputs(tmp_path, "registry:5000/simrun-env:" + "2" * 32)


@pytest.mark.parametrize(
    ("base", "registry", "ref"),
    [
        ("astral-sh/uv:0.13.7", "registry:5000", "registry:5000/astral-sh/uv:0.13.7"),
        ("ghcr.io/astral-sh/uv:0.13.7", "registry:5000", "ghcr.io/astral-sh/uv:0.13.7"),
        ("localhost/uv@sha256:" + "e" * 64, None, "localhost/uv@sha256:" + "e" * 64),
        ("k3d-registry:5000/uv:1", None, "k3d-registry:5000/uv:1"),
        ("uv", "registry:5000/", "registry:5000/uv"),
    ],
)
def test_the_base_image_is_below_the_registry_unless_it_names_a_host(
    base: str, registry: str | None, ref: str
) -> None:
    assert ClusterConfig(base_image=base, registry=registry).base_image_ref() == ref


def test_a_base_image_below_no_registry_is_refused() -> None:
    with pytest.raises(ValueError, match="the cluster has none"):
        ClusterConfig(base_image="astral-sh/uv:0.13.7").base_image_ref()
