"""The address bar and the title are the step shown, after every kind of navigation; every click
on a step button counts, however fast; Back and Forward move between steps."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from engine.programs import trace_program

pytestmark = pytest.mark.browser


def shown(page: Page) -> int:
    return int(page.locator("#stepnav input[type=range]").get_attribute("value"))


def expect_step(page: Page, n: int) -> None:
    """The page, the address bar and the title all say step n."""
    expect(page.locator("#stepnav output")).to_have_text(re.compile(rf"^{n} / "))
    expect(page).to_have_url(re.compile(rf"/steps/{n}(\?|$)"))
    expect(page).to_have_title(re.compile(rf"· step {n} ·"))


def test_url_and_title_follow_every_kind_of_navigation(page: Page, server_url: str):
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/0")
    expect_step(page, 0)
    for _ in range(5):
        page.keyboard.press("ArrowRight")
    expect_step(page, 5)
    page.get_by_role("button", name="Next step").click()  # a click after keys
    expect_step(page, 6)
    page.get_by_role("button", name="Previous step").click()
    expect_step(page, 5)
    page.locator("#steps a[href*='/steps/2']").first.click()  # a link in the steps list
    expect_step(page, 2)
    page.locator("#stepnav input[type=range]").fill("7")  # the scrubber
    expect_step(page, 7)
    page.get_by_role("tab", name="Tensors").click()
    page.locator("#tensors td a").first.click()  # a tensor link: the same step, a selection
    expect(page).to_have_url(re.compile(r"/steps/7\?t=\d+\.\d+$"))
    expect_step(page, 7)
    page.go_back()
    expect_step(page, 7)
    expect(page).to_have_url(re.compile(r"/steps/7$"))  # (the selection's entry left, not only the step shown)
    page.go_back()
    expect_step(page, 2)
    page.go_back()
    expect_step(page, 5)
    page.go_forward()
    expect_step(page, 2)


def test_ten_fast_clicks_on_next_node_land_ten_nodes_on(page: Page, server_url: str):
    nodes = [s.index for s in trace_program("moe-routing").steps if s.kind == "node"]
    page.goto(f"{server_url}/walkthroughs/moe-routing/steps/0")
    button = page.get_by_role("button", name="Next node")
    for _ in range(10):
        button.click(delay=0)
    expect_step(page, nodes[9])
