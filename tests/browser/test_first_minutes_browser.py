"""A learner's first minutes (issue 49), on walkthroughs that need no model file: Back and Forward
raise no page error and keep the tab; the thread count keeps the step; the home page says where to
start and the step buttons show their keys; the mem_size tab's table and note say the same numbers;
the Threads tab summarises n_tasks; search results say a step's kind once; the graph says it is
drawing, runs a search typed meanwhile when it arrives, and offers to draw again."""

from __future__ import annotations

import re
import threading

import pytest
from playwright.sync_api import Page, expect

from app.settings import Settings
from app.views.debugger import graph as G
from engine.core.accountant import account
from engine.programs import trace_program
from tests.browser.conftest import serving

pytestmark = pytest.mark.browser


def errors_of(page: Page) -> list[str]:
    """The page's uncaught errors, as they happen."""
    seen: list[str] = []
    page.on("pageerror", lambda e: seen.append(str(e)))
    return seen


def test_back_and_forward_raise_no_page_error_and_keep_the_tab(page: Page, server_url: str):
    errors = errors_of(page)
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/0")
    page.get_by_role("tab", name="Threads").click()
    for k in (1, 2, 3):  # each step its own history entry
        page.keyboard.press("ArrowRight")
        expect(page).to_have_url(re.compile(rf"/steps/{k}$"))
    for back in (2, 1):
        page.go_back()
        expect(page.locator("#stepnav output")).to_have_text(re.compile(rf"^{back} / "))
    page.go_forward()
    expect(page.locator("#stepnav output")).to_have_text(re.compile(r"^2 / "))
    expect(page).to_have_title(re.compile(r"· step 2 ·"))
    assert errors == []  # (the debugger's script ran again: "Identifier 'keys' has already been declared")
    expect(page.get_by_role("tab", name="Threads")).to_have_attribute("aria-selected", "true")
    page.keyboard.press("ArrowRight")  # the keys still work, once each (no second listener)
    expect(page).to_have_url(re.compile(r"/steps/3$"))
    page.wait_for_timeout(300)
    expect(page).to_have_url(re.compile(r"/steps/3$"))
    assert errors == []


def test_a_new_thread_count_keeps_the_step(page: Page, server_url: str):
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/12")
    page.get_by_label("Thread count").select_option("3")
    expect(page).to_have_url(re.compile(r"/walkthroughs/simple-ctx/steps/12\?threads=3$"))
    expect(page.locator("#stepnav output")).to_have_text(re.compile(r"^12 / "))
    expect(page.locator("#threads")).to_contain_text("3 threads")


def test_home_says_where_to_start_and_the_buttons_show_their_keys(page: Page, server_url: str):
    page.goto(server_url)
    start = page.locator("section.start")
    expect(start.get_by_role("heading", name="Start here")).to_be_visible()
    for key in ("←", "→", "c", "n", "[", "]"):
        expect(start.locator("kbd", has_text=key).first).to_be_visible()
    playground = page.get_by_role("link", name="Write a program of your own")
    expect(playground).to_have_attribute("href", "/playground")
    start.get_by_role("link", name="simple-ctx").click()
    expect(page).to_have_url(re.compile(r"/walkthroughs/simple-ctx/steps/0$"))
    for name, key in (("Previous step", "←"), ("Next step", "→"), ("Next call", "c"), ("Next node", "n"),
                      ("Previous layer", "["), ("Next layer", "]")):
        button = page.get_by_role("button", name=name, exact=True)  # the key is not in its name
        expect(button.locator("kbd")).to_have_text(key)


def test_mem_size_table_and_note_say_the_same_numbers(page: Page, server_url: str):
    trace = trace_program("simple-ctx")
    last = len(trace.steps) - 1
    acc = account(trace.state_at(last).contexts[0])
    assert acc.data_padding and acc.graph_padding and len(acc.work_buffers) == 1  # what is compared
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/{last}")
    page.get_by_role("tab", name="mem_size").click()
    panel = page.locator("#accountant")

    def row(label: str):
        return panel.locator("tr", has=page.locator("td", has_text=re.compile(rf"^{label}$")))

    expect(row("data padding").locator("td.num")).to_have_text(str(acc.data_padding))
    expect(row("graph padding").locator("td.num")).to_have_text(str(acc.graph_padding))
    expect(row("work buffers").locator("td.num")).to_have_text(str(acc.work))
    expect(row("work buffers")).to_contain_text("1 × ggml_graph_plan's work_size")
    note = panel.locator(".acct-note").first
    expect(note).to_contain_text(
        f"{acc.data_padding} bytes of data padding and 1 work buffer of 32 + {acc.work} bytes")
    expect(note).to_contain_text(f"the pool used {acc.data_padding + 32 + acc.work} bytes more")


