"""The app across a service killed with SIGKILL and started again on its port: the top bar says
`reconnecting`, the streams resume after their last event, and the selected run goes on to its
end with every event once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from live_service import LocalService, wait_until
from playwright.sync_api import expect
from web_helpers import (
    NETWORK_REFUSAL,
    free_port,
    kill_local,
    log_in,
    squares,
    start_local,
    stop_local,
)


@pytest.fixture
def restartable(tmp_path) -> Iterator[list[LocalService]]:
    """The local service of a directory on a fixed port; the last one started is stopped."""
    started = [start_local(tmp_path, free_port())]
    try:
        yield started
    finally:
        stop_local(started[-1])


def test_the_app_reconnects_to_a_restarted_service_without_losing_the_run(
    restartable, page, console
):
    # The browser logs the streams cut by the kill and the connections refused meanwhile.
    for reason in ("INCOMPLETE_CHUNKED_ENCODING", "CONNECTION_REFUSED", "EMPTY_RESPONSE"):
        console.allow(f"{NETWORK_REFUSAL}: net::ERR_{reason}")
    service = restartable[0]
    run = service.submit(squares("restart", 300, 0.02))["id"]
    log_in(page, service, f"/runs/{run}")
    card = page.locator('[data-task="squares"]')
    page.wait_for_function(
        "(el) => Number(el.getAttribute('aria-valuenow')) > 0",
        arg=card.get_by_role("progressbar").element_handle(),
    )
    kill_local(service)
    expect(page.locator("[data-role=reconnecting]")).to_be_visible()

    restarted = start_local(service.root, service.info["port"])
    restartable.append(restarted)
    assert restarted.info["token"] == service.info["token"]
    expect(page.locator("[data-role=reconnecting]")).to_have_count(0, timeout=15_000)
    bar = page.locator("[data-role=runbar]")
    expect(bar.locator("[data-role=state]")).to_have_text("succeeded", timeout=60_000)
    assert page.evaluate("location.hash") == f"#/runs/{run}"
    expect(page.locator(f'.run-card.selected[data-run="{run}"]')).to_be_visible()
    # Every event of the log, each once: the app's count is the last seq.
    last = wait_until(lambda: restarted.client.get(f"/runs/{run}/history").json()[-1]["seq"])
    history = page.locator("[data-role=history]")
    expect(history).to_have_attribute("data-seq", str(last))
    expect(history).to_have_attribute("data-events", str(last))
