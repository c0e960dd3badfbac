"""Compare in Debian's chromium: the bundled Gemma against its Q4_0 requantization, made on the
spot; the learner steps to a node past layer 5 and sees both tensors and their difference, the
error through the layers, and the next-token distributions."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from app.settings import Settings
from tests.browser.conftest import serving

pytestmark = pytest.mark.browser
RUN_MS = 180_000  # a first comparison quantizes the model and runs it twice (seconds on a slow machine)


@pytest.fixture(scope="module")
def compare_url(tmp_path_factory, gemma_path):
    data = tmp_path_factory.mktemp("compare-data")
    (data / "models").mkdir()
    (data / "models" / gemma_path.name).symlink_to(gemma_path)  # the bundled model
    with serving(Settings(data_dir=data, models_dir=data / "models")) as url:
        yield url


def test_gemma_against_its_q4_0_stepped_past_layer_5(page: Page, compare_url, screenshot_dir):
    page.goto(f"{compare_url}/")
    page.get_by_role("link", name="Compare two models").click()
    expect(page.get_by_label("Model")).to_have_value(re.compile(r"^[0-9a-f]{64}$"))
    expect(page.get_by_label("Model").locator("option:checked")).to_have_text("gemma-3-270m-q4_k_m.gguf")
    page.get_by_label("Against").select_option("Q4_0")
    page.get_by_label("Prompt").fill("The capital of France is")
    page.get_by_role("button", name="Compare").click()
    # the runs may take longer than a request waits: the progress shows, then the comparison
    expect(page.locator("#cmp-node")).to_be_visible(timeout=RUN_MS)
    expect(page.locator("#cmp-node h2")).to_contain_text("l_out-0")
    # the sparkline's point for layer 6 opens that layer's output node
    page.locator(".spark a").filter(has=page.locator("title", has_text="layer 6:")).first.click()
    expect(page.locator("#cmp-node h2")).to_contain_text("l_out-6")
    # one node on (an htmx swap of the node alone, its own URL)
    page.get_by_role("link", name="Next node →").click()
    expect(page.locator("#cmp-node h2")).to_contain_text("norm-7")
    expect(page).to_have_url(re.compile(r"[?&]n=\d+"))
    n = int(re.search(r"[?&]n=(\d+)", page.url).group(1))
    expect(page.locator("#cmp-node h2")).to_contain_text(f"Node {n} of ")
    first = page.get_by_role("table", name="first model")
    second = page.get_by_role("table", name="second model")
    expect(first.locator("tbody tr")).to_have_count(4)
    expect(second.locator("tbody tr")).to_have_count(4)
    expect(page.get_by_role("table", name="difference (second − first)")).to_be_visible()
    for cls in ("max-abs", "rel-rms", "cosine"):
        expect(page.locator(f"#cmp-node dd.{cls}")).to_have_text(re.compile(r"^-?\d"))
    assert page.locator("#cmp-node dd.rel-rms").inner_text() != "0"  # Q4_0 is not Q4_K_M
    assert first.locator("tbody td").first.inner_text() != second.locator("tbody td").first.inner_text()
    expect(page.locator(".spark .marker")).to_have_count(1)
    expect(page.locator("#cmp-tokens tbody tr")).to_have_count(6)
    expect(page.locator("#cmp-weights")).to_contain_text("q4_0")
    page.screenshot(path=str(screenshot_dir / "compare.png"))
