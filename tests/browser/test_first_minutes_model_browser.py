"""A learner's first minutes with the bundled model (issue 49): a long prompt's tokens wrap (no
sideways scroll), a prompt's lines survive Run, a new prompt keeps the step, "append" opens the
new pass and "remove the last" the pass before, the recording page stops polling once it is sent
on, the page names the file it runs, and a layer's first step opens that layer in the graph."""

from __future__ import annotations

import re
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import Page, expect

from app.settings import Settings
from engine.programs import trace_program
from tests.browser.conftest import serving

pytestmark = pytest.mark.browser
RECORD_MS = 120_000  # a new prompt is recorded first (seconds; more on a busy machine)
FORTY_WORDS = " ".join(["the quick brown fox jumps over the lazy dog and"] * 4)


@pytest.fixture(scope="module")
def gemma_url(tmp_path_factory, gemma_path):
    data = tmp_path_factory.mktemp("gemma-data")
    (data / "models").mkdir()
    (data / "models" / gemma_path.name).symlink_to(gemma_path)  # the bundled model
    with serving(Settings(data_dir=data)) as url:
        yield url


def step_of(page: Page) -> int:
    return int(re.search(r"/steps/(\d+)", page.url).group(1))


def prompt_of(page: Page) -> str:
    return parse_qs(urlsplit(page.url).query)["prompt"][0]


def test_a_long_prompt_wraps_and_its_lines_survive_run(page: Page, gemma_url, screenshot_dir):
    page.goto(f"{gemma_url}/walkthroughs/gemma3/steps/0", timeout=RECORD_MS)
    expect(page.locator("#answer")).to_be_visible(timeout=RECORD_MS)
    assert len(FORTY_WORDS.split()) == 40
    page.locator("#prompt-in").fill(FORTY_WORDS)
    page.get_by_role("button", name="Run").click()
    expect(page).to_have_url(re.compile(r"/steps/0\?prompt=the%20quick"), timeout=RECORD_MS)
    expect(page.locator("#answer .tokens code.tok")).to_have_count(41)  # <bos> and 40 words
    for width in (1280, 800, 1440):
        page.set_viewport_size({"width": width, "height": 900})
        sideways = page.evaluate("document.scrollingElement.scrollWidth - window.innerWidth")
        assert sideways <= 0, f"the page scrolls {sideways} px sideways at {width} px"
        page.screenshot(path=str(screenshot_dir / f"gemma3-long-prompt-{width}.png"))

    two_lines = "The capital of France is Paris.\nThe capital of Italy is"
    page.locator("#prompt-in").fill(two_lines)
    page.get_by_role("button", name="Run").click()
    expect(page).to_have_url(re.compile(r"prompt=The%20capital%20of%20France%20is%20Paris.%0AThe"),
                             timeout=RECORD_MS)
    expect(page.locator("#answer .tokens")).to_contain_text("⏎")
    expect(page.locator("#prompt-in")).to_have_value(two_lines)  # the box keeps the line
    recorded = page.url
    page.get_by_role("button", name="Run").click()  # the same prompt: the same trace, no new one
    expect(page.locator("#answer")).to_be_visible()
    assert page.url == recorded and prompt_of(page) == two_lines


def test_a_new_prompt_keeps_the_step(page: Page, gemma_url):
    page.goto(f"{gemma_url}/walkthroughs/gemma3/steps/40", timeout=RECORD_MS)
    expect(page.locator("#stepnav output")).to_have_text(re.compile(r"^40 / "), timeout=RECORD_MS)
    page.locator("#prompt-in").fill("The capital of Spain is")
    page.get_by_role("button", name="Run").click()
    expect(page).to_have_url(re.compile(r"/steps/40\?prompt=The%20capital%20of%20Spain%20is$"),
                             timeout=RECORD_MS)


def test_append_opens_the_new_pass_and_remove_the_pass_before(page: Page, gemma_url):
    page.goto(f"{gemma_url}/walkthroughs/gemma3/steps/0", timeout=RECORD_MS)
    expect(page.locator("#stepnav .reads")).to_contain_text("reads gemma-3-270m-q4_k_m.gguf")  # what it runs
    page.get_by_role("tab", name="Next token").click()
    page.locator("#nexttoken table.top10 tr").first.get_by_role("link", name="append").click()
    expect(page).to_have_url(re.compile(r"then=\d+$"), timeout=RECORD_MS)
    appended = step_of(page)
    assert appended > 0
    current_pass = page.locator("#steps li.sg-pass.open > a")
    expect(current_pass).to_have_attribute("href", re.compile(rf"/steps/{appended}\?"))  # its first step
    page.get_by_role("tab", name="Next token").click()
    page.locator("#nexttoken table.top10").last.locator("tr").first.get_by_role("link", name="append").click()
    expect(page).to_have_url(re.compile(r"then=\d+,\d+$"), timeout=RECORD_MS)
    second = step_of(page)
    assert second > appended
    expect(current_pass).to_have_attribute("href", re.compile(rf"/steps/{second}\?"))
    page.get_by_role("link", name="remove the last").click()
    expect(page).to_have_url(re.compile(rf"/steps/{appended}\?.*then=\d+$"), timeout=RECORD_MS)


def test_the_recording_page_stops_polling_once_sent_on(page: Page, gemma_url):
    polls: list[float] = []
    sent_on: list[float] = []
    page.on("request", lambda r: polls.append(time.monotonic()) if "/recording?" in r.url else None)
    page.on("response", lambda r: sent_on.append(time.monotonic()) if r.headers.get("hx-redirect") else None)
    page.goto(f"{gemma_url}/walkthroughs/gemma3/steps/7?prompt=Rome%20is%20the%20capital%20of",
              wait_until="commit")
    expect(page.locator("#recording .status .secs")).to_be_visible(timeout=RECORD_MS)
    expect(page).to_have_url(re.compile(r"/steps/7\?prompt=Rome"), timeout=RECORD_MS)
    expect(page.locator("#debugger")).to_be_visible()
    assert len(sent_on) == 1, "the recording page was sent on more than once"
    assert not [t for t in polls if t > sent_on[0]], "a poll after the redirect started it again"


def test_the_first_step_of_a_layer_opens_that_layer_in_the_graph(page: Page, gemma_url):
    """The steps panel's layers are the program's (its `il`); the graph opens the same one: layer
    5's first node reads only layer 4's output, yet it is layer 5's (it was drawn in layer 4)."""
    steps = trace_program("gemma3").steps
    first = next(s.index for s in steps if s.kind == "node" and s.layer == 5)
    page.goto(f"{gemma_url}/walkthroughs/gemma3/steps/{first - 1}", timeout=RECORD_MS)
    expect(page.locator("#debugger")).to_be_visible(timeout=RECORD_MS)
    page.get_by_role("button", name="Next layer", exact=True).click()
    expect(page).to_have_url(re.compile(rf"/steps/{first}$"))
    expect(page.locator("#steps li.sg-layer.open > a").last).to_have_text("layer 5")
    expect(page.locator("#graph .layers a.open")).to_have_text("5")
