"""The Executions in a real browser against a real local service: the login, a run live from
queued to succeeded, a failed task's logs, Stop, the history slider and bad input. Every test
fails on a console error it does not expect (see conftest.py)."""

from __future__ import annotations

import re

from live_service import LocalService, command, python, wait_until
from playwright.sync_api import expect
from web_helpers import NETWORK_REFUSAL, SCREENSHOTS, app_url, log_in, screenshot, squares

SLEEP = python("import time; time.sleep(600)")
FAILS = python(
    "import sys; print('reading the model'); "
    "raise ValueError('the parameter k must be positive, got -1')"
)


def blocker(service: LocalService) -> str:
    """A run holding every core of the machine until it is cancelled: runs after it queue."""
    task = command("hold", SLEEP)
    task["settings"]["cores"] = service.client.get("/servers").json()[0]["cores"]
    run = service.submit({"name": "blocker", "tasks": [task]})["id"]
    # Holding them, not only asking: a run submitted next could otherwise be given them first.
    wait_until(
        lambda: service.client.get(f"/runs/{run}").json()["state"] == "running",
        what="the blocker to run",
    )
    return run


def test_a_wrong_token_is_refused_and_the_right_one_logs_in(page, service, console):
    console.allow(f"{NETWORK_REFUSAL}: the server responded with a status of 401")
    page.goto(app_url(service))
    page.fill("input[name=token]", "not-a-token")
    page.click("button[type=submit]")
    expect(page.locator("[data-role=login-problem]")).to_contain_text("does not accept this token")
    page.fill("input[name=token]", service.info["token"])
    page.click("button[type=submit]")
    expect(page.locator("[data-role=identity]")).to_have_text(
        service.client.get("/me").json()["name"]
    )
    # The token stays in the browser: a reload needs no login.
    page.reload()
    expect(page.locator("[data-role=identity]")).not_to_be_empty()
    expect(page.locator("[data-role=login]")).to_have_count(0)


def test_a_token_the_service_no_longer_accepts_returns_to_the_login(page, service, console):
    console.allow(f"{NETWORK_REFUSAL}: the server responded with a status of 401")
    log_in(page, service)
    page.evaluate("localStorage.setItem('simrun.token', 'removed-from-the-tokens-file')")
    page.reload()
    expect(page.locator("[data-role=login-message]")).to_contain_text("no longer accepts")
    assert page.evaluate("localStorage.getItem('simrun.token')") is None


def test_a_run_goes_from_queued_to_succeeded_with_its_progress_moving(page, service):
    held = blocker(service)
    report = command("report", python("print('sum written')"), inputs={"sum": "squares.squares"})
    run = service.submit(squares("squares", 600, 0.01, report), group="study-a")["id"]
    log_in(page, service, f"/runs/{run}")
    bar = page.locator("[data-role=runbar]")
    expect(bar.locator("[data-role=state]")).to_have_text("queued")
    card = page.locator('[data-task="squares"]')
    expect(card).to_have_attribute("data-state", "queued")
    # The run list has it under its workflow, selected, and the address keeps it on a reload.
    expect(page.locator(f'.run-card.selected[data-run="{run}"]')).to_contain_text("squares")
    page.reload()
    expect(page.locator(f'.run-card.selected[data-run="{run}"]')).to_be_visible()
    service.client.post(f"/runs/{held}/cancel").raise_for_status()

    progress = card.get_by_role("progressbar")
    page.wait_for_function(
        "(el) => { const v = Number(el.getAttribute('aria-valuenow')); return v > 0 && v < 100 }",
        arg=progress.element_handle(),
    )
    expect(card.locator("[data-role=units]")).to_contain_text(re.compile(r"^[1-9]\d* / 600 units"))
    card.click()
    expect(page.locator("[data-role=inspector-task]")).to_have_text("squares")
    expect(page.locator("[data-role=worker-row]").first).to_contain_text("w0")
    if SCREENSHOTS:  # a picture of the run well under way
        page.wait_for_function(
            "(el) => Number(el.getAttribute('aria-valuenow')) >= 40",
            arg=progress.element_handle(),
        )
        screenshot(page, "executions-running")
    expect(bar.locator("[data-role=state]")).to_have_text("succeeded", timeout=30_000)
    expect(progress).to_have_attribute("aria-valuenow", "100")
    expect(card.locator("[data-role=units]")).to_have_text("600 / 600 units")
    # The worker's memory: its peak against its limit, from its report.
    expect(card.locator("[data-role=memory]").first).to_have_attribute(
        "title", re.compile(r"peak .+ of .+")
    )
    expect(card.locator("[data-role=sparkline]")).to_be_visible()


def test_a_failed_task_shows_its_error_in_red_in_its_logs(page, service):
    run = service.submit({"name": "fit", "tasks": [command("fit", FAILS)]}, group="study-a")["id"]
    service.wait(run)
    log_in(page, service, f"/runs/{run}")
    expect(page.locator("[data-role=runbar] [data-role=state]")).to_have_text("failed")
    expect(page.locator("[data-role=run-message]")).to_contain_text("task 'fit' failed")
    page.locator('[data-task="fit"]').click()
    expect(page.locator("[data-role=task-exit]")).to_contain_text("exited with 1")
    page.get_by_role("tab", name="Logs").click()
    error = page.locator(".log-line[data-kind=error]", has_text="ValueError")
    expect(error).to_contain_text("the parameter k must be positive")
    assert error.evaluate("el => getComputedStyle(el).color") == "rgb(200, 16, 46)"
    expect(page.locator(".log-line[data-kind=plain]", has_text="reading the model")).to_be_visible()
    page.locator("[data-role=wrap]").check()
    expect(page.locator("[data-role=log-text]")).to_have_class(re.compile(r"\bwrap\b"))
    screenshot(page, "executions-failed")


