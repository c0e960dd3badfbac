"""The GGUF inspector in a real browser, used as a learner would: by roles and labels.

Screenshots of each view go to the screenshot folder (`make screenshots`: docs/screenshots).
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Browser, Page, expect

from engine.programs import FIXTURES_DIR

pytestmark = pytest.mark.browser

FIXTURES = FIXTURES_DIR
MINILM = FIXTURES / "minilm-q8_0.gguf"
VOCAB = FIXTURES / "ggml-vocab-llama-spm.gguf"
FILE_URL = re.compile(r"/gguf/[0-9a-f]{64}$")


def upload(page: Page, server_url: str, path=None, payload=None) -> None:
    page.goto(f"{server_url}/gguf")
    page.get_by_label("GGUF file", exact=True).set_input_files(payload or path)
    page.get_by_role("button", name="Inspect").click()


def test_upload_minilm_and_browse(page: Page, server_url: str, screenshot_dir) -> None:
    upload(page, server_url, MINILM)
    expect(page).to_have_url(FILE_URL)
    expect(page.get_by_role("heading", name="MiniLM L6 H384 Uncased")).to_be_visible()
    tensors = page.locator("#gguf-tensors-table")
    expect(tensors.locator("tr.tensor-row")).to_have_count(101)
    expect(tensors.get_by_role("rowgroup").filter(has_text="blk.5")).to_have_count(1)
    page.screenshot(path=screenshot_dir / "gguf-file.png")
    page.locator("#tensors").evaluate("e => e.scrollIntoView()")
    page.screenshot(path=screenshot_dir / "gguf-tensors.png")
    file_url = page.url

    # the byte map: open the tensor infos region, then the data of one tensor
    bytemap = page.locator("#gguf-bytemap")
    bytemap.get_by_role("link", name=re.compile(r"^tensor infos \(101\)")).click()
    expect(page).to_have_url(re.compile(r"seg=\d+"))
    expect(bytemap.get_by_role("heading", name="tensor info token_embd_norm.bias")).to_be_visible()
    expect(bytemap.get_by_role("cell", name="ne[0]")).to_be_visible()
    bytemap.scroll_into_view_if_needed()
    bytemap.screenshot(path=screenshot_dir / "gguf-bytemap.png")

    # metadata search swaps only the metadata table
    page.get_by_label("Search keys and values").fill("head_count")
    kv = page.locator("#gguf-kv-table")
    expect(kv.locator("tr.kv-row")).to_have_count(1)
    expect(page).to_have_url(re.compile(r"q=head_count"))
    expect(page).to_have_url(re.compile(r"seg=\d+"))  # the byte map's choice is kept
    kv.scroll_into_view_if_needed()
    page.locator("#metadata").screenshot(path=screenshot_dir / "gguf-metadata.png")

    # filter and sort the tensors; back and forward walk through those views
    page.get_by_label("Filter by name or type").fill("attn_q")
    expect(tensors.locator("tr.tensor-row")).to_have_count(12)
    tensors.get_by_role("link", name="size").click()
    expect(page).to_have_url(re.compile(r"sort=size"))
    expect(page).to_have_url(re.compile(r"q=head_count"))  # the metadata search is kept
    page.go_back()
    expect(page).not_to_have_url(re.compile(r"sort=size"))
    expect(tensors.locator("tr.tensor-row")).to_have_count(12)
    page.go_forward()
    expect(page).to_have_url(re.compile(r"sort=size"))
    page.goto(file_url)
    expect(tensors.locator("tr.tensor-row")).to_have_count(101)


def test_tensor_page_and_block_explainer(page: Page, server_url: str, screenshot_dir) -> None:
    upload(page, server_url, MINILM)
    page.get_by_role("link", name="token_embd.weight").click()
    expect(page.get_by_role("heading", name="token_embd.weight Q8_0")).to_be_visible()
    expect(page.get_by_text(re.compile(r"Computed on a sample: \d+ evenly spaced rows"))) \
        .to_be_visible()
    expect(page.get_by_role("img", name=re.compile("heatmap"))).to_be_visible()
    page.screenshot(path=screenshot_dir / "gguf-tensor.png", full_page=True)

    block = page.locator("#gguf-block")
    block.get_by_label("Row", exact=True).fill("5")
    block.get_by_label("Block", exact=True).fill("3")
    block.get_by_role("button", name="Show").click()
    expect(block.get_by_text("Row 5, block 3", exact=False)).to_be_visible()
    expect(page).to_have_url(re.compile(r"row=5&block=3"))
    expect(block.get_by_role("cell", name="scale, fp16")).to_be_visible()
    expect(block.get_by_role("list", name="the block's values").get_by_role("listitem")) \
        .to_have_count(32)
    block.get_by_role("link", name="next block →").click()
    expect(block.get_by_text("Row 5, block 4", exact=False)).to_be_visible()
    page.go_back()
    expect(block.get_by_text("Row 5, block 3", exact=False)).to_be_visible()
    block.scroll_into_view_if_needed()
    block.screenshot(path=screenshot_dir / "gguf-block.png")


def test_malformed_upload_then_keep_going(page: Page, server_url: str, screenshot_dir) -> None:
    bad = {"name": "broken.gguf", "mimeType": "application/octet-stream",
           "buffer": b"GGUF\x03\x00\x00\x00" + b"\xff" * 8}
    upload(page, server_url, payload=bad)
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("This is not a valid GGUF file")
    expect(alert).to_contain_text("n_tensors")
    expect(page.get_by_text("Traceback")).to_have_count(0)
    page.screenshot(path=screenshot_dir / "gguf-error.png")

    # the app goes on: back to the inspector, open the vocabulary file
    page.get_by_role("navigation", name="main").get_by_role("link", name="GGUF inspector").click()
    page.get_by_label("GGUF file", exact=True).set_input_files(VOCAB)
    page.get_by_role("button", name="Inspect").click()
    expect(page).to_have_url(FILE_URL)
    expect(page.get_by_role("heading", name="llama-spm")).to_be_visible()
    expect(page.get_by_text("This file holds no tensors")).to_be_visible()
    page.get_by_role("link", name="all 32,000 items →").first.click()
    expect(page.get_by_role("heading", name="tokenizer.ggml.tokens")).to_be_visible()
    page.get_by_role("navigation", name="pages (top)").get_by_role("link", name="next →").click()
    expect(page).to_have_url(re.compile(r"page=2"))
    expect(page.get_by_text("Items 101–200 of 32,000")).to_be_visible()
    expect(page.get_by_role("columnheader", name="score")).to_be_visible()
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=screenshot_dir / "gguf-vocab.png")
    page.get_by_label("Find").fill("▁the")
    expect(page.get_by_text(re.compile(r"matching “▁the”"))).to_be_visible()
    expect(page.get_by_role("cell", name="▁theory", exact=True)).to_be_visible()


def test_navigation_without_javascript(browser: Browser, server_url: str) -> None:
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    try:
        page.goto(f"{server_url}/gguf")
        page.get_by_role("link", name="minilm-q8_0.gguf").click()
        page.get_by_label("Filter by name or type").fill("ffn_up")
        page.get_by_role("button", name="Apply").click()
        expect(page).to_have_url(re.compile(r"filter=ffn_up"))
        expect(page.locator("tr.tensor-row")).to_have_count(12)
        page.get_by_role("link", name="blk.2.ffn_up.weight").click()
        page.get_by_label("Block", exact=True).fill("7")
        page.get_by_role("button", name="Show").click()
        expect(page.get_by_text("Row 0, block 7", exact=False)).to_be_visible()
    finally:
        context.close()
