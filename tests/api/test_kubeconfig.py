"""simrun_api.backends.kubeconfig: a kubeconfig that cannot be loaded is one line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from simrun_api.backends import kubeconfig
from simrun_api.backends.kubeconfig import kubeconfig_problem

GOOD = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: abc}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: ctx
"""


def written(tmp_path: Path, text: str, name: str = "kubeconfig") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_kubeconfig_that_loads_has_no_problem(tmp_path: Path) -> None:
    good = written(tmp_path, GOOD)
    assert kubeconfig_problem({"KUBECONFIG": good}) is None
    assert kubeconfig_problem({"KUBECONFIG": f"{good}:"}) is None


def test_in_a_cluster_no_kubeconfig_is_read(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    assert (
        kubeconfig_problem({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBECONFIG": missing}) is None
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "the file does not exist"),
        ("not: [yaml\n", "not valid YAML: while parsing a flow sequence"),
        ("apiVersion: v1\nkind: Config\n", "not a kubeconfig: Invalid kube-config file."),
        ("- 1\n", "not a kubeconfig: TypeError: "),
        (GOOD.replace("current-context: ctx", "current-context: x"), "not a kubeconfig: "),
    ],
    ids=["missing", "not-yaml", "no-context", "a-list", "unknown-context"],
)
def test_a_kubeconfig_that_cannot_be_loaded_is_one_line(
    tmp_path: Path, text: str | None, problem: str
) -> None:
    path = str(tmp_path / "kubeconfig") if text is None else written(tmp_path, text)
    found = kubeconfig_problem({"KUBECONFIG": path})
    assert found is not None and found.startswith(f"KUBECONFIG={path}: {problem}"), found
    assert "\n" not in found


def test_each_file_of_a_list_is_named(tmp_path: Path) -> None:
    good, missing = written(tmp_path, GOOD), str(tmp_path / "missing")
    assert kubeconfig_problem({"KUBECONFIG": f"{good}:{missing}"}) == (
        f"KUBECONFIG={good}:{missing}: {missing} does not exist"
    )
    assert kubeconfig_problem({"KUBECONFIG": str(tmp_path)}) == (
        f"KUBECONFIG={tmp_path}: is not a file"
    )


def test_without_kubeconfig_the_default_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubeconfig, "KUBE_CONFIG_DEFAULT_LOCATION", f"{tmp_path}/.kube/config")
    assert kubeconfig_problem({}) == (
        f"{tmp_path}/.kube/config (the kubeconfig when KUBECONFIG is not set): the file does "
        "not exist"
    )
