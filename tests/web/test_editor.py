"""The Editor in a real browser against a real local service and a real `simrun edit`: a task
added from the palette (by a click and by a drag), ports connected by dragging (a cycle and a
connected port refused), a validation error shown on the task and under its field and fixed,
the estimate chips, a save that changes the file on disk, a run from the Editor shown in the
Executions, a file changed on disk (taken, or a conflict), Download YAML once the command
stopped, and Rerun with changes of a finished run. Every test fails on a console error it does
not expect (see conftest.py)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from live_service import LocalService, wait_until
from playwright.sync_api import expect
from web_helpers import NETWORK_REFUSAL, log_in, screenshot

from simrun_core.resources import LEARNED_FROM_RUNS
from simrun_core.workflow import TASK_ID_MAX_CHARS

LINK = re.compile(r"in the Editor:\n\S+/ui/#/edit/(?P<session>[0-9a-f]+)$", re.MULTILINE)
SQUARES = {"id": "squares", "type": "demo.squares", "settings": {"n": 30, "sleep_s": 0.01}}


def squares_task(n: int) -> dict[str, Any]:
    return {**SQUARES, "settings": {**SQUARES["settings"], "n": n}}


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


@dataclass
class Edit:
    """A running `simrun edit` of a workflow file of the service's directory."""

    process: subprocess.Popen[bytes]
    file: Path
    session: str
    out: Path

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                return self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


