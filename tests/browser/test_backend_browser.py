"""The ggml-backend walkthroughs in Debian's chromium: simple-backend's allocator plan and
buffers, and offload's scheduler passes, splits and copies."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from engine.programs import trace_program

pytestmark = pytest.mark.browser


def _first(kind: str, name: str, after: int = 0) -> int:
    return next(s.index for s in trace_program(name).steps if s.kind == kind and s.index >= after)


def test_simple_backend_plan_and_buffers(page: Page, server_url: str, screenshot_dir):
    """Step to the allocator's first decision, use the memory plan (click a bar: the tensor is
    selected everywhere), then to the computed node: the result is in the compute buffer."""
    k = _first("alloc", "simple-backend")
    page.goto(f"{server_url}/walkthroughs/simple-backend/steps/{k - 1}")
    page.keyboard.press("ArrowRight")
    expect(page).to_have_url(re.compile(rf"/steps/{k}$"))
    expect(page.locator("#source")).to_contain_text("gallocr: 'leaf_0' gets 32 bytes")
    page.get_by_role("tab", name="Memory plan").click()
    plan = page.locator("#plan")
    expect(plan).to_contain_text("buffer 0 (CPU), chunk 0")
    expect(plan.locator("rect.bar")).to_have_count(3)
    expect(plan.locator("rect.bar.current")).to_have_count(1)
    plan.locator("rect.bar").nth(2).click()  # node_0's bytes
    expect(page).to_have_url(re.compile(r"t=\d+\.\d+"))
    expect(page.locator("#struct .gdb")).to_contain_text("op = GGML_OP_MUL_MAT")
    expect(page.locator("#plan rect.bar.selected")).to_have_count(1)
    expect(page.locator("#buffers")).to_contain_text("CPU (compute)")
    page.screenshot(path=str(screenshot_dir / "walkthrough-plan.png"), full_page=True)
    page.get_by_role("button", name="Next node").click()
    expect(page.locator(".kind")).to_have_text("node")
    expect(page.locator("#buffers .changed")).to_have_count(1)  # the result's bytes were written
    page.get_by_role("tab", name="Values").click()
    expect(page.get_by_role("table", name="values of node_0")).to_contain_text("110")


def test_offload_passes_splits_and_copies(page: Page, server_url: str, screenshot_dir):
    """Pass 1 colours the DAG by backend; after the splits the graph shows them as clusters with
    the input copies; computing, a copy step fills the copy in the device's buffer."""
    first_pass = _first("pass", "offload")
    page.goto(f"{server_url}/walkthroughs/offload/steps/{first_pass}")
    expect(page.locator("#source")).to_contain_text("pass 1")
    expect(page.locator("#graph .backends")).to_contain_text("GPU0")
    expect(page.locator("#graph .backends")).to_contain_text("CPU")
    split = _first("split", "offload", first_pass)
    page.goto(f"{server_url}/walkthroughs/offload/steps/{split + 2}?expand=0")
    expect(page.locator("#graph .dag > svg g.cluster")).to_have_count(3)
    expect(page.locator("#graph .dag > svg")).to_contain_text("GPU0#inp_pos#0")
    copy = _first("copy", "offload", split)
    page.goto(f"{server_url}/walkthroughs/offload/steps/{copy}")
    expect(page.locator(".kind")).to_have_text("copy")
    expect(page.locator("#source")).to_contain_text("from CPU to GPU0")
    expect(page.locator("#buffers")).to_contain_text("device memory: the CPU cannot read it")
    expect(page.locator("#buffers .seg-device.changed")).to_have_count(1)
    page.screenshot(path=str(screenshot_dir / "walkthrough-offload.png"), full_page=True)
