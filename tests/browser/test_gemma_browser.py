"""The real model in Debian's chromium: the gemma3 walkthrough reads the learner's prompt, shows
the next token's odds and appends one; "Run it" on a Gemma GGUF in the inspector opens the same
walkthrough on that file."""

from __future__ import annotations

import re
import shutil

import pytest
from playwright.sync_api import Page, expect

from app.settings import Settings
from engine.programs import trace_program
from tests.browser.conftest import serving

pytestmark = pytest.mark.browser
RECORD_MS = 120_000  # a first visit records the trace (seconds on a slow machine)


@pytest.fixture(scope="module")
def gemma_url(tmp_path_factory, gemma_path):
    data = tmp_path_factory.mktemp("gemma-data")
    (data / "models").mkdir()
    (data / "models" / gemma_path.name).symlink_to(gemma_path)  # the bundled model
    mine = tmp_path_factory.mktemp("my-models")
    shutil.copyfile(gemma_path, mine / "my-gemma.gguf")  # a learner's own copy, to "Run it"
    with serving(Settings(data_dir=data, models_dir=mine)) as url:
        yield url


def test_a_prompt_its_next_token_and_one_more_pass(page: Page, gemma_url, screenshot_dir):
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{gemma_url}/walkthroughs/gemma3", timeout=RECORD_MS)
    expect(page).to_have_url(re.compile(r"/walkthroughs/gemma3/steps/0$"), timeout=RECORD_MS)
    prompt = page.locator("#prompt-in")
    expect(prompt).to_have_value("The capital of France is")
    prompt.fill("The capital of Italy is")
    page.get_by_role("button", name="Run").click()
    # a new prompt takes seconds to record: its progress shows first, then the debugger
    expect(page.locator("#recording")).to_be_visible()
    expect(page.locator("#recording .status")).to_contain_text("running for")
    page.screenshot(path=str(screenshot_dir / "gemma3-recording.png"))
    expect(page).to_have_url(re.compile(r"/steps/0\?prompt=The%20capital%20of%20Italy%20is"),
                             timeout=RECORD_MS)
    expect(page.locator("#answer .tokens")).to_contain_text("Italy")
    expect(page.locator("#answer .tokens code.tok").nth(1)).to_have_text("The")
    expect(page.locator("#answer .tokens code.tok").nth(2)).to_have_text("␣capital")  # a space made visible
    page.get_by_role("tab", name="Next token").click()
    table = page.locator("#nexttoken table.top10").first
    expect(table).to_be_visible()
    expect(table.locator("tr")).to_have_count(10)
    first = table.locator("tr").first.locator("code.tok").inner_text()
    table.locator("tr").first.get_by_role("link", name="append").click()
    # the new pass opens at its first step
    expect(page).to_have_url(re.compile(r"/steps/\d+\?.*then=\d+"), timeout=RECORD_MS)
    opened = re.search(r"/steps/(\d+)", page.url).group(1)
    expect(page.locator("#steps li.sg-pass.open > a")).to_have_attribute("href", re.compile(rf"/steps/{opened}\?"))
    expect(page.locator("#answer .tokens")).to_contain_text("1 appended")
    expect(page.locator("#answer code.tok.appended")).to_have_text(first)
    page.get_by_role("tab", name="Next token").click()
    expect(page.locator("#nexttoken table.top10")).to_have_count(2)
    # step into the last layer's attention: the nodes are named as llama.cpp names them
    page.goto(re.sub(r"/steps/\d+", "/steps/2300", page.url))
    expect(page.locator("#debugger")).to_be_visible()
    page.screenshot(path=str(screenshot_dir / "gemma3-walkthrough.png"))


def test_run_it_on_a_gemma_file(page: Page, gemma_url):
    page.goto(f"{gemma_url}/gguf")
    page.get_by_role("link", name="my-gemma.gguf").click()
    expect(page.locator("main")).to_contain_text("gemma3")
    # recording takes a while: the URL is awaited below
    page.get_by_role("link", name="Run it").click(no_wait_after=True)
    expect(page).to_have_url(re.compile(r"/walkthroughs/gemma3/steps/0\?file=[0-9a-f]{64}"),
                             timeout=RECORD_MS)
    expect(page.locator("#answer .tokens")).to_contain_text("<bos>")


