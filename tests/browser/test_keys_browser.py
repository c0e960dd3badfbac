"""Every key press counts: presses that arrive while a step is loading are not dropped."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from engine.programs import trace_program

pytestmark = pytest.mark.browser


def test_twenty_quick_presses_land_twenty_steps_on(page: Page, server_url: str):
    page.goto(f"{server_url}/walkthroughs/attention-block/steps/0")
    for _ in range(20):
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(40)
    expect(page).to_have_url(re.compile(r"/steps/20$"))
    expect(page.locator("#stepnav output")).to_have_text(re.compile(r"^20 / "))
    for _ in range(7):  # back, faster than any step loads
        page.keyboard.press("ArrowLeft")
    expect(page).to_have_url(re.compile(r"/steps/13$"))


def test_a_held_key_scrubs_and_stops_at_the_end(page: Page, server_url: str):
    last = len(trace_program("simple-ctx").steps) - 1
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/0")
    page.keyboard.down("ArrowRight")  # a held key: the browser repeats keydown
    for _ in range(last + 10):
        page.keyboard.down("ArrowRight")
        page.wait_for_timeout(10)
    page.keyboard.up("ArrowRight")
    expect(page).to_have_url(re.compile(rf"/steps/{last}$"))


def test_queued_node_jumps_each_start_where_the_last_ended(page: Page, server_url: str):
    nodes = [s.index for s in trace_program("attention-block").steps if s.kind == "node"]
    page.goto(f"{server_url}/walkthroughs/attention-block/steps/0")
    for _ in range(3):
        page.keyboard.press("n")
    expect(page).to_have_url(re.compile(rf"/steps/{nodes[2]}$"))
