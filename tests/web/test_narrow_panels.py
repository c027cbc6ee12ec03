"""What the narrow parts of the web app show whole, in a real browser against a real local service:
the server of a worker on its task card, the inspector's Workers table within the panel, the
source of learned resources with what its N counts, the name, branch and commit of a source
apart, and the logs wrapped to the panel by default. Every test fails on a console error it
does not expect (see conftest.py)."""

from __future__ import annotations

import re
import socket

from live_service import LocalService, command, python
from playwright.sync_api import expect
from web_helpers import log_in, squares

from simrun_core.resources import LEARNED_FROM_RUNS

LONG_LINE = "k=" + "9" * 150 + " the parameter k of the hepatic clearance model is too big" * 3
"""A log line far wider than the panel, with a word wider than it too."""


def server_name(host: str) -> str:
    """The name the app gives a server: the last two parts of its host name."""
    return "-".join(host.split("-")[-2:])


def overflows(locator) -> bool:
    """Whether an element's content is wider than the element (cut or scrolled sideways)."""
    return locator.evaluate("el => el.scrollWidth > el.clientWidth")


def test_a_task_card_and_the_inspector_show_the_workers_whole(page, service: LocalService):
    first = service.submit(squares("squares", 40, 0.0))["id"]
    assert service.wait(first)["state"] == "succeeded"
    run = service.submit(squares("squares", 40, 0.0))["id"]
    assert service.wait(run)["state"] == "succeeded"
    log_in(page, service, f"/runs/{run}")
    card = page.locator('[data-task="squares"]')
    expect(card).to_have_attribute("data-state", "done")

    host = socket.gethostname()
    node = card.locator(".worker-node").first
    expect(node).to_have_text(server_name(host))
    expect(node).to_have_attribute("title", host)
    room = node.evaluate("el => el.clientWidth")
    assert room >= 60, f"the server of a worker has {room} px on its card"
    if len(server_name(host)) <= 8:
        assert not overflows(node), "the server name is cut on the card"

    card.click()
    table = page.locator(".workers-table")
    expect(table.locator("[data-role=worker-row]").first).to_contain_text(server_name(host))
    assert table.evaluate("el => el.offsetWidth <= el.parentElement.clientWidth"), (
        "the Workers table runs past the edge of the inspector"
    )
    assert not overflows(page.locator("[data-role=inspector]"))

    # The run learned from the first: said as the CLI and the Editor say it, with what N counts.
    source = page.locator("[data-role=resources-source]")
    expect(source).to_have_text(re.compile(r"^learned from [1-9]\d* runs?$"))
    expect(source).to_have_attribute("title", LEARNED_FROM_RUNS)


def test_the_sources_of_a_run_read_name_branch_and_commit_apart(page, service: LocalService):
    source = {"name": "model", "path": str(service.root), "branch": "main", "commit": "a" * 40}
    run = service.submit(squares("squares", 2, 0.0), sources=[source])["id"]
    service.wait(run)
    log_in(page, service, f"/runs/{run}")
    head = page.locator("[data-role=inspector] .source").first
    expect(head).to_contain_text("model main · aaaaaaaaaa")


def test_long_log_lines_wrap_in_the_narrow_panel_by_default(page, service: LocalService):
    prints = python(f"print({LONG_LINE!r}); raise SystemExit(1)")
    run = service.submit({"name": "fit", "tasks": [command("fit", prints)]})["id"]
    service.wait(run)
    log_in(page, service, f"/runs/{run}")
    page.locator('[data-task="fit"]').click()
    page.get_by_role("tab", name="Logs").click()
    text = page.locator("[data-role=log-text]")
    expect(text).to_contain_text("hepatic clearance")
    expect(page.locator("[data-role=wrap]")).to_be_checked()
    assert not overflows(text), "a long line runs past the panel"
    page.locator("[data-role=wrap]").uncheck()
    expect(text).not_to_have_class(re.compile(r"\bwrap\b"))
    assert overflows(text), "unwrapped, a long line scrolls sideways"
