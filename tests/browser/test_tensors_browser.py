"""The tensor list of a model, a page at a time: its pages and its filter are used with the keyboard
alone, swap only the list (the step and the address bar stay), and the filter finds a tensor that
is on another page."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser


def test_the_tensor_list_pages_and_filters_from_the_keyboard(page: Page, server_url: str):
    page.goto(f"{server_url}/walkthroughs/tiny-llama/steps/0")
    last = int(page.locator("#stepnav input[type=range]").get_attribute("max"))
    page.goto(f"{server_url}/walkthroughs/tiny-llama/steps/{last}")
    page.get_by_role("tab", name="Tensors").click()
    panel = page.locator("#tensors")
    # the page holding the selected tensor (the newest: on the last page)
    expect(panel.locator("p[aria-live]")).to_contain_text("Rows 101 to")
    name = panel.locator("tr.selected td a").inner_text()
    panel.locator(".tscroll").scroll_into_view_if_needed()
    expect(panel.locator("tr.selected")).to_be_in_viewport()  # scrolled to in its page
    url = page.url
    # page 1 by the keyboard: focus its link, Enter
    first = panel.get_by_role("link", name="page 1 of the tensor list")
    first.focus()
    page.keyboard.press("Enter")
    expect(panel.locator("p[aria-live]")).to_contain_text("Rows 1 to 100 shown.")
    expect(panel.locator("tr.selected")).to_have_count(0)
    assert page.url == url  # the list changed, not the step
    # the filter finds the tensor on the other page, as the learner types
    box = panel.get_by_role("searchbox", name="Filter by name")
    box.focus()
    page.keyboard.type(name)
    expect(panel.locator("p[aria-live]")).to_contain_text(re.compile(r"of \d+ tensors match"))
    expect(panel.locator("tr.selected td a")).to_have_text(name)
    expect(page.locator("#tensors-q")).to_be_focused()  # typing goes on where it was
    expect(page.locator("#tensors-q")).to_have_value(name)
    # and its link selects it: the same step
    panel.get_by_role("link", name=name, exact=True).first.click()
    expect(page).to_have_url(re.compile(rf"/steps/{last}\?t=\d+\.\d+$"))
    expect(page.locator("#tensors tr.selected td a")).to_have_text(name)


def test_the_tensor_list_in_chinese(page: Page, server_url: str):
    page.goto(f"{server_url}/walkthroughs/tiny-llama/steps/0?lang=zh")
    last = int(page.locator("#stepnav input[type=range]").get_attribute("max"))
    page.goto(f"{server_url}/walkthroughs/tiny-llama/steps/{last}?tp=0&lang=zh")
    page.locator("#debugger .tabs .tab[data-panel=tensors]").click()
    panel = page.locator("#tensors")
    expect(panel.locator("p[aria-live]")).to_contain_text("显示第 1 到第 100 行。")
    panel.get_by_role("link", name="张量列表第 2 页").click()
    expect(panel.locator("p[aria-live]")).to_contain_text("显示第 101 到")
    page.goto(f"{server_url}/?lang=en")
