"""Property-based requests from the committed OpenAPI document (`openapi.json`) to a running
service, every route: valid and invalid parameters and bodies (schemathesis' positive and
negative modes), at most `EXAMPLES` per operation, each request with a timeout. The objects of
the document are taken to allow no other fields, as the service has it (`fuzz_document`).

The promise checked is the one of the service to its callers: no 5xx and no hang, and a 2xx
that has the documented shape. Not checked, each known and not a fault of robustness:
- that every schema-valid request is accepted: the document does not state the rules the
  loader checks (task ids, task types), so schemathesis takes refusals of those for failures;
- that invalid data is always refused: msgspec takes `0` for `false` in a body;
- the shape of the SSE events (the document types the stream as a string), the status codes
  and content types of refusals no route documents (the 404 of `/local/instance` on a
  service that is not local, `text/plain` of the 404 of `/logs`), and the `Allow` header of
  the `OPTIONS` answers litestar makes.

The event streams end after `events_max_s` (0.05 s here), the long poll `/wait` at once for an
ended or unknown run; the timeout of a request fails the test if one does not. The requests
carry the token of an agent of another person (`ann-bot`), so a `DELETE` or a cleanup cannot
remove the run the second test aims at.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from live_service import wait_until
from schemathesis.checks import not_a_server_error, response_schema_conformance
from service_helpers import ConfiguredService, start_configured_service, stop_configured_service

EXAMPLES = 30
REQUEST_TIMEOUT_S = 10  # between two reads
ANSWER_S = 15  # for the whole answer


def fuzz_document() -> dict:
    """The committed document with `additionalProperties: false` on every object of the
    components: the service refuses unknown fields, so valid requests that carry them would
    all end in the same 400 and the valid examples would rarely reach a route's work."""
    document = json.loads(Path(__file__).with_name("openapi.json").read_text())
    for shape in document["components"]["schemas"].values():
        if shape.get("type") == "object" and "properties" in shape:
            shape["additionalProperties"] = False
    return document


SCHEMA = schemathesis.openapi.from_dict(fuzz_document())
OF_A_RUN = SCHEMA.include(path_regex=r"\{run\}")
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
    database=None,
    # No shrinking: every attempt at a request that hangs would wait `ANSWER_S`; the first
    # failing case is reported as it is, with the curl line that repeats it.
    phases=[Phase.explicit, Phase.generate],
)
AUTH = {"Authorization": "Bearer t-ann-bot"}
HUNG: list[str] = []


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfiguredService]:
    started = start_configured_service(
        tmp_path_factory.mktemp("schemathesis"), events_max_s=0.05, events_poll_s=0.02
    )
    try:
        yield started
    finally:
        assert stop_configured_service(started) == 0


@pytest.fixture(scope="module")
def ended_run(service: ConfiguredService) -> str:
    """A run of mk that succeeded, with the task `squares` and its outputs."""
    task = {"id": "squares", "type": "demo.squares", "settings": {"n": 5}}
    run = service.submit("mk", {"name": "target", "tasks": [task]})
    assert service.wait(run["id"])["state"] == "succeeded"
    wait_until(lambda: (service.run_dir(run["id"]) / "run.json").exists(), what="run.json")
    return run["id"]


def check(case: schemathesis.Case, base_url: str) -> None:
    """Send the case and check its answer, which must be whole within `ANSWER_S`: a stream
    that goes on sending (or a request that hangs) fails the test at once, not shrunk."""
    if HUNG:  # the other examples of the test fail at once, not after `ANSWER_S` each
        pytest.fail(f"{HUNG[0]} (an earlier example)")
    checks = [not_a_server_error]
    if "text/event-stream" not in json.dumps(case.operation.definition.raw["responses"]):
        checks.append(response_schema_conformance)
    outcome: dict[str, BaseException] = {}

    def call() -> None:
        try:
            case.call_and_validate(
                base_url=base_url, headers=AUTH, checks=checks, timeout=REQUEST_TIMEOUT_S
            )
        except BaseException as error:  # handed to the test's thread
            outcome["error"] = error

    # A daemon: a request that hangs is left to the end of the service.
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(ANSWER_S)
    error = outcome.get("error")
    if thread.is_alive() or isinstance(error, requests.Timeout):
        HUNG.append(f"{case.method} {case.formatted_path}: no whole answer ({error or ANSWER_S})")
        pytest.fail(HUNG[-1])
    if error is not None:
        raise error


@SCHEMA.parametrize()
@SETTINGS
def test_every_route_answers_any_request_without_a_server_error(case, service):
    check(case, service.url)


@OF_A_RUN.parametrize()
@SETTINGS
def test_every_route_of_a_run_answers_on_a_real_run_without_a_server_error(
    case, service, ended_run
):
    case.path_parameters = {**(case.path_parameters or {}), "run": ended_run}
    if "task" in case.path_parameters:
        case.path_parameters["task"] = "squares"
    check(case, service.url)
    assert (service.run_dir(ended_run) / "events.jsonl").exists()
