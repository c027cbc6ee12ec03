"""The web app under its Content-Security-Policy (`simrun_api.browsers.WEB_APP_POLICY`): a run
followed live, its logs and outputs, and the Editor's page load and work without one violation
of the policy; and a script the policy forbids (inline, as an injected one would be) is refused
and seen as a violation, so that a page of the app that broke the policy would fail here."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect
from web_helpers import app_url, log_in, squares

from simrun_api.browsers import WEB_APP_POLICY

VIOLATIONS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__violations.push(`${event.effectiveDirective} ${event.blockedURI}`);
});
"""
"""Collects every violation of the page's policy (each also logs a console error, which fails
any test of tests/web)."""


def watched(page: Any) -> Any:
    page.context.add_init_script(VIOLATIONS)
    return page


def test_the_app_works_under_its_policy_without_a_violation(page, service, console):
    page = watched(page)
    answer = page.goto(app_url(service))
    assert answer.headers["content-security-policy"] == WEB_APP_POLICY
    assert answer.headers["x-content-type-options"] == "nosniff"
    run = service.submit(squares("policy", 40, 0.05))["id"]
    log_in(page, service, f"/runs/{run}")
    bar = page.locator("[data-role=runbar]")
    expect(bar.locator("[data-role=state]")).to_have_text("succeeded", timeout=60_000)
    card = page.locator('[data-task="squares"]')
    expect(card.get_by_role("progressbar")).to_have_attribute("aria-valuenow", "100")
    card.click()
    page.get_by_role("tab", name="Logs").click()
    expect(page.locator("[data-role=logs]")).to_be_visible()
    page.get_by_role("tab", name="Outputs").click()
    expect(page.locator("[data-role=output-file]").first).to_contain_text("summary.json")
    page.goto(app_url(service, "/edit"))
    expect(page.locator("#app")).not_to_be_empty()
    # The app's script and style sheet ran: the page is styled and the icon (a data: URL) is in.
    assert page.evaluate("getComputedStyle(document.body).margin") == "0px"
    assert page.evaluate("window.__violations") == []
    assert console.unexpected() == []


def test_a_script_the_policy_forbids_is_refused_and_seen(page, service, console):
    console.allow("Executing inline script violates")
    page = watched(page)
    log_in(page, service)
    page.evaluate(
        """() => {
          const script = document.createElement("script");
          script.textContent = "window.__injected = true";
          document.body.appendChild(script);
        }"""
    )
    page.wait_for_function("window.__violations.length > 0")
    assert page.evaluate("window.__violations") == ["script-src-elem inline"]
    assert page.evaluate("window.__injected === undefined")
    assert any(error.startswith("Executing inline script violates") for error in console.errors)
