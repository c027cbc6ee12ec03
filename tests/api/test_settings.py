"""The settings of the service from the YAML file `SIMRUN_CONFIG` names."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from simrun_api.app import backend_from_settings, serve_from_config
from simrun_api.backends.local import LocalBackend
from simrun_api.settings import ServiceSettings, SettingsError, load_settings

MINIMAL = "store: store\ndb: db/simrun.sqlite\ntokens: tokens.yaml\nowner: mk\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    return path


def test_paths_are_relative_to_the_file_and_the_rest_has_defaults(tmp_path):
    settings = load_settings(write(tmp_path, MINIMAL + "cluster: {namespace: runs}\nweb: ui\n"))
    assert settings.store == tmp_path / "store"
    assert settings.db == tmp_path / "db/simrun.sqlite"
    assert settings.tokens == tmp_path / "tokens.yaml"
    assert settings.web == tmp_path / "ui"
    assert settings.cluster.namespace == "runs" and settings.cluster.local_queue == "simrun"
    assert (settings.poll_s, settings.events_poll_s, settings.events_max_s) == (5.0, 0.5, 300.0)
    assert settings.max_upload_bytes == 2 * 1024**3 and settings.backend is None


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("colour: blue\n", "unknown settings: colour"),
        ("cluster: {namespace: x, regsitry: y}\n", "unknown settings: cluster.regsitry"),
        ("poll_s: soon\n", "Expected `float`, got `str` - at `$.poll_s`"),
    ],
)
def test_a_wrong_setting_is_refused_naming_it_and_the_file(tmp_path, extra, needle):
    path = write(tmp_path, MINIMAL + extra)
    with pytest.raises(SettingsError) as error:
        load_settings(path)
    assert needle in str(error.value) and str(path) in str(error.value)


def test_hosts_that_would_match_no_request_are_refused_all_at_once(tmp_path):
    hosts = '["simrun.lab:8000", "http://simrun.lab/", "", "ok.lab", "::1", "[fe80::1]"]'
    path = write(tmp_path, MINIMAL + f"hosts: {hosts}\n")
    with pytest.raises(SettingsError) as error:
        load_settings(path)
    message = str(error.value)
    assert "hosts[0]: 'simrun.lab:8000' is no host name" in message
    assert "hosts[1]: 'http://simrun.lab/' is no host name" in message
    assert "hosts[2]: an empty name" in message
    assert "hosts[3]" not in message and "hosts[4]" not in message and "hosts[5]" not in message
    with pytest.raises(SettingsError, match="hosts: no name, so every request would be refused"):
        load_settings(write(tmp_path, MINIMAL + "hosts: []\n"))
    named = load_settings(write(tmp_path, MINIMAL + 'hosts: [simrun.lab, "*", 10.0.0.5]\n'))
    assert named.hosts == ["simrun.lab", "*", "10.0.0.5"]


def test_a_missing_setting_is_refused_naming_it(tmp_path):
    with pytest.raises(SettingsError, match="missing required field `owner`"):
        load_settings(write(tmp_path, MINIMAL.replace("owner: mk\n", "")))


def test_the_backend_is_local_by_default_and_else_module_callable(tmp_path):
    settings = load_settings(write(tmp_path, MINIMAL))
    backend = backend_from_settings(settings)
    assert isinstance(backend, LocalBackend)
    assert backend.store == tmp_path / "store" and backend.scratch == tmp_path / "db/scratch"
    for spec, needle in (
        ("nowhere.at_all:backend", "No module named 'nowhere'"),
        ("simrun_api.app:no_backend", "has no 'no_backend'"),
        ("simrun_api.app", "expected module:callable"),
    ):
        path = write(tmp_path, MINIMAL + f"backend: {spec}\n")
        with pytest.raises(SettingsError, match=needle) as error:
            load_settings(path)
        assert str(path) in str(error.value)
        with pytest.raises(SettingsError, match=needle):
            backend_from_settings(ServiceSettings(**SETTINGS, backend=spec))


# -- a backend's own block of settings ------------------------------------------------------


class BoxSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The block of `box_backend`: a nested struct, a number and a path."""

    class Limits(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
        jobs: int = 1

    slots: int = 2
    limits: Limits = msgspec.field(default_factory=Limits)
    spool: Path = Path("spool")


def box_backend(settings: ServiceSettings, block: BoxSettings) -> LocalBackend:
    """A backend with a settings block `box:`; it keeps what it was given."""
    backend = LocalBackend(settings.store, settings.store.parent / "scratch")
    backend.given = block  # type: ignore[attr-defined]
    return backend


box_backend.settings_key = "box"  # type: ignore[attr-defined]
box_backend.settings_type = BoxSettings  # type: ignore[attr-defined]
BOX = "backend: test_settings:box_backend\n"
SETTINGS = {"store": Path("s"), "db": Path("d"), "tokens": Path("t"), "owner": "mk"}


def test_a_backend_s_block_is_decoded_with_its_struct_and_given_to_it(tmp_path):
    text = MINIMAL + BOX + "box: {slots: 5, limits: {jobs: 3}, spool: here}\n"
    settings = load_settings(write(tmp_path, text))
    given = BoxSettings(slots=5, limits=BoxSettings.Limits(jobs=3), spool=tmp_path / "here")
    assert settings.backend_settings == given, "a path of the block is relative to the file"
    assert backend_from_settings(settings).given == given  # type: ignore[attr-defined]
    defaults = load_settings(write(tmp_path, MINIMAL + BOX)).backend_settings
    assert defaults == BoxSettings(spool=tmp_path / "spool"), "no block: its defaults"
    made = backend_from_settings(ServiceSettings(**SETTINGS, backend="test_settings:box_backend"))
    assert made.given == BoxSettings(), "settings made in code: the block's defaults"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            BOX + "box: {slost: 5, limits: {jbos: 1}}\n",
            "unknown settings: box.limits.jbos, box.slost",
        ),
        (BOX + "box: {slots: 1}\ncolour: blue\n", "unknown settings: colour"),
        ("box: {slots: 1}\n", "unknown settings: box"),
        (BOX + "backend_settings: {slots: 1}\n", "unknown settings: backend_settings"),
        (BOX + "box: {slots: many}\n", "Expected `int`, got `str` - at `$.box.slots`"),
        (BOX + "box: [1]\n", "Expected `object`, got `array` - at `$.box`"),
        (
            BOX + "poll_s: soon\nbox: {slots: many}\n",
            "`$.poll_s`; Expected `int`, got `str` - at `$.box.slots`",
        ),
    ],
)
def test_a_wrong_block_is_refused_naming_the_file_and_the_key(tmp_path, extra, needle):
    path = write(tmp_path, MINIMAL + extra)
    with pytest.raises(SettingsError) as error:
        load_settings(path)
    assert needle in str(error.value) and str(path) in str(error.value)


def clashing_backend(settings: ServiceSettings, block: BoxSettings) -> LocalBackend:
    raise AssertionError("never made")


clashing_backend.settings_key = "cluster"  # type: ignore[attr-defined]
clashing_backend.settings_type = BoxSettings  # type: ignore[attr-defined]


def test_a_backend_may_not_declare_a_setting_of_the_service_as_its_key(tmp_path):
    with pytest.raises(SettingsError, match="declares the key 'cluster', a setting of the"):
        load_settings(write(tmp_path, MINIMAL + "backend: test_settings:clashing_backend\n"))


def test_serving_without_a_usable_config_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("SIMRUN_CONFIG", raising=False)
    with pytest.raises(SettingsError, match="SIMRUN_CONFIG is not set"):
        serve_from_config()
    monkeypatch.setenv("SIMRUN_CONFIG", str(write(tmp_path, MINIMAL + "colour: blue\n")))
    with pytest.raises(SettingsError, match="unknown settings: colour"):
        serve_from_config()
    monkeypatch.setenv("SIMRUN_CONFIG", str(write(tmp_path, MINIMAL)))
    with pytest.raises(SettingsError, match=r"tokens\.yaml"):
        serve_from_config()
