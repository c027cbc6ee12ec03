"""The environment of a command kept in `.simrun/environment.json`: taken from there while the
installation is unchanged, computed again when a distribution comes, goes or changes."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import msgspec
import pytest

from simrun_cli.environment_cache import (
    CACHE_FILE,
    SETTLE_S,
    CachedEnvironment,
    Stamp,
    cached_environment,
    installation_stamp,
    known_environment,
    settled,
)

AN_HOUR_AGO_NS = time.time_ns() - 3600 * 10**9
ENVIRONMENT = {"python": sys.executable, "version": "1", "types": "abc"}


def make_distribution(site: Path, name: str, version: str, mtime_ns: int) -> Path:
    """A `*.dist-info` directory of a plugin, its files and itself of `mtime_ns`."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[simrun.task_types]\nfit = somewhere:FIT\n")
    for path in (info / "METADATA", info / "entry_points.txt", info):
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return info


def test_the_stamp_follows_the_metadata_of_the_distributions(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    empty = installation_stamp([str(site)])
    plugin = make_distribution(site, "plugin", "1.0", AN_HOUR_AGO_NS)
    installed = installation_stamp([str(site)])
    assert installed.digest != empty.digest, "a new distribution"
    assert installed.newest_ns == AN_HOUR_AGO_NS

    (site / "notes.txt").write_text("not a distribution")
    os.utime(site, ns=(AN_HOUR_AGO_NS + 5, AN_HOUR_AGO_NS + 5))
    assert installation_stamp([str(site)]).digest == installed.digest, "another file of it"

    later = AN_HOUR_AGO_NS + 10**9
    os.utime(plugin / "METADATA", ns=(later, later))
    upgraded = installation_stamp([str(site)])
    assert upgraded.digest != installed.digest, "its version rewritten in place"
    assert upgraded.newest_ns == later

    os.utime(plugin / "entry_points.txt", ns=(later + 1, later + 1))
    assert installation_stamp([str(site)]).digest != upgraded.digest, "its entry points"

    before_removal = installation_stamp([str(site)])
    for path in plugin.iterdir():
        path.unlink()
    plugin.rmdir()
    assert installation_stamp([str(site)]).digest not in (before_removal.digest, installed.digest)


def test_the_stamp_has_the_order_and_the_files_of_the_path(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for site in (first, second):
        site.mkdir()
    make_distribution(first, "plugin", "1.0", AN_HOUR_AGO_NS)
    archive = tmp_path / "lib.zip"
    archive.write_bytes(b"PK")
    os.utime(archive, ns=(AN_HOUR_AGO_NS, AN_HOUR_AGO_NS))
    stamp = installation_stamp([str(first), str(second), str(archive)])
    assert installation_stamp([str(second), str(first), str(archive)]).digest != stamp.digest
    os.utime(archive, ns=(AN_HOUR_AGO_NS + 1, AN_HOUR_AGO_NS + 1))
    assert installation_stamp([str(first), str(second), str(archive)]).digest != stamp.digest
    assert installation_stamp([str(first), str(tmp_path / "gone")]).digest != stamp.digest


def test_a_cache_holds_the_environment_of_its_stamp_only() -> None:
    data = msgspec.json.encode(CachedEnvironment("s1", ENVIRONMENT))
    assert cached_environment(data, "s1") == ENVIRONMENT
    assert cached_environment(data, "s2") is None
    assert cached_environment(b"{not json", "s1") is None
    assert cached_environment(b'{"stamp": 3}', "s1") is None


def test_an_installation_changed_a_moment_ago_has_not_settled() -> None:
    now = 10**18
    assert settled(Stamp("d", now - int(SETTLE_S * 1e9) - 1), now)
    assert not settled(Stamp("d", now - int(SETTLE_S * 1e9) + 1), now)
    assert not settled(Stamp("d", now), now)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `sys.path` of one directory with one distribution changed an hour ago."""
    directory = tmp_path / "site"
    directory.mkdir()
    make_distribution(directory, "plugin", "1.0", AN_HOUR_AGO_NS)
    monkeypatch.setattr(sys, "path", [str(directory)])
    return directory


def test_the_environment_is_computed_once_per_installation(tmp_path: Path, site: Path) -> None:
    calls: list[int] = []

    def compute() -> dict[str, str]:
        calls.append(1)
        return {**ENVIRONMENT, "types": f"t{len(calls)}"}

    project = tmp_path / "project"
    project.mkdir()
    assert known_environment(project, compute)["types"] == "t1"
    assert (project / CACHE_FILE).exists()
    assert known_environment(project, compute)["types"] == "t1"
    assert len(calls) == 1, "the second command read the file"

    make_distribution(site, "other", "2.0", AN_HOUR_AGO_NS)
    assert known_environment(project, compute)["types"] == "t2", "a new distribution"
    assert known_environment(project, compute)["types"] == "t2"
    assert len(calls) == 2


def test_an_installation_that_just_changed_is_not_kept(tmp_path: Path, site: Path) -> None:
    calls: list[int] = []

    def compute() -> dict[str, str]:
        calls.append(1)
        return ENVIRONMENT

    make_distribution(site, "fresh", "1.0", time.time_ns())
    project = tmp_path / "project"
    project.mkdir()
    assert known_environment(project, compute) == ENVIRONMENT
    assert known_environment(project, compute) == ENVIRONMENT
    assert len(calls) == 2
    assert not (project / CACHE_FILE).exists()


def test_an_egg_info_file_is_stamped_by_its_own_mtime(tmp_path: Path) -> None:
    egg = tmp_path / "old-1.0-py3.11.egg-info"
    egg.write_text("Metadata-Version: 1.0\nName: old\nVersion: 1.0\n")
    os.utime(egg, ns=(AN_HOUR_AGO_NS, AN_HOUR_AGO_NS))
    stamp = installation_stamp([str(tmp_path)])
    os.utime(egg, ns=(AN_HOUR_AGO_NS + 1, AN_HOUR_AGO_NS + 1))
    assert installation_stamp([str(tmp_path)]).digest != stamp.digest
