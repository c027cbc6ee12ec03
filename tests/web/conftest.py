"""Fixtures of the browser tests: Chromium for the session, a local service per module, and a
page per test whose console errors fail the test (unless the test allows them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from live_service import LocalService
from web_helpers import (
    CHROMIUM,
    CHROMIUM_FLAGS,
    Console,
    chromium_missing,
    free_port,
    start_local,
    stop_local,
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for the tests of a module. Not for the session: Playwright's sync API keeps its
    event loop running while it is open, and a later test of the same process that runs one of
    its own (asyncio.run) would fail."""
    missing = chromium_missing()
    if missing:
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
    """A local service of a fresh project directory, shared by the tests of a module."""
    started = start_local(tmp_path_factory.mktemp("web"), free_port())
    try:
        yield started
    finally:
        stop_local(started)


@pytest.fixture
def console() -> Console:
    return Console()


@pytest.fixture
def page(browser: Any, console: Console) -> Iterator[Any]:
    """A page of a fresh browser context (its own local storage); at its end, no console error
    the test did not expect."""
    context = browser.new_context(viewport={"width": 1440, "height": 860})
    context.set_default_timeout(20_000)
    opened = context.new_page()
    opened.on(
        "console", lambda message: message.type == "error" and console.errors.append(message.text)
    )
    opened.on("pageerror", lambda error: console.errors.append(f"uncaught: {error}"))
    try:
        yield opened
        assert console.unexpected() == [], "the page logged errors"
    finally:
        context.close()
