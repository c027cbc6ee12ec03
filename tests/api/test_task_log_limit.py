"""The logs of a task answer at most `LOG_ANSWER_MAX_BYTES` of log, the newest, and say what
was left out: a log without line breaks, or all of a log (`tail_lines=0`), is read from its end
up to that bound, not whole into the service's memory."""

from __future__ import annotations

import re

import pytest
from live_service import command, python
from service_helpers import start_configured_service, stop_configured_service

from simrun_api.logs import LOG_ANSWER_MAX_BYTES

MILLIONS = 3 * LOG_ANSWER_MAX_BYTES // 1_000_000
ONE_LINE = (
    "import sys\n"
    f"for index in range({MILLIONS}): sys.stdout.write('x' * 1_000_000)\n"
    "sys.stdout.write('the end')\n"
)
"""A log of one line (no line break at all) about three times the bound, ending `the end`."""
LOG_BYTES = MILLIONS * 1_000_000 + len("the end")
LEFT_OUT = re.compile(r"\[simrun: the first ([\d,]+) bytes of this log are left out")


@pytest.fixture(scope="module")
def run_of_one_long_line(tmp_path_factory):
    service = start_configured_service(tmp_path_factory.mktemp("long-line"))
    try:
        run = service.submit("mk", {"name": "long", "tasks": [command("t", python(ONE_LINE))]})
        assert service.wait(run["id"], timeout=300)["state"] == "succeeded"
        yield service, run["id"]
    finally:
        assert stop_configured_service(service) == 0


@pytest.mark.parametrize("tail_lines", [0, 300])
def test_a_log_without_line_breaks_is_answered_up_to_the_bound_from_its_end(
    run_of_one_long_line, tail_lines
):
    service, run_id = run_of_one_long_line
    answer = service.clients["ann"].get(f"/runs/{run_id}/logs/t", params={"tail_lines": tail_lines})
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.content) <= LOG_ANSWER_MAX_BYTES + 1024, len(answer.content)
    lines = answer.text.splitlines()
    assert lines[0] == "==> t-0.log <==", lines[0][:100]
    cut = LEFT_OUT.match(lines[1])
    assert cut, lines[1][:300]
    left_out = int(cut[1].replace(",", ""))
    shown = lines[2]
    assert shown.endswith("the end") and set(shown[: -len("the end")]) == {"x"}
    assert left_out + len(shown) == LOG_BYTES
    assert len(shown) == LOG_ANSWER_MAX_BYTES


def test_a_log_within_the_bound_is_answered_whole_without_a_mark(run_of_one_long_line):
    service, _ = run_of_one_long_line
    small = service.submit("mk", {"name": "small", "tasks": [command("s", python("print(1)"))]})
    assert service.wait(small["id"])["state"] == "succeeded"
    answer = service.clients["ann"].get(f"/runs/{small['id']}/logs/s", params={"tail_lines": 0})
    assert answer.text == "==> s-0.log <==\n1\n"
