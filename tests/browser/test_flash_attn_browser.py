"""Flash attention flipped in Debian's chromium: the gemma3 walkthrough's Prompt form has llama-cli's
-fa; on (auto, the default) a layer's attention is one FLASH_ATTN_EXT node in the DAG, with a line
saying what it replaces; off, the same layer has KQ (MUL_MAT), SOFT_MAX and KQV instead."""

from __future__ import annotations

import re
import shutil

import pytest
from playwright.sync_api import Page, expect

from app.settings import Settings
from engine.core.optable import GGMLOp, ggml_op_symbol
from tests.browser.conftest import serving

pytestmark = pytest.mark.browser
RECORD_MS = 120_000  # a first visit records the trace
FA_DAG_PNG = "/tmp/fa-dag.png"  # the screenshot the task asked for, besides the screenshots folder


@pytest.fixture(scope="module")
def gemma_url(tmp_path_factory, gemma_path):
    data = tmp_path_factory.mktemp("fa-data")
    (data / "models").mkdir()
    (data / "models" / gemma_path.name).symlink_to(gemma_path)  # the bundled model
    with serving(Settings(data_dir=data)) as url:
        yield url


def open_search_hit(page: Page, base: str, query: str, hit: str) -> None:
    """The walkthrough's step search, then the step whose call reads `hit`."""
    page.goto(f"{base}/search?{query}", timeout=RECORD_MS)
    page.locator("ol.results li", has_text=hit).first.get_by_role("link").click()
    expect(page.locator("#graph .dag > svg")).to_be_visible(timeout=RECORD_MS)


def test_flipping_flash_attention_changes_the_dag(page: Page, gemma_url, screenshot_dir):
    page.set_viewport_size({"width": 1440, "height": 1000})
    base = f"{gemma_url}/walkthroughs/gemma3"
    page.goto(base, timeout=RECORD_MS)
    expect(page).to_have_url(re.compile(r"/walkthroughs/gemma3/steps/0$"), timeout=RECORD_MS)
    fa = page.get_by_label("-fa")
    expect(fa).to_have_value("auto")  # llama.cpp's default: on for the CPU
    expect(page.locator("#answer .llama-settings")).to_contain_text("never repacks its weights")

    # on: layer 0's attention is one node, drawn as flash_attn_ext(x), and the panel says why
    open_search_hit(page, base, "q=FLASH_ATTN_EXT", "FLASH_ATTN_EXT -> ")
    dag = page.locator("#graph .dag > svg")
    symbol = ggml_op_symbol(GGMLOp.FLASH_ATTN_EXT)
    expect(dag).to_contain_text(symbol)
    expect(dag).not_to_contain_text(ggml_op_symbol(GGMLOp.SOFT_MAX))
    note = page.locator("#graph .op-note")
    expect(note).to_contain_text("FLASH_ATTN_EXT")
    expect(note).to_contain_text("MUL_MAT → SOFT_MAX → MUL_MAT of the path without flash attention")
    current = page.locator("#graph").get_attribute("data-current")
    expect(page.locator(f'#graph g[id="{current}"]')).to_contain_text(symbol)  # the step's node
    expect(page.locator(f'#graph g[id="{current}"]')).to_be_in_viewport()
    page.locator("#graph").screenshot(path=FA_DAG_PNG)
    shutil.copyfile(FA_DAG_PNG, screenshot_dir / "fa-dag.png")

    # off, from the form: another trace, whose same layer has KQ, softmax and KQV
    page.get_by_label("-fa").select_option("off")
    page.get_by_role("button", name="Run").click()
    expect(page).to_have_url(re.compile(r"/walkthroughs/gemma3/steps/\d+\?.*fa=off"), timeout=RECORD_MS)
    expect(page.get_by_label("-fa")).to_have_value("off")
    page.locator("#answer").screenshot(path=str(screenshot_dir / "llama-settings.png"))
    open_search_hit(page, base, "fa=off&q=kq_soft_max-0", "SOFT_MAX -> 'kq_soft_max-0'")
    expect(page).to_have_url(re.compile(r"fa=off"))
    dag = page.locator("#graph .dag > svg")
    expect(dag).to_contain_text(ggml_op_symbol(GGMLOp.SOFT_MAX))
    expect(dag).to_contain_text("kq-0")
    expect(dag).to_contain_text("kqv-0")
    expect(dag).not_to_contain_text(symbol)
    expect(page.locator("#graph .op-note")).to_have_count(0)
    page.locator("#graph").screenshot(path=str(screenshot_dir / "no-fa-dag.png"))