def test_the_first_screen_and_the_search_in_folded_layers(page: Page, gemma_url):
    """Step 0 of gemma3 says in one sentence what gguf_init_from_file made (the list one click
    away); at a node past step 1500 a search for a weight of a folded layer opens that layer and centres it."""
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{gemma_url}/walkthroughs/gemma3/steps/0", timeout=RECORD_MS)
    expect(page).to_have_url(re.compile(r"/walkthroughs/gemma3/steps/0$"), timeout=RECORD_MS)
    note = page.locator("#source .note")
    expect(note).to_contain_text("made 237 objects")
    assert note.bounding_box()["height"] < 300, "the caption does not fit the first screen"
    expect(page.locator("#source pre.code")).to_be_in_viewport()
    page.locator("#source details.objects summary").click()
    expect(page.locator("#source details.objects tbody tr")).to_have_count(237)

    node = next(s.index for s in trace_program("gemma3").steps[1500:] if s.kind == "node")
    page.goto(f"{gemma_url}/walkthroughs/gemma3/steps/{node}", timeout=RECORD_MS)
    expect(page).to_have_url(re.compile(rf"/walkthroughs/gemma3/steps/{node}$"), timeout=RECORD_MS)
    expect(page.locator("#graph .dag > svg")).to_be_visible()
    current = page.locator("#graph").get_attribute("data-current")
    assert current
    expect(page.locator(f'#graph g[id="{current}"]')).to_be_in_viewport()  # in view at first draw
    find = page.locator("#graph .dagfind")
    find.fill("blk.5.ffn_up.weight")
    find.press("Enter")
    expect(page).to_have_url(re.compile(r"expand=5"))
    hit = page.locator("#graph g.node.found")
    expect(hit).to_have_count(1, timeout=RECORD_MS)  # (graphviz draws the opened layer first)
    expect(hit).to_be_in_viewport()
    expect(page.locator("#graph .dagfound")).to_have_text("1 found")


def test_the_kernel_tab_works_a_q4_k_block(page: Page, gemma_url, screenshot_dir):
    """A learner searches for the attention output's product, opens its node and the Kernel
    tab: ggml's kernel and inner function, the numpy twin's source, one Q4_K block worked
    through to the value the node holds; then the next block, and the same tab in Chinese."""
    page.set_viewport_size({"width": 1440, "height": 1000})
    page.goto(f"{gemma_url}/walkthroughs/gemma3/steps/0", timeout=RECORD_MS)
    expect(page).to_have_url(re.compile(r"/walkthroughs/gemma3/steps/0$"), timeout=RECORD_MS)
    page.goto(f"{gemma_url}/walkthroughs/gemma3/search?q=attn_out-0")
    page.locator("ol.results li", has_text="MUL_MAT -> 'attn_out-0'").get_by_role("link").click()
    page.get_by_role("tab", name="Kernel").click()
    kernel = page.locator("#kernel")
    expect(kernel).to_contain_text("ggml_compute_forward_mul_mat")
    expect(kernel).to_contain_text("ggml_vec_dot_q4_K_q8_K")
    expect(kernel).to_contain_text("engine._lanes.quant_dot")
    twin = kernel.locator("details.kernel-code", has_text="numpy twin").last
    expect(twin.locator("pre.code")).to_contain_text("def quant_dot")
    expect(twin.locator("pre.code .nf").first).to_be_visible()  # highlighted
    worked = page.locator("#worked-block")
    expect(worked).to_contain_text("The weight block (q4_K)")
    expect(worked).to_contain_text("dmin")
    expect(worked.locator("table.lanes tbody tr")).to_have_count(8)
    expect(worked.locator(".same")).to_be_visible()  # the row's sum is the node's value
    page.screenshot(path=str(screenshot_dir / "kernel-q4k.png"))
    page.get_by_role("link", name="next block").click()
    expect(page).to_have_url(re.compile(r"block=1"))
    expect(page.locator("#kernel h3", has_text="block 1 of")).to_be_visible()
    page.goto(page.url + "&lang=zh")
    page.get_by_role("tab", name="内核").click()
    expect(page.locator("#kernel")).to_contain_text("8 个通道和与融合乘加")
