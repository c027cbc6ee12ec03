"""Authorisation, stated and tested beyond `test_auth.py` and `test_identities.py`:

- every route needs a known token but `/local/instance` and `/ui/`: `test_auth.py`
  (`test_every_route_refuses_a_request_without_a_token`, `test_the_web_app_is_served_...` in
  `test_identities.py`);
- tokens are compared in constant time with every known token: here;
- the tokens file and `.simrun/service.json` are 0600, a looser tokens file is refused:
  `test_auth.py`, and here the service that will not start on one;
- the local service listens on 127.0.0.1 only: here;
- the client sends its token only to a server that answers the instance of `service.json`:
  `tests/cli/test_local.py::test_the_token_goes_only_to_the_server_that_answers_the_instance`;
- cancel and remove: a person their runs and their agents', an agent its own, the owner of the
  service all; everyone else gets 403 and the run is unchanged: here, every pair of the four
  identities of `service_helpers.TOKENS` (and `test_identities.py` for cleanup);
- identities are compared whole, never by name: here the rule, `test_who_is_who.py` over HTTP
  (with the refusals of the tokens file and its reading again on a change).
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import yaml
from live_service import command, python, run_processes, wait_until
from service_helpers import (
    TOKENS,
    ConfiguredService,
    start_configured_service,
    stop_configured_service,
)

import simrun_api.auth
from simrun_api.auth import authenticate, may_act_on
from simrun_core.wire import Identity

SLEEP = python("import time; time.sleep(600)")
NAMES = [identity["name"] for identity in TOKENS.values()]
# Who may cancel and remove whose runs; mk owns the service.
ALLOWED = {
    "mk": {"mk", "mk-bot", "ann", "ann-bot"},
    "mk-bot": {"mk-bot"},
    "ann": {"ann", "ann-bot"},
    "ann-bot": {"ann-bot"},
}


def test_authenticate_compares_the_token_with_every_known_token_in_constant_time(monkeypatch):
    calls: list[tuple[bytes, bytes]] = []
    compare_digest = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return compare_digest(a, b)

    monkeypatch.setattr(simrun_api.auth.hmac, "compare_digest", counting)
    tokens = {f"token-{i}": Identity(f"p{i}", "person", f"p{i}") for i in range(5)}
    for given, expected in (("token-0", "p0"), ("token-4", "p4"), ("nope", None)):
        calls.clear()
        found = authenticate(tokens, given)
        assert (found.name if found else None) == expected
        # every known token, whether the match is first, last or none: no early exit
        assert sorted(known for known, _ in calls) == sorted(t.encode() for t in tokens)
        assert all(sent == given.encode() for _, sent in calls)


def test_the_rule_of_who_may_act_on_a_run():
    identities = {
        token["name"]: Identity(token["name"], token["kind"], token.get("owner", token["name"]))
        for token in TOKENS.values()
    }
    for actor, runner in itertools.product(NAMES, NAMES):
        allowed = may_act_on(identities[actor], identities[runner], "mk")
        assert allowed == (runner in ALLOWED[actor]), (actor, runner)


def test_the_rule_compares_whole_identities_never_names():
    """The case of issue 25: a person `root` and an agent `root` acting for `someone` are
    strangers to each other; two agents `helper` of two people too."""
    root = Identity.person("root")
    agent_root = Identity("root", "agent", "someone")
    someone = Identity.person("someone")
    assert not may_act_on(agent_root, root, "mk")
    assert not may_act_on(root, agent_root, "mk")
    assert may_act_on(someone, agent_root, "mk") and not may_act_on(someone, root, "mk")
    assert may_act_on(Identity.person("mk"), agent_root, "mk")
    assert not may_act_on(Identity("mk", "agent", "ann"), root, "mk")
    helpers = Identity("helper", "agent", "ann"), Identity("helper", "agent", "bob")
    assert not may_act_on(helpers[0], helpers[1], "mk")
    assert not may_act_on(helpers[1], helpers[0], "mk")
    assert may_act_on(helpers[0], helpers[0], "mk")


def test_a_service_with_a_tokens_file_others_may_read_does_not_start(tmp_path):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump(TOKENS))
    tokens.chmod(0o640)
    settings = {"store": "store", "db": "db.sqlite", "tokens": "tokens.yaml", "owner": "mk"}
    (tmp_path / "settings.yaml").write_text(yaml.safe_dump(settings))
    code = "import simrun_api.app as app; app.serve_from_config(0)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "SIMRUN_CONFIG": str(tmp_path / "settings.yaml")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"run: chmod 600 {tokens}" in done.stderr and "mode 0640" in done.stderr


def other_addresses() -> list[str]:
    """Addresses of this machine that are not 127.0.0.1: another loopback address (every
    127.x.y.z is this machine) and the address of the host name or of the default route."""
    found = ["127.0.0.2"]
    with contextlib.suppress(OSError):
        found.append(socket.gethostbyname(socket.gethostname()))
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent; it picks the source address
        found.append(probe.getsockname()[0])
    return sorted({address for address in found if address != "127.0.0.1"})


def reachable(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=5):
            return True
    except OSError:
        return False


def test_the_local_service_listens_on_127_0_0_1_only(local_service):
    port = local_service.info["port"]
    assert local_service.info["url"] == f"http://127.0.0.1:{port}"
    assert reachable("127.0.0.1", port)
    addresses = other_addresses()
    non_loopback = [a for a in addresses if not a.startswith("127.")]
    with socket.socket() as control:
        # A listener on every address is reachable on each of them: the check can fail.
        control.bind(("0.0.0.0", 0))
        control.listen()
        for address in addresses:
            assert reachable(address, control.getsockname()[1]), address
    for address in addresses:
        assert not reachable(address, port), f"the local service answers on {address}"
    if not non_loopback:
        pytest.skip("this machine has no address but loopback; checked 127.0.0.2 only")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfiguredService]:
    started = start_configured_service(tmp_path_factory.mktemp("authorisation"))
    try:
        yield started
    finally:
        assert stop_configured_service(started) == 0


def state_of(service: ConfiguredService, run_id: str) -> tuple[bytes, str]:
    """The bytes of the run's log and its state as the service answers it."""
    log = (service.run_dir(run_id) / "events.jsonl").read_bytes()
    response = service.clients["mk"].get(f"/runs/{run_id}")
    assert response.status_code == 200, response.text
    return log, response.json()["state"]


