"""The interface in Simplified Chinese, in Debian's chromium: chosen from the browser's language,
on the debugger, the GGUF inspector and a quant block; the switch to English is remembered."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

pytestmark = pytest.mark.browser

CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture
def zh_page(browser: Browser):
    context = browser.new_context(viewport={"width": 1440, "height": 900}, locale="zh-CN")
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


def chinese_share(page: Page) -> float:
    """How much of the page's visible prose is Chinese: CJK characters over CJK plus English words."""
    text = page.locator("body").inner_text()
    return len(CJK.findall(text)) / max(1, len(CJK.findall(text)) + len(re.findall(r"\b[a-z]{3,}\b", text)))


def test_the_debugger_in_chinese(zh_page: Page, server_url: str, screenshot_dir: Path):
    shots = screenshot_dir / "zh"
    shots.mkdir(exist_ok=True)
    zh_page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/1")
    expect(zh_page.locator("html")).to_have_attribute("lang", "zh-Hans")
    expect(zh_page.get_by_role("button", name="下一步", exact=True)).to_be_visible()
    expect(zh_page.locator("#source")).to_contain_text("预留了")  # the step's note, told in Chinese
    expect(zh_page.locator("#source")).to_contain_text("ggml_new_tensor_2d")  # the program stays code
    zh_page.get_by_role("button", name="下一步", exact=True).click()
    expect(zh_page).to_have_url(re.compile(r"/steps/2$"))
    zh_page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/12")
    expect(zh_page.locator("#threads")).to_contain_text("线程")
    assert chinese_share(zh_page) > 0.3
    zh_page.screenshot(path=str(shots / "layout-1440.png"))
    zh_page.goto(f"{server_url}/walkthroughs/threads/steps/18?threads=4")
    zh_page.get_by_role("tab", name=re.compile("线程")).click()
    zh_page.screenshot(path=str(shots / "walkthrough-threads.png"), full_page=True)
    zh_page.goto(f"{server_url}/walkthroughs/minilm")
    zh_page.screenshot(path=str(shots / "walkthrough-steps.png"))


def test_the_inspector_in_chinese(zh_page: Page, server_url: str, screenshot_dir: Path):
    shots = screenshot_dir / "zh"
    shots.mkdir(exist_ok=True)
    zh_page.goto(f"{server_url}/gguf")
    expect(zh_page.locator("html")).to_have_attribute("lang", "zh-Hans")
    zh_page.get_by_role("link", name="minilm-q8_0.gguf").first.click()
    expect(zh_page.locator("main")).to_contain_text("键值对")
    assert chinese_share(zh_page) > 0.3
    zh_page.screenshot(path=str(shots / "gguf-tensors.png"))
    zh_page.get_by_role("link", name=re.compile(r"blk\.0\.attn_q\.weight")).first.click()
    expect(zh_page.locator("main")).to_contain_text("量化")
    zh_page.screenshot(path=str(shots / "gguf-block.png"), full_page=True)


def test_the_switch_is_remembered(zh_page: Page, server_url: str):
    zh_page.goto(f"{server_url}/")
    expect(zh_page.locator("html")).to_have_attribute("lang", "zh-Hans")
    zh_page.get_by_role("link", name="English").click()
    expect(zh_page.locator("html")).to_have_attribute("lang", "en")
    zh_page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/1")  # the browser still asks for Chinese
    expect(zh_page.locator("html")).to_have_attribute("lang", "en")
    zh_page.get_by_role("button", name="Next step", exact=True).click()  # htmx: the header stays
    expect(zh_page).to_have_url(re.compile(r"/steps/2$"))
    zh_page.get_by_role("link", name="简体中文").click()
    expect(zh_page.locator("html")).to_have_attribute("lang", "zh-Hans")
    expect(zh_page).to_have_url(re.compile(r"/walkthroughs/simple-ctx/steps/2\?lang=zh$"))  # the same step
