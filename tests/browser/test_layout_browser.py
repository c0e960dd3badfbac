"""The debugger as a learner sees it: the program, the step's explanation, the memory picture and
the DAG in view together; the other panels as remembered tabs; a zoomable DAG and memory map.
Screenshots at 1440x900, 1280x800 and on a 390-px phone."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, Page, expect

from engine.programs import trace_program

pytestmark = pytest.mark.browser


def _nodes(name: str) -> list[int]:
    return [s.index for s in trace_program(name).steps if s.kind == "node"]


def _in_view(page: Page, selector: str) -> bool:
    box = page.locator(selector).first.bounding_box()
    vp = page.viewport_size
    return box is not None and box["y"] >= 0 and box["y"] + min(box["height"], 120) <= vp["height"] \
        and box["x"] + box["width"] <= vp["width"] + 1


@pytest.mark.parametrize("width,height", [(1440, 900), (1280, 800)])
def test_source_note_pool_and_dag_in_view(browser: Browser, server_url: str, screenshot_dir,
                                          width: int, height: int):
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    node = _nodes("attention-block")[2]
    page.goto(f"{server_url}/walkthroughs/attention-block/steps/{node}")
    for sel in ("#source .note", "#source .line.current", "#pool .poolbar", "#graph .dag > svg",
                "#debugger .tabs"):
        assert _in_view(page, sel), f"{sel} is not in view at {width}x{height}"
    # the longest source line is not cut: it wraps inside the panel
    assert page.evaluate("() => { const p = document.querySelector('#source pre');"
                         " return p.scrollWidth <= p.clientWidth + 1; }")
    page.screenshot(path=str(screenshot_dir / f"layout-{width}.png"))
    context.close()


def test_a_phone_gets_one_column(browser: Browser, server_url: str, screenshot_dir):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/12")
    boxes = [page.locator(panel).bounding_box() for panel in ("#source", "#pool", "#graph", "#steps")]
    for upper, lower in zip(boxes, boxes[1:]):  # stacked, not side by side: the steps list last
        assert lower["y"] >= upper["y"] + upper["height"] - 1
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390 + 1
    page.screenshot(path=str(screenshot_dir / "layout-phone.png"), full_page=True)
    context.close()


def test_tabs_are_remembered(page: Page, server_url: str):
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/6")
    expect(page.locator("#struct")).to_be_visible()
    expect(page.locator("#hexview")).to_be_hidden()
    page.get_by_role("tab", name="Bytes").click()
    expect(page.locator("#hexview")).to_be_visible()
    expect(page.locator("#struct")).to_be_hidden()
    page.keyboard.press("ArrowRight")
    expect(page).to_have_url(re.compile(r"/steps/7$"))
    expect(page.locator("#hexview")).to_be_visible()  # kept across steps
    page.reload()
    expect(page.get_by_role("tab", name="Bytes")).to_have_attribute("aria-selected", "true")


def _view_box(page: Page) -> list[float]:
    return [float(x) for x in page.locator("#graph .dag > svg").get_attribute("viewBox").split()]


def test_dag_zoom_fit_find_and_follow(page: Page, server_url: str, screenshot_dir):
    nodes = _nodes("attention-block")
    page.goto(f"{server_url}/walkthroughs/attention-block/steps/{nodes[0]}")
    page.get_by_role("button", name="Fit").click()
    whole = _view_box(page)
    page.get_by_role("button", name="zoom in").click()
    page.get_by_role("button", name="zoom in").click()
    zoomed = _view_box(page)
    assert zoomed[2] < whole[2] * 0.6
    box = page.locator("#graph .dag").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.wheel(0, 400)  # out again with the wheel
    assert _view_box(page)[2] > zoomed[2]
    page.mouse.down()  # drag: the view pans, nothing is clicked
    page.mouse.move(box["x"] + box["width"] / 2 + 120, box["y"] + box["height"] / 2 + 40, steps=5)
    page.mouse.up()
    panned = _view_box(page)
    assert panned[0] != zoomed[0] and page.url.endswith(f"/steps/{nodes[0]}")
    page.get_by_label("find a tensor in the graph").fill("kq_soft_max")
    expect(page.locator("#graph .dagfound")).to_have_text("1 found")
    expect(page.locator("#graph .dag > svg g.node.found")).to_have_count(1)
    page.get_by_role("button", name="zoom in").click()
    page.get_by_role("button", name="zoom in").click()
    page.get_by_role("button", name="zoom in").click()
    for k in nodes[1:6]:  # stepping node by node: the current node stays in the view
        page.get_by_role("button", name="Next node").click()
        expect(page).to_have_url(re.compile(rf"/steps/{k}$"))
        page.wait_for_function("""() => {
            const svg = document.querySelector('#graph .dag > svg');
            const id = document.querySelector('#graph').dataset.current;
            const g = svg.querySelector(`g[id="${id}"]`).getBoundingClientRect();
            const r = svg.getBoundingClientRect();
            return g.left >= r.left - 1 && g.right <= r.right + 1 && g.top >= r.top - 1 && g.bottom <= r.bottom + 1;
        }""", timeout=5000)  # the current node is (or comes) into the view
    page.screenshot(path=str(screenshot_dir / "dag-zoom.png"))


def test_memory_map_zooms_to_bytes_and_selects(page: Page, server_url: str, screenshot_dir):
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/2")
    track = page.locator("#pool .memmap .memtrack").first
    expect(track).to_be_hidden()  # the bar above shows the whole pool until the learner zooms
    page.get_by_role("button", name="This step").first.click()  # around what step 2 reserved
    expect(track).to_be_visible()
    expect(track.locator(".seg", has_text="tensor struct").first).to_be_visible()  # labelled: wide
    for _ in range(8):
        page.get_by_role("button", name="zoom the memory map in").first.click()
    expect(page.locator("#pool .memrange").first).to_contain_text("(16 of 84,432)")
    expect(track.locator(".bytetick")).to_have_count(16)  # single bytes
    page.get_by_role("button", name="zoom the memory map out").first.click()
    expect(page.locator("#pool .memrange").first).to_contain_text("(32 of 84,432)")
    page.get_by_role("button", name="Whole pool").first.click()
    expect(track).to_be_hidden()
    page.get_by_role("button", name="This step").first.click()
    seg = track.locator("a.seg-struct").first
    assert "tensor" in (seg.get_attribute("title") or "")  # hover shows the object
    page.screenshot(path=str(screenshot_dir / "memory-map.png"))
    seg.click()
    expect(page).to_have_url(re.compile(r"t=0\.\d+"))
    expect(page.locator("#struct .gdb")).to_contain_text("type = GGML_TYPE_F32")
