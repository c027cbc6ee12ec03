"""The server strip of the web app shows the GPUs of a server with GPUs: those in use out of
all of them, in a real browser against a local service whose `CUDA_VISIBLE_DEVICES` names two."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from live_service import LocalService, command, python, start_service, wait_until
from playwright.sync_api import expect
from web_helpers import free_port, log_in, stop_local


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
    """A local service of two GPUs (`CUDA_VISIBLE_DEVICES=3,5`)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "3,5"}
    started = start_service(tmp_path_factory.mktemp("web-gpus"), port=free_port(), env=env)
    try:
        yield started
    finally:
        stop_local(started)


def test_the_strip_shows_the_gpus_in_use_out_of_all(page, service):
    log_in(page, service)
    gpus = page.locator("[data-role=server] [data-role=server-gpus]")
    expect(gpus).to_have_text("0 / 2 GPUs")
    task = command("hold", python("import time; time.sleep(600)"))
    task["settings"]["gpus"] = 1
    run = service.submit({"name": "gpu", "tasks": [task]})["id"]
    try:
        expect(gpus).to_have_text("1 / 2 GPUs")
    finally:
        service.client.post(f"/runs/{run}/cancel").raise_for_status()
    wait_until(lambda: service.wait(run, 30)["state"] == "cancelled", 60, "the run to end")
    expect(gpus).to_have_text("0 / 2 GPUs")