def test_threads_tab_summarises_n_tasks(page: Page, server_url: str):
    trace = trace_program("attention-block")
    node = next(s for s in trace.steps if s.kind == "node")
    n_nodes = len(trace.steps[node.parent].plan.n_tasks)
    page.goto(f"{server_url}/walkthroughs/attention-block/steps/{node.index}")
    page.get_by_role("tab", name="Threads").click()
    runs = page.locator("#threads .taskruns")
    expect(runs).to_have_text(f"1 at nodes 0–{n_nodes - 1}")  # not "1, 1, 1, …" once per node


def test_search_names_a_steps_kind_once(page: Page, server_url: str):
    page.goto(f"{server_url}/walkthroughs/simple-ctx/search?q=node_0")
    results = page.locator("ol.results")
    expect(results).to_contain_text("visit 'node_0'")
    expect(results).not_to_contain_text("visit visit")
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/10")  # the steps panel: the same lines
    expect(page.locator("#steps li.current")).to_have_text(re.compile(r"^visit 'node_0'$"))


@pytest.fixture(scope="module")
def fresh_url(tmp_path_factory):
    """The app with nothing drawn yet (its graph drawings are its own)."""
    with serving(Settings(data_dir=tmp_path_factory.mktemp("lens-fresh"))) as url:
        yield url


def test_the_graph_says_it_is_drawing_queues_a_search_and_offers_a_retry(page: Page, fresh_url: str,
                                                                         monkeypatch):
    """tiny-llama's graph (71 nodes: folded, drawn after the page): while graphviz works the panel
    says so and a search waits for the drawing; graphviz stopped at its limit is said, with a
    button that draws it again."""
    draw = G.render_svg
    go = threading.Event()

    def slow(dot: str) -> str:
        go.wait(30)
        return draw(dot)

    monkeypatch.setattr(G, "render_svg", slow)
    node = next(s.index for s in trace_program("tiny-llama").steps if s.kind == "node")
    page.goto(f"{fresh_url}/walkthroughs/tiny-llama/steps/{node}")
    dag = page.locator("#graph .dag")
    expect(dag.get_by_role("status")).to_contain_text("Drawing the graph…")
    page.locator("#graph .dagfind").fill("node_0")
    expect(page.locator("#graph .dagfound")).to_have_text("searching when the drawing arrives…")
    go.set()
    expect(dag.locator(":scope > svg")).to_be_visible()
    expect(page.locator("#graph .dagfound")).to_have_text(re.compile(r"^\d+ found$"))  # the search ran
    expect(page.locator("#graph g.node.found").first).to_be_in_viewport()

    def stopped(dot: str) -> str:
        raise G.NotDrawnInTime(G._message_svg("Graphviz did not finish drawing this graph in 20 s."))

    monkeypatch.setattr(G, "render_svg", stopped)
    page.goto(f"{fresh_url}/walkthroughs/tiny-llama/steps/{node}?t=0.0")  # (another drawing: layer 0 open)
    expect(dag.get_by_role("alert")).to_contain_text("did not finish drawing this graph in 20 s")
    monkeypatch.setattr(G, "render_svg", draw)
    dag.get_by_role("button", name="Draw it again").click()
    expect(dag.locator(":scope > svg")).to_be_visible()


def test_800_px_shows_the_pool_and_the_graph_first_and_1280_one_toolbar_line(page: Page, server_url: str,
                                                                                screenshot_dir):
    page.set_viewport_size({"width": 800, "height": 900})
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/12")
    expect(page.locator("#source .line.current")).to_be_in_viewport()
    expect(page.locator("#pool .poolbar")).to_be_in_viewport(ratio=1)
    expect(page.locator("#graph .dag > svg")).to_be_in_viewport()
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 800
    page.screenshot(path=str(screenshot_dir / "layout-800.png"))
    page.set_viewport_size({"width": 1280, "height": 900})
    boxes = page.locator("#stepnav > *").evaluate_all(
        "els => els.map(e => e.getBoundingClientRect()).filter(r => r.height).map(r => [r.top, r.bottom])")
    assert max(top for top, _ in boxes) < min(bottom for _, bottom in boxes), f"two lines at 1280 px: {boxes}"


def test_the_gguf_tensor_table_fits_800_px(page: Page, server_url: str):
    page.set_viewport_size({"width": 800, "height": 900})
    page.goto(f"{server_url}/gguf")
    page.get_by_role("link", name="minilm-q8_0.gguf").first.click()
    table = page.locator("table.grid.tensors")
    expect(table).to_be_visible()
    assert table.bounding_box()["x"] + table.bounding_box()["width"] <= 800
    assert page.evaluate("document.scrollingElement.scrollWidth") <= 800
