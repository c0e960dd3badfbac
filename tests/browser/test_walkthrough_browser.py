"""The walkthrough debugger in Debian's chromium, used as a learner uses it."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser


def step_of(page: Page) -> int:
    return int(re.search(r"/steps/(\d+)", page.url).group(1))


def test_walk_simple_ctx_forwards_and_back(page: Page, server_url: str, screenshot_dir):
    page.goto(f"{server_url}/")
    page.get_by_role("region", name="Start here").get_by_role("link", name="simple-ctx").click()
    expect(page).to_have_url(re.compile(r"/walkthroughs/simple-ctx/steps/0$"))
    prev, nxt = (page.get_by_role("button", name=n, exact=True) for n in ("Previous step", "Next step"))
    expect(prev).to_be_disabled()
    expect(page.locator("#source .call")).to_contain_text("ggml_init")

    seen = [0]
    while nxt.get_attribute("aria-disabled") is None:
        nxt.click()
        expect(page).to_have_url(re.compile(rf"/steps/{seen[-1] + 1}$"))
        seen.append(step_of(page))
        if page.locator(".kind").inner_text() == "node":
            page.screenshot(path=str(screenshot_dir / "walkthrough-node.png"), full_page=True)
    assert seen == list(range(len(seen)))
    expect(nxt).to_be_disabled()
    expect(page.locator("#graph .dag > svg")).to_be_visible()  # kept while the graph is the same
    page.get_by_role("tab", name="Values").click()  # the panels under the DAG are tabs
    values = page.get_by_role("table", name="values of node_0")
    expect(values).to_contain_text("60")
    for v in ("55", "110", "126", "64"):
        expect(values).to_contain_text(v)

    prev.click()  # back one step with the button, then with the browser's history
    expect(page).to_have_url(re.compile(rf"/steps/{seen[-2]}$"))
    page.go_back()
    expect(page).to_have_url(re.compile(rf"/steps/{seen[-1]}$"))


def test_reload_a_middle_step_and_use_the_keys(page: Page, server_url: str, screenshot_dir):
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/6")
    expect(page.locator("#source .call")).to_contain_text("ggml_mul_mat")
    page.reload()
    expect(page.locator("#source .call")).to_contain_text("ggml_mul_mat")
    expect(page.locator("#struct .gdb")).to_contain_text("op = GGML_OP_MUL_MAT")
    page.screenshot(path=str(screenshot_dir / "walkthrough-struct.png"), full_page=True)
    page.keyboard.press("ArrowRight")
    expect(page).to_have_url(re.compile(r"/steps/7$"))
    page.keyboard.press("ArrowRight")
    expect(page).to_have_url(re.compile(r"/steps/8$"))
    expect(page.locator("#source .call")).to_contain_text("visit")
    page.keyboard.press("ArrowLeft")
    expect(page).to_have_url(re.compile(r"/steps/7$"))


def test_select_a_tensor_in_the_graph_and_pool(page: Page, server_url: str, screenshot_dir):
    page.goto(f"{server_url}/walkthroughs/views-and-permute/steps/0")
    page.get_by_role("button", name="Next node").click()
    expect(page.locator(".kind")).to_have_text("node")
    page.locator("#graph .dag > svg a").first.click()  # a tensor in the DAG
    expect(page).to_have_url(re.compile(r"t=\d+\.\d+"))
    page.get_by_role("tab", name="Tensors").click()
    page.get_by_role("link", name="x", exact=True).click()  # the tensors table
    page.get_by_role("tab", name="Strides").click()
    expect(page.locator("#strides")).to_contain_text("ne = [4, 3, 2, 1]")
    page.screenshot(path=str(screenshot_dir / "walkthrough-views.png"), full_page=True)


def test_threads_and_thread_count(page: Page, server_url: str, screenshot_dir):
    page.goto(f"{server_url}/walkthroughs/threads/steps/0")
    page.get_by_role("button", name="Next node").click()
    shares = page.locator("#threads .shares li")
    expect(shares).to_have_count(4)
    expect(page.locator("#threads")).to_contain_text("chunk 0")
    page.screenshot(path=str(screenshot_dir / "walkthrough-threads.png"), full_page=True)
    page.get_by_label("Thread count").select_option("2")  # the trace is recorded again
    expect(page).to_have_url(re.compile(r"threads=2"))
    page.get_by_role("button", name="Next node").click()
    expect(page.locator("#threads .shares li")).to_have_count(2)


def test_unknown_walkthrough_is_a_page_not_a_traceback(page: Page, server_url: str):
    resp = page.goto(f"{server_url}/walkthroughs/no-such-program/steps/0")
    assert resp.status == 404
    expect(page.get_by_role("alert")).to_contain_text("There is no walkthrough named")
    page.get_by_role("link", name="Back to the start").click()
    expect(page.get_by_role("region", name="Start here").get_by_role("link", name="simple-ctx")).to_be_visible()


def test_the_kernel_tab_of_an_add_node(page: Page, server_url: str):
    """simple-add's ADD node: ggml's kernel, the numpy code that computed it, the first element
    worked through with the node's numbers, and the thread's rows."""
    page.goto(f"{server_url}/walkthroughs/simple-add/steps/0")
    page.get_by_role("button", name="Next node", exact=True).click()  # its one node
    expect(page.locator("#source .call")).to_contain_text("ADD")
    page.get_by_role("tab", name="Kernel").click()
    kernel = page.locator("#kernel")
    expect(kernel).to_contain_text("ggml_compute_forward_add")
    expect(kernel.locator("details.kernel-code pre.code").first).to_contain_text("def compute_forward_binary")
    expect(page.locator("#worked-element")).to_contain_text("src0[0] + src1[0]")
    expect(kernel.locator(".share")).to_contain_text("rows")
