"""The repack walkthrough in Debian's chromium: the weight's bar in the CPU_REPACK buffer opens it,
the Repacked tab draws its interleaved block against the 8 plain ones, the block picker moves to
another group and column, and the threads tab says which rows went through gemm and gemv."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.support.recorded import recorded

pytestmark = pytest.mark.browser


def _step(call: str) -> int:
    return next(s.index for s in recorded("repack").steps if s.call.startswith(call))


def test_the_repacked_weights_blocks(page: Page, server_url: str, screenshot_dir):
    k = _step("ggml_backend_tensor_set(w")
    page.goto(f"{server_url}/walkthroughs/repack/steps/{k}")
    page.get_by_role("tab", name="Buffers").click()
    buffers = page.locator("#buffers")
    expect(buffers).to_contain_text("CPU_REPACK (weights, is_host = no")
    buffers.get_by_role("list", name=re.compile("tensors in buffer")).first.get_by_role(
        "listitem").first.click()  # w's bytes, the only tensor in the CPU_REPACK buffer
    expect(page).to_have_url(re.compile(r"t=\d+\.\d+"))
    page.get_by_role("tab", name="Repacked").click()
    panel = page.locator("#repacked")
    expect(panel.locator(".rplayout")).to_have_text("q4_0_8x8")
    interleaved = panel.get_by_role("table", name="interleaved block")
    expect(interleaved.locator(".hb")).to_have_count(144)
    expect(interleaved.locator(".hb").first).to_have_attribute("title", "byte 0: from row 0's d (byte 0)")
    expect(panel.get_by_role("table", name="plain blocks").locator(".hb")).to_have_count(144)
    expect(panel).to_contain_text("128 bytes are stored XOR 0x88")
    panel.get_by_role("spinbutton", name="Row").fill("11")
    panel.get_by_role("spinbutton", name="Block").fill("5")
    panel.get_by_role("button", name="Show block").click()
    expect(page).to_have_url(re.compile(r"row=11&block=5"))
    expect(page.locator("#repacked")).to_contain_text("Group 1 of 2 (rows 8–15), block column 5 of 8")
    expect(page.locator("#repacked .rpb.picked")).to_have_count(18 + 18)  # row 11's plain block, its bytes
    box = page.locator("#repacked").evaluate(  # in the page's coordinates (the sticky step bar stays on top)
        "e => { const r = e.getBoundingClientRect(); "
        "return {x: r.x + scrollX, y: r.y + scrollY, width: r.width, height: r.height}; }")
    page.screenshot(path=str(screenshot_dir / "walkthrough-repack.png"), full_page=True, clip=box)

    node = next(s.index for s in recorded("repack").steps if s.kind == "node" and s.call.endswith("'y5'"))
    page.goto(f"{server_url}/walkthroughs/repack/steps/{node}")
    page.get_by_role("tab", name="Threads").click()
    expect(page.locator("#threads .gemmrows")).to_contain_text("rows 0–3 of x5 went through gemm")
    expect(page.locator("#threads .gemmrows")).to_contain_text("row 4 of x5 went through gemv")