def test_the_overview_shows_the_summary_and_the_outputs_list_the_results_first(page, service):
    run = service.submit(squares("results", 60, 0.0))["id"]
    assert service.wait(run)["state"] == "succeeded"
    log_in(page, service, f"/runs/{run}")
    page.locator('[data-task="squares"]').click()
    summary = page.locator("[data-role=task-summary]")
    expect(summary.locator('[data-key="sum"]')).to_have_text(str(sum(i * i for i in range(60))))
    expect(summary.locator('[data-key="n"]')).to_have_text("60")
    page.get_by_role("tab", name="Outputs").click()
    files = page.locator("[data-role=output-file]")
    expect(files).to_have_count(50)
    expect(files.first).to_contain_text("summary.json")
    expect(files.nth(1)).to_contain_text("squares/0.json")
    expect(page.locator("[data-role=outputs-left-out]")).to_contain_text("11 more files")
    page.locator("[data-role=outputs-filter]").fill("summary")
    expect(files).to_have_count(1)
    expect(page.locator("[data-role=outputs-left-out]")).to_have_count(0)
    page.locator("[data-role=outputs-filter]").fill("squares/5?.json")
    expect(files).to_have_count(10)
    page.locator("[data-role=outputs-filter]").fill("")
    page.locator("[data-role=outputs-all]").click()
    expect(files).to_have_count(61)
    screenshot(page, "executions-outputs")


def test_stop_cancels_a_running_run_after_a_confirmation(page, service):
    run = service.submit({"name": "long", "tasks": [command("sleep", SLEEP)]})["id"]
    log_in(page, service, f"/runs/{run}")
    bar = page.locator("[data-role=runbar]")
    expect(bar.locator("[data-role=state]")).to_have_text("running")
    bar.get_by_role("button", name="Stop", exact=True).click()
    expect(bar.locator("[data-role=stop-confirm]")).to_be_visible()
    bar.get_by_role("button", name="Keep running").click()
    expect(bar.locator("[data-role=stop-confirm]")).to_have_count(0)
    bar.get_by_role("button", name="Stop", exact=True).click()
    bar.get_by_role("button", name="Stop run").click()
    expect(bar.locator("[data-role=state]")).to_have_text("cancelled", timeout=30_000)
    expect(bar.get_by_role("button", name="Stop", exact=True)).to_have_count(0)
    assert service.client.get(f"/runs/{run}").json()["state"] == "cancelled"


def test_the_history_slider_shows_the_run_as_it_was_after_an_event(page, service):
    run = service.submit(squares("history", 40, 0.0))["id"]
    service.wait(run)
    log_in(page, service, f"/runs/{run}")
    history = page.locator("[data-role=history]")
    last = len(service.client.get(f"/runs/{run}/history").json())
    expect(history).to_have_attribute("data-seq", str(last))
    card = page.locator('[data-task="squares"]')
    expect(card).to_have_attribute("data-state", "done")

    slider = page.locator("[data-role=history-slider]")
    box = slider.bounding_box()
    assert box is not None
    middle = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] - 4, middle)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] / 2, middle, steps=5)
    page.mouse.move(box["x"] - 20, middle, steps=5)
    page.mouse.up()
    expect(history).to_have_attribute("data-seq", "1")
    expect(page.locator("[data-role=history-event]")).to_contain_text("#1 submitted")
    expect(page.locator("[data-role=history-mode]")).to_have_text("history")
    expect(page.locator("[data-role=runbar] [data-role=state]")).to_have_text("submitting")
    expect(card).to_have_attribute("data-state", "waiting")
    # A step at a time to the event that queued the task.
    queued = next(
        event["seq"]
        for event in service.client.get(f"/runs/{run}/history").json()
        if event["type"] == "task-state" and event["state"] == "queued"
    )
    slider.focus()
    for _ in range(queued - 1):
        page.keyboard.press("ArrowRight")
    expect(page.locator("[data-role=history-event]")).to_contain_text(
        f"#{queued} task-state · squares · queued"
    )
    expect(card).to_have_attribute("data-state", "queued")
    expect(card.locator("[data-role=units]")).to_have_text("0 / 40 units")
    screenshot(page, "history-slider")
    # Released at the end, the run is live again.
    page.keyboard.press("End")
    expect(page.locator("[data-role=history-mode]")).to_have_text("live")
    expect(card).to_have_attribute("data-state", "done")


def test_a_run_that_does_not_exist_shows_a_message(page, service, console):
    console.allow(f"{NETWORK_REFUSAL}: the server responded with a status of 404")
    log_in(page, service, "/runs/20990101-000000-nope")
    expect(page.locator("[data-role=run-error]")).to_contain_text(
        'There is no run "20990101-000000-nope"'
    )
    page.goto(app_url(service, "/runs/%zz"))
    expect(page.locator("[data-role=run-error]")).to_contain_text("There is no run")
    page.goto(app_url(service, "/nowhere"))
    expect(page.locator("[data-role=no-page]")).to_contain_text("no page")
