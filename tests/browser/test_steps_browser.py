"""The steps panel on a long trace (minilm): groups collapsed but the current one, jumps by
layer with the buttons and the [ ] keys, search by tensor name."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from engine.programs import trace_program

pytestmark = pytest.mark.browser


def test_minilm_steps_grouped_by_layer(page: Page, server_url: str, screenshot_dir):
    steps = trace_program("minilm").steps
    first = {layer: next(s.index for s in steps if s.layer == layer) for layer in (0, 1, 2)}
    page.goto(f"{server_url}/walkthroughs/minilm/steps/0")
    panel = page.locator("#steps")
    expect(panel.locator("li.sg.open")).to_have_count(1)  # only the group holding step 0 is open
    panel.get_by_role("button", name="Next layer").click()
    expect(page).to_have_url(re.compile(rf"/steps/{first[0]}$"))
    expect(panel.locator("li.sg.open > a").first).to_have_text("layer 0")
    page.keyboard.press("]")
    expect(page).to_have_url(re.compile(rf"/steps/{first[1]}$"))
    expect(panel.locator("li.current")).to_have_count(1)
    page.keyboard.press("ArrowRight")
    expect(page).to_have_url(re.compile(rf"/steps/{first[1] + 1}$"))
    page.keyboard.press("[")  # back to the start of layer 1, then to layer 0
    expect(page).to_have_url(re.compile(rf"/steps/{first[1]}$"))
    page.keyboard.press("[")
    expect(page).to_have_url(re.compile(rf"/steps/{first[0]}$"))
    page.screenshot(path=str(screenshot_dir / "walkthrough-steps.png"), full_page=True)
    panel.get_by_role("searchbox", name="Search steps").fill("blk.2.ffn_up.weight")
    panel.get_by_role("searchbox", name="Search steps").press("Enter")
    expect(page).to_have_url(re.compile(r"/search\?q=blk.2.ffn_up.weight"))
    page.get_by_role("link", name=re.compile(r"^step \d+$")).first.click()
    expect(page.locator("#debugger")).to_contain_text("blk.2.ffn_up.weight")
