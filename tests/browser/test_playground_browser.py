"""The playground in Debian's chromium: fork views-and-permute, change the permute, run it and
step to the changed nb; a failing ggml_reshape_2d shows ggml's assertion at its line; the
permalink opens the same trace in a fresh browser; a syntax error is marked in the editor."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from app.routes.playground import STARTER

pytestmark = pytest.mark.browser


def _replace_in_editor(page: Page, old: str, new: str) -> None:
    """Select `old` in the editor, as a learner would with the mouse, and type `new` over it."""
    page.wait_for_function("window.playgroundEditor !== undefined")
    page.evaluate("""([old]) => {
        const cm = window.playgroundEditor, text = cm.getValue(), at = text.indexOf(old);
        cm.focus();
        cm.setSelection(cm.posFromIndex(at), cm.posFromIndex(at + old.length));
    }""", [old])
    page.keyboard.type(new)


def _step_to_line(page: Page, text: str) -> None:
    """Press Next step until the step's line holds `text` (each press waits for its step)."""
    for _ in range(40):
        if text in (page.locator("#source .line.current").text_content() or ""):
            return
        n = int(re.search(r"/steps/(\d+)", page.url).group(1))
        page.get_by_role("button", name="Next step").click()
        expect(page).to_have_url(re.compile(rf"/steps/{n + 1}(\?|$)"))
        expect(page.locator("#stepnav output")).to_contain_text(f"{n + 1} /")
    raise AssertionError(f"no step at a line with {text!r}")


def test_fork_change_the_permute_and_see_nb(page: Page, server_url: str, screenshot_dir: Path):
    page.goto(f"{server_url}/walkthroughs/views-and-permute/steps/0")
    page.get_by_role("link", name="Edit a copy").click()
    expect(page).to_have_url(re.compile(r"/playground\?from=views-and-permute$"))
    expect(page.locator(".CodeMirror")).to_contain_text("ggml_permute(ctx, x, 1, 0, 2, 3)")
    expect(page.locator(".CodeMirror-linenumber").first).to_be_visible()  # a real editor
    _replace_in_editor(page, "x, 1, 0, 2, 3)", "x, 2, 0, 1, 3)")
    expect(page.locator(".CodeMirror")).to_contain_text("ggml_permute(ctx, x, 2, 0, 1, 3)")
    page.screenshot(path=str(screenshot_dir / "playground.png"), full_page=True)
    page.keyboard.press("Control+Enter")
    expect(page).to_have_url(re.compile(r"/programs/[0-9a-f]{64}/steps/0$"))
    _step_to_line(page, "p = ggml_permute(ctx, x, 2, 0, 1, 3)")
    struct = page.locator("#struct")
    expect(struct).to_contain_text("ne = {3, 2, 4, 1}")
    expect(struct).to_contain_text("nb = {16, 48, 4, 96}")
    page.screenshot(path=str(screenshot_dir / "playground-run.png"), full_page=True)


def test_a_failing_reshape_shows_the_assertion_at_its_line(page: Page, server_url: str, browser: Browser,
                                                          screenshot_dir: Path):
    page.goto(f"{server_url}/playground")
    _replace_in_editor(page, "ggml_reshape_2d(ctx, a, 3, 4)", "ggml_reshape_2d(ctx, a, 5, 4)")
    page.get_by_role("button", name="Run").click()
    expect(page).to_have_url(re.compile(r"/programs/[0-9a-f]{64}/steps/\d+$"))
    line = next(i + 1 for i, t in enumerate(STARTER.splitlines()) if "ggml_reshape_2d" in t)
    error_line = page.locator("#source .line.current.error")
    expect(error_line).to_contain_text("ggml_reshape_2d(ctx, a, 5, 4)")
    expect(error_line.locator(".ln")).to_have_text(str(line))
    expect(page.locator("#source .note")).to_contain_text(
        "ggml_reshape_2d: GGML_ASSERT(ggml_nelements(a) == ne0*ne1) failed: a ('a') has 12 elements, 5×4 = 20")
    page.screenshot(path=str(screenshot_dir / "playground-error.png"), full_page=True)
    # every step before it stays steppable
    error_step = int(re.search(r"/steps/(\d+)$", page.url).group(1))
    page.get_by_role("button", name="Previous step").click()
    expect(page).to_have_url(re.compile(rf"/steps/{error_step - 1}$"))
    expect(page.locator("#source .line.current.error")).to_have_count(0)
    expect(page.locator("#source .line.current")).to_contain_text("set_data(a,")

    # the permalink, in a fresh browser context (no cookies, no cache): the same trace
    url = page.url
    fresh = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        other = fresh.new_page()
        other.goto(url)
        expect(other.locator("#source .line.current")).to_contain_text("set_data(a,")
        other.get_by_role("button", name="Next step").click()
        expect(other.locator("#source .line.current.error")).to_contain_text("ggml_reshape_2d(ctx, a, 5, 4)")
    finally:
        fresh.close()


def test_a_syntax_error_is_marked_in_the_editor(page: Page, server_url: str):
    page.goto(f"{server_url}/playground")
    _replace_in_editor(page, "c = ggml_add(ctx, b, b)", "c = ggml_add(ctx, b, b")
    page.keyboard.press("Control+Enter")
    expect(page.get_by_role("alert")).to_contain_text("This program cannot be read")
    line = next(i + 1 for i, t in enumerate(STARTER.splitlines()) if "ggml_add" in t)
    expect(page.get_by_role("alert")).to_contain_text(f"line {line}: SyntaxError: '(' was never closed")
    marked = page.locator(".CodeMirror-code > div").filter(has=page.locator(".refused-line"))
    expect(marked).to_have_count(1)
    expect(marked).to_contain_text("c = ggml_add(ctx, b, b")
    assert "ggml_add(ctx, b, b" in page.evaluate("window.playgroundEditor.getValue()")  # kept


def test_a_printed_array_shows_as_python_prints_it(page: Page, server_url: str):
    """The first thing a learner prints is an array (it once ended the program with 'Unable to
    configure default ndarray.__str__')."""
    page.goto(f"{server_url}/playground")
    _replace_in_editor(page, "c = ggml_add(ctx, b, b)", "c = ggml_add(ctx, b, b)\nprint(to_numpy(a))")
    page.keyboard.press("Control+Enter")
    expect(page).to_have_url(re.compile(r"/programs/[0-9a-f]{64}/steps/0$"))
    printed = page.locator("#source pre.printed")
    expect(printed).to_have_text("[[ 0.  1.  2.  3.]\n [ 4.  5.  6.  7.]\n [ 8.  9. 10. 11.]]")
    expect(page.locator("#source .line.current.error")).to_have_count(0)