def test_others_may_neither_cancel_nor_remove_a_run_and_it_is_unchanged(service):
    runs = {
        who: service.submit(who, {"name": f"of-{who}", "tasks": [command("s", SLEEP)]})["id"]
        for who in NAMES
    }
    # One core each: as many run as the machine has cores, the others stay queued.
    running = min(len(runs), len(os.sched_getaffinity(0)))
    expected = ["running"] * running + ["queued"] * (len(runs) - running)

    def settled() -> bool:
        # The tasks' states too: a run is `queued` from its workflow's submission on, but its
        # task's own `queued` comes after, and the logs compared below must have stopped growing.
        views = [service.clients["mk"].get(f"/runs/{run_id}").json() for run_id in runs.values()]
        states = sorted((view["state"] for view in views), reverse=True)
        tasks = sorted((view["tasks"]["s"]["state"] for view in views), reverse=True)
        live = sum(bool(run_processes(run_id)) for run_id in runs.values())
        return states == tasks == expected and live == running

    wait_until(settled, what=f"{running} runs running and the rest queued")

    for actor, runner in itertools.product(NAMES, NAMES):
        if runner in ALLOWED[actor]:
            continue
        run_id = runs[runner]
        before = state_of(service, run_id)
        refused = service.clients[actor].post(f"/runs/{run_id}/cancel")
        assert refused.status_code == 403, (actor, runner, refused.text)
        assert f"{actor} may not cancel run {run_id!r}" == refused.json()["detail"]
        refused = service.clients[actor].delete(f"/runs/{run_id}")
        assert refused.status_code == 403, (actor, runner, refused.text)
        assert f"{actor} may not remove run {run_id!r}" == refused.json()["detail"]
        assert state_of(service, run_id) == before, (actor, runner)

    # Each run cancelled by someone allowed other than its submitter where there is one.
    cancellers = {"mk": "mk", "mk-bot": "mk", "ann": "mk", "ann-bot": "ann"}
    for runner, actor in cancellers.items():
        response = service.clients[actor].post(f"/runs/{runs[runner]}/cancel")
        assert response.status_code == 200, (actor, runner, response.text)
    for run_id in runs.values():
        assert service.wait(run_id)["state"] == "cancelled"
        wait_until(lambda run_id=run_id: (service.run_dir(run_id) / "run.json").exists())

    for actor, runner in itertools.product(NAMES, NAMES):
        if runner in ALLOWED[actor]:
            continue
        run_id = runs[runner]
        before = state_of(service, run_id)
        refused = service.clients[actor].delete(f"/runs/{run_id}")
        assert refused.status_code == 403, (actor, runner, refused.text)
        assert state_of(service, run_id) == before
        assert service.run_dir(run_id).is_dir()

    removers = {"mk": "mk", "mk-bot": "mk-bot", "ann": "ann", "ann-bot": "ann"}
    for runner, actor in removers.items():
        removed = service.clients[actor].delete(f"/runs/{runs[runner]}")
        assert removed.status_code == 200, (actor, runner, removed.text)
        assert not service.run_dir(runs[runner]).exists()