@pytest.fixture(scope="module")
def model(service: LocalService) -> Path:
    repo = service.root / "model"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "model.py").write_text("K = 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "model")
    (repo / "notes.txt").write_text("uncommitted\n")
    return repo


@pytest.fixture
def edit(service: LocalService, model: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Start `simrun edit <file> --local --source model=model` on a workflow of the test."""
    started: list[Edit] = []

    def start(name: str, workflow: dict[str, Any] | None) -> Edit:
        file = service.root / f"{name}.yaml"
        if workflow is not None:
            file.write_text(yaml.safe_dump(workflow, sort_keys=False))
        out = service.root / f"{name}.edit.out"
        command = [sys.executable, "-m", "simrun_cli", "edit", file.name]
        process = subprocess.Popen(
            [*command, "--local", "--source", "model=model"],
            cwd=service.root,
            stdin=subprocess.DEVNULL,
            stdout=out.open("wb"),
            stderr=subprocess.STDOUT,
        )

        def linked() -> re.Match[str] | None:
            assert process.poll() is None, out.read_text()
            return LINK.search(out.read_text())

        match = wait_until(linked, timeout=60, what="the link of simrun edit")
        running = Edit(process, file, match["session"], out)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


def drag(page: Any, source: Any, target: Any) -> None:
    """Drag with the mouse from the middle of one element to the middle of another."""
    start = source.bounding_box()
    end = target.bounding_box()
    page.mouse.move(start["x"] + start["width"] / 2, start["y"] + start["height"] / 2)
    page.mouse.down()
    page.mouse.move(end["x"] + end["width"] / 2, end["y"] + end["height"] / 2, steps=8)
    page.mouse.up()


def handle(page: Any, side: str, task: str, port: str) -> Any:
    return page.locator(f'[data-anchor="{side}|{task}|{port}"]')


def on_disk(file: Path) -> dict[str, Any]:
    return yaml.safe_load(file.read_text())


def test_edit_a_workflow_add_connect_fix_and_save_it_to_the_file(page, service, edit):
    editing = edit("fit", {"name": "fit", "tasks": [SQUARES]})
    log_in(page, service, "/edit")
    # The list of the sessions has it, connected; a click opens it.
    card = page.locator(f'[data-session="{editing.session}"]')
    expect(card).to_contain_text("fit.yaml")
    expect(card).to_contain_text("connected")
    card.click()
    bar = page.locator("[data-role=editor-bar]")
    state = bar.locator("[data-role=draft-state]")
    expect(state).to_have_text("valid, saved")
    expect(page.locator("[data-role=crumb-file]")).to_have_text("fit.yaml")
    expect(bar.locator("[data-role=model-tree]")).to_contain_text("main")
    expect(bar.locator("[data-role=uncommitted]")).to_have_text("+1 uncommitted")
    expect(page.locator("[data-role=palette-footer]")).to_contain_text(str(editing.file))
    expect(page.locator('[data-task="squares"] [data-role=estimate-chips]')).to_contain_text(
        "1 pod"
    )

    # A click on the palette adds a task right of the right-most one; its n is missing.
    page.locator("[data-role=palette-search]").fill("squares")
    expect(page.locator('.palette-type[data-type="command"]')).to_have_count(0)
    page.locator('.palette-type[data-type="demo.squares"]').click()
    added = page.locator('[data-task="squares-2"]')
    expect(added).to_have_attribute("data-errors", "1")
    expect(added.locator("[data-role=card-problems]")).to_contain_text(
        "settings.n missing, it is required"
    )
    expect(state).to_have_text("unsaved changes · 1 error")
    first_box = page.locator('[data-task="squares"]').bounding_box()
    assert added.bounding_box()["x"] > first_box["x"] + first_box["width"]

    # Connecting a port by a drag; a cycle and a port connected already are refused.
    drag(page, handle(page, "out", "squares", "squares"), handle(page, "in", "squares-2", "after"))
    expect(page.locator('[data-edge="squares-2:after"]')).to_have_count(1)
    drag(page, handle(page, "out", "squares-2", "squares"), handle(page, "in", "squares", "after"))
    expect(bar.locator("[data-role=editor-note]")).to_contain_text("would close a cycle")
    drag(page, handle(page, "out", "squares", "squares"), handle(page, "in", "squares-2", "after"))
    expect(bar.locator("[data-role=editor-note]")).to_contain_text("is connected already")
    expect(page.locator('[data-edge="squares:after"]')).to_have_count(0)

    # A value of the wrong type: the message of the service under the field and on the card.
    added.locator(".task-id").click()
    field = page.locator('[data-role=settings-form] [data-field="n"]')
    field.locator("input").fill("many")
    expect(field.locator("[data-role=field-problem]")).to_have_text("expected `int`, got `str`")
    expect(added.locator("[data-role=card-problems]")).to_contain_text("expected `int`")
    field.locator("input").fill("40")
    expect(added).to_have_attribute("data-errors", "0")
    expect(field.locator("[data-role=field-problem]")).to_have_count(0)
    expect(state).to_have_text("unsaved changes")
    expect(added.locator("[data-role=estimate-chips]")).to_contain_text("worker")
    expect(page.locator("[data-role=task-estimate]")).to_contain_text("pod")
    assert len(on_disk(editing.file)["tasks"]) == 1  # nothing written before a save

    page.locator("[data-role=palette-search]").fill("")
    expect(page.locator('.palette-type[data-type="command"]')).to_be_visible()
    screenshot(page, "editor")
    bar.locator("[data-role=save]").click()
    expect(state).to_have_text("valid, saved")
    expect(bar.locator("[data-role=save]")).to_be_disabled()
    saved = on_disk(editing.file)
    assert saved["tasks"][1] == {
        "id": "squares-2",
        "type": "demo.squares",
        "settings": {"n": 40},
        "inputs": {"after": "squares.squares"},
    }
    assert saved["tasks"][0] == SQUARES


def test_run_from_the_editor_and_see_the_run_in_the_executions(page, service, edit):
    editing = edit("run", {"name": "run-me", "tasks": [SQUARES]})
    log_in(page, service, f"/edit/{editing.session}")
    bar = page.locator("[data-role=editor-bar]")
    expect(bar.locator("[data-role=draft-state]")).to_have_text("valid, saved")
    page.locator('[data-task="squares"] .task-id').click()
    page.locator('[data-role=settings-form] [data-field="n"] input').fill("12")
    expect(bar.locator("[data-role=draft-state]")).to_have_text("unsaved changes")
    expect(bar.locator("[data-role=run]")).to_be_enabled()
    bar.locator("[data-role=run]").click()
    page.wait_for_url(re.compile(r"#/runs/\d{8}-\d{6}-[0-9a-f]{6}$"))
    run = page.url.rsplit("/", 1)[1]
    expect(page.locator("[data-role=runbar] [data-role=state]")).to_have_text(
        "succeeded", timeout=30_000
    )
    expect(page.locator('[data-task="squares"] [data-role=units]')).to_have_text("12 / 12 units")
    view = service.client.get(f"/runs/{run}").json()
    assert view["sources"][0]["name"] == "model"
    assert view["sources"][0]["changed"] == ["?? notes.txt"]
    assert on_disk(editing.file)["tasks"][0]["settings"]["n"] == 30  # a run writes no file


def test_a_type_dropped_from_the_palette_a_command_input_and_delete(page, service, edit):
    editing = edit("drop", {"name": "drop", "tasks": [SQUARES]})
    log_in(page, service, f"/edit/{editing.session}")
    expect(page.locator('[data-task="squares"]')).to_be_visible()
    canvas = page.locator("[data-role=editor-canvas]")
    page.locator('.palette-type[data-type="command"]').drag_to(
        canvas, target_position={"x": 560, "y": 420}
    )
    command = page.locator('[data-task="command"]')
    expect(command).to_be_visible()
    box, frame = command.bounding_box(), canvas.bounding_box()
    assert abs(box["x"] + box["width"] / 2 - (frame["x"] + 560)) < 4
    # The + of a command adds an input named after the task it reads.
    drag(page, handle(page, "out", "squares", "squares"), handle(page, "in", "command", "+"))
    expect(page.locator('[data-edge="command:squares"]')).to_have_count(1)
    expect(handle(page, "in", "command", "squares")).to_be_visible()
    command.locator(".task-id").click()
    form = page.locator("[data-role=settings-form]")
    form.locator('[data-field="args"] textarea').fill("python3\n-c\nprint('hi')")
    expect(form.locator('[data-field="image"] [data-role=field-problem]')).to_contain_text(
        "missing"
    )
    page.keyboard.press("Escape")
    # Backspace removes a selected connection, Delete a selected task with what reads it.
    page.locator('[data-edge="command:squares"] .ed-edge-hit').click()
    page.keyboard.press("Backspace")
    expect(page.locator('[data-edge="command:squares"]')).to_have_count(0)
    command.locator(".task-id").click()
    page.keyboard.press("Delete")
    expect(command).to_have_count(0)
    expect(page.locator("[data-role=draft-state]")).to_have_text("unsaved changes")


def test_a_file_changed_on_disk_is_taken_or_gives_a_conflict(page, service, edit):
    editing = edit("conflict", {"name": "conflict", "tasks": [SQUARES]})
    log_in(page, service, f"/edit/{editing.session}")
    bar = page.locator("[data-role=editor-bar]")
    state = bar.locator("[data-role=draft-state]")
    expect(state).to_have_text("valid, saved")
    # Without unsaved changes the Editor takes the file on disk.
    changed = {"name": "conflict", "tasks": [squares_task(31)]}
    editing.file.write_text(yaml.safe_dump(changed, sort_keys=False))
    expect(page.locator('[data-task="squares"]')).to_contain_text("n 31", timeout=15_000)
    expect(state).to_have_text("valid, saved")
    # With unsaved changes: "changed on disk", and a plain save is refused by the command.
    page.locator('[data-task="squares"] .task-id').click()
    page.locator('[data-role=settings-form] [data-field="n"] input').fill("50")
    expect(state).to_have_text("unsaved changes")
    theirs = {"name": "conflict", "tasks": [squares_task(32)]}
    editing.file.write_text(yaml.safe_dump(theirs, sort_keys=False))
    expect(state).to_have_text("changed on disk", timeout=15_000)
    expect(bar.locator("[data-role=reload]")).to_be_visible()
    bar.locator("[data-role=save]").click()
    expect(bar.locator("[data-role=editor-message]")).to_contain_text("changed on disk")
    assert on_disk(editing.file) == theirs
    screenshot(page, "editor-conflict")
    bar.locator("[data-role=save-anyway]").click()
    expect(state).to_have_text("valid, saved")
    assert on_disk(editing.file)["tasks"][0]["settings"] == {"n": 50, "sleep_s": 0.01}
    # Reload drops the draft for the file on disk.
    page.locator('[data-role=settings-form] [data-field="n"] input').fill("60")
    editing.file.write_text(yaml.safe_dump(theirs, sort_keys=False))
    expect(state).to_have_text("changed on disk", timeout=15_000)
    bar.locator("[data-role=reload]").click()
    expect(state).to_have_text("valid, saved")
    expect(page.locator('[data-task="squares"]')).to_contain_text("n 32")


def test_with_the_command_stopped_the_draft_is_downloaded_as_yaml(page, service, edit):
    editing = edit("away", {"name": "away", "tasks": [SQUARES]})
    log_in(page, service, f"/edit/{editing.session}")
    bar = page.locator("[data-role=editor-bar]")
    expect(bar.locator("[data-role=draft-state]")).to_have_text("valid, saved")
    assert editing.stop() == 0
    expect(bar.locator("[data-role=not-connected]")).to_be_visible(timeout=10_000)
    expect(bar.locator("[data-role=save]")).to_have_count(0)
    page.locator('[data-task="squares"] .task-id').click()
    page.locator('[data-role=settings-form] [data-field="n"] input').fill("7")
    expect(bar.locator("[data-role=draft-state]")).to_have_text(
        "unsaved changes, download to keep them"
    )
    with page.expect_download() as download:
        bar.locator("[data-role=download]").click()
    assert download.value.suggested_filename == "away.yaml"
    text = Path(download.value.path()).read_text()
    assert yaml.safe_load(text) == {
        "name": "away",
        "tasks": [squares_task(7)],
    }
    assert text.startswith("name: away\ntasks:\n  - id: squares\n")
    assert on_disk(editing.file)["tasks"][0]["settings"]["n"] == 30


def test_rerun_with_changes_of_a_finished_run(page, service):
    run = service.submit({"name": "again", "tasks": [SQUARES]}, group="study-b")["id"]
    assert service.wait(run)["state"] == "succeeded"
    log_in(page, service, f"/runs/{run}")
    page.locator("[data-role=rerun]").click()
    bar = page.locator("[data-role=editor-bar]")
    expect(bar.locator("[data-role=from-run]")).to_contain_text(f"#{run}")
    expect(page.locator("[data-role=workflow-group]")).to_have_value("study-b")
    expect(bar.locator("[data-role=download]")).to_be_visible()
    page.locator('[data-task="squares"] .task-id').click()
    # Its resources learned from the run, said as the CLI and the Executions say it.
    learned = page.locator("[data-role=task-estimate] [data-role=resources-source]")
    expect(learned).to_have_text(re.compile(r"^\(learned from [1-9]\d* runs?\)$"))
    expect(learned).to_have_attribute("title", LEARNED_FROM_RUNS)
    page.locator('[data-role=settings-form] [data-field="n"] input').fill("9")
    expect(bar.locator("[data-role=draft-state]")).to_have_text(
        "unsaved changes, download to keep them"
    )
    bar.locator("[data-role=run]").click()
    page.wait_for_url(re.compile(r"#/runs/\d{8}-\d{6}-[0-9a-f]{6}$"))
    again = page.url.rsplit("/", 1)[1]
    assert again != run
    expect(page.locator("[data-role=runbar] [data-role=state]")).to_have_text(
        "succeeded", timeout=30_000
    )
    view = service.client.get(f"/runs/{again}").json()
    assert view["group"] == "study-b"
    assert view["workflow"]["tasks"][0]["settings"] == {"n": 9, "sleep_s": 0.01}


def test_an_edit_session_that_does_not_exist_says_so(page, service, console):
    console.allow(f"{NETWORK_REFUSAL}: the server responded with a status of 404")
    log_in(page, service, "/edit/0123456789abcdef")
    expect(page.locator("[data-role=editor-error]")).to_contain_text(
        "no edit session 0123456789abcdef"
    )
    page.goto(page.url.split("#")[0] + "#/runs/20260101-000000-abcdef/edit")
    expect(page.locator("[data-role=editor-error]")).to_contain_text(
        "no run 20260101-000000-abcdef"
    )


def test_a_task_id_longer_than_the_service_takes_is_flagged_in_the_inspector(page, service, edit):
    """The Editor checks a task id with the limits of the service (`TASK_ID_MAX_CHARS`,
    generated from the OpenAPI document), not only its letters."""
    editing = edit("long-id", {"name": "long-id", "tasks": [SQUARES]})
    log_in(page, service, f"/edit/{editing.session}")
    page.locator('[data-task="squares"] .task-id').click()
    id_field = page.locator("[data-role=task-id]")
    problem = page.locator("[data-role=task-id-problem]")
    too_long = "s" * (TASK_ID_MAX_CHARS + 1)
    id_field.fill(too_long)
    id_field.dispatch_event("change")
    expect(page.locator(f'[data-task="{too_long}"]')).to_be_visible()
    expect(problem).to_have_text(
        f"an id has at most {TASK_ID_MAX_CHARS} characters, this one {TASK_ID_MAX_CHARS + 1}"
    )
    longest = "s" * TASK_ID_MAX_CHARS
    id_field.fill(longest)
    id_field.dispatch_event("change")
    expect(page.locator(f'[data-task="{longest}"]')).to_be_visible()
    expect(problem).to_have_count(0)
    id_field.fill("Squares")
    id_field.dispatch_event("change")
    expect(problem).to_contain_text("lower case letters")
