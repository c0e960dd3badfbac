"""The perplexity page in Debian's chromium: the built-in text at -c 128 on the bundled Gemma,
two chunks; the progress while it runs, then llama-perplexity's lines and the heat map, its
scored tokens coloured and a clicked token's figures shown."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from app.settings import Settings
from tests.browser.conftest import serving

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def url(gemma_path, tmp_path_factory):
    with serving(Settings(data_dir=tmp_path_factory.mktemp("data"),
                          models_dir=gemma_path.parent)) as url:
        yield url


def test_the_built_in_text_becomes_a_heat_map(page: Page, url, screenshot_dir):
    page.goto(f"{url}/")
    page.get_by_role("link", name="Score a text with a model").click()
    expect(page.get_by_label("Model", exact=True)).to_have_value("gemma-3-270m-q4_k_m.gguf")
    expect(page.get_by_label("The built-in text")).to_be_checked()
    page.get_by_label("chunk size, in tokens").select_option("128")
    page.get_by_label("at most this many chunks").fill("2")
    page.get_by_role("button", name="Run").click()
    expect(page).to_have_url(re.compile(r"/perplexity/run\?model=gemma-3-270m-q4_k_m.gguf"
                                        r"&text=builtin&c=128&chunks=2$"))
    # the run's page shows its progress (polling itself) until the last chunk is scored
    expect(page.locator("#ppl-progress")).to_contain_text(re.compile(
        r"Loading the model|[0-2] of 2 chunks scored"))
    heat = page.locator("#heat")
    expect(heat).to_be_visible(timeout=120_000)
    expect(page.locator("#ppl-summary")).to_contain_text(
        re.compile(r"\[1\]\d+\.\d{4},\[2\]\d+\.\d{4},\s+Final estimate: PPL = \d+\.\d{4} \+/- "
                   r"\d+\.\d{5}"))
    scored = heat.locator(".t.s")
    expect(scored).to_have_count(2 * 63)
    expect(heat.get_by_role("region", name="chunk 2")).to_be_visible()
    # coloured: a scored token has its band's background, a context token none
    colours = scored.evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
    assert all(c not in ("rgba(0, 0, 0, 0)", "transparent") for c in colours)
    assert len(set(colours)) >= 4  # several bands in a real text
    context = heat.locator(".t.context").first
    assert context.evaluate("e => getComputedStyle(e).backgroundColor") == "rgba(0, 0, 0, 0)"
    scored.nth(3).click()
    expect(page.locator("#ppl-detail")).to_contain_text(
        re.compile(r"log p = -\d+\.\d{4}, p = \d+\.\d{2}%, rank \d+"))
    page.screenshot(path=str(screenshot_dir / "perplexity-heat-map.png"))
