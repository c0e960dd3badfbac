"""The moe-routing walkthrough in Debian's chromium: a learner finds which experts each token
went to, and watches MUL_MAT_ID hand out each expert's chunks to the threads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from engine.programs import trace_program

pytestmark = pytest.mark.browser


def test_moe_routing(page: Page, server_url: str, screenshot_dir: Path):
    experts = trace_program("moe-routing").outputs["experts"]  # what the engine computed
    page.goto(f"{server_url}/")
    page.get_by_role("link", name="moe-routing").click()
    expect(page).to_have_url(re.compile(r"/walkthroughs/moe-routing/steps/0$"))
    for _ in range(4):  # the router's matmul, softmax, the argsort top-k, then the first MUL_MAT_ID
        page.get_by_role("button", name="Next node").click()
    expect(page.locator("#source")).to_contain_text("MUL_MAT_ID")
    page.get_by_role("tab", name="Tensors").click()
    page.get_by_role("link", name="ffn_moe_topk-0", exact=True).click()
    page.get_by_role("tab", name="Values").click()
    table = page.get_by_role("table", name="values of ffn_moe_topk-0")
    for token, (first, second) in enumerate(experts):  # row t: token t's two experts
        expect(table.locator("tr").nth(token)).to_have_text(re.compile(rf"^\s*{first}\s*{second}\s*$"))
    page.get_by_role("tab", name="Threads").click()
    threads = page.locator("#threads")
    for e in sorted({e for pair in experts for e in pair}):  # every chosen expert's chunks
        expect(threads).to_contain_text(f"chunk e{e}.0")
    expect(page.locator("#threads .shares li")).to_have_count(2)
    page.screenshot(path=str(screenshot_dir / "walkthrough-moe.png"), full_page=True)
