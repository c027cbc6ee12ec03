"""The settings of the service from the YAML file `SIMRUN_CONFIG` names."""

from __future__ import annotations

from pathlib import Path

import pytest

from simrun_api.app import backend_from_settings, serve_from_config
from simrun_api.backends.local import LocalBackend
from simrun_api.settings import SettingsError, load_settings

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
        settings = load_settings(write(tmp_path, MINIMAL + f"backend: {spec}\n"))
        with pytest.raises(SettingsError, match=needle):
            backend_from_settings(settings)


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
