"""The repository carries what its tests, benchmarks and CI read: nothing points outside it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "benchmarks", ".ci", "pyproject.toml", "simrun_core", "simrun_api")
SCANNED_SUFFIXES = {".py", ".toml", ".yaml", ".yml", ".json", ""}
# Spelt in parts so that this file does not find itself.
OUTSIDE = (
    "../" + "shared",
    "shared" + "/reference",
    "shared" + "/spec",
    '"shared"' + ' / "reference"',
)


def scanned_files() -> list[Path]:
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        candidates = [path] if path.is_file() else path.rglob("*")
        files += [f for f in candidates if f.is_file() and f.suffix in SCANNED_SUFFIXES]
    return files


def test_no_file_names_a_path_outside_the_repository() -> None:
    found = [
        f"{file.relative_to(ROOT)}:{number}: {line.strip()}"
        for file in scanned_files()
        for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1)
        if any(needle in line for needle in OUTSIDE)
    ]
    assert not found, "\n".join(found)


def test_the_upstream_reference_data_is_in_the_repository_with_its_licenses() -> None:
    upstream = ROOT / "tests" / "upstream"
    for project in ("argo-workflows", "kueue"):
        assert "Apache License" in (upstream / project / "LICENSE").read_text()
    assert (upstream / "argo-workflows" / "v4.1.2" / "schema.json").stat().st_size > 500_000
    assert (upstream / "kueue" / "kueue.x-k8s.io_workloads.yaml").is_file()
    assert "git blob" in (upstream / "README.md").read_text()
