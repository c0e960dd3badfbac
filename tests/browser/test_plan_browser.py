"""The memory plan page in Debian's chromium, used as a learner would: a model file uploaded to
the GGUF inspector, its "Memory plan" link followed, the context slider moved (the KV figure
follows, equal to plan() at the new context, without a reload, the URL naming the plan), a
setting llama.cpp refuses shown in its words, and the way back to a plan that is planned."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from engine.core.types import GGMLType
from engine.models.params import ContextParams
from engine.models.plan import fit, plan
from tests.browser.test_gguf_browser import upload
from tests.conformance.test_plan import write_gemma3

pytestmark = pytest.mark.browser

PLAN_URL = re.compile(r"/plan/[0-9a-f]{64}")


def kv_bytes(page: Page) -> dict[str, int]:
    """Each cache's buffer as the page shows it (its bytes on hover)."""
    out = {}
    for row in page.locator("tr.cache").all():
        out[row.get_attribute("data-cache") or ""] = int(
            row.locator(".kv-size .mib").get_attribute("data-bytes") or -1)
    return out


def test_plan_from_the_inspector_and_the_context_slider(page: Page, server_url: str, tmp_path: Path,
                                                        screenshot_dir) -> None:
    path = tmp_path / "tiny-gemma3.gguf"
    write_gemma3(path, GGMLType.Q4_K)
    upload(page, server_url, path)
    page.get_by_role("link", name="Memory plan").click()
    expect(page).to_have_url(PLAN_URL)
    page.wait_for_load_state()  # (htmx reads the form once the page has loaded: typing before is lost)
    expect(page.get_by_role("heading", level=1)).to_contain_text("Will it fit?")
    own = plan(path)
    assert kv_bytes(page) == {c.name: c.size for c in own.caches}

    # the slider: the page asks for the figures alone and pushes the plan's URL
    page.evaluate("window.__same_document = true")
    page.locator("#plan-c-range").fill("8192")
    expect(page).to_have_url(re.compile(r"/plan/[0-9a-f]{64}\?c=8192$"))
    at = plan(path, ContextParams(n_ctx=8192))
    expect(page.locator('tr.cache[data-cache="non-SWA"] .kv-size .mib')).to_have_attribute(
        "data-bytes", str(at.caches[0].size))
    assert kv_bytes(page) == {c.name: c.size for c in at.caches}
    assert at.caches[0].size != own.caches[0].size
    assert page.evaluate("window.__same_document") is True  # no reload
    expect(page.locator("#plan-c")).to_have_value("8192")
    expect(page.locator("#plan-total-h")).to_contain_text(f"{at.total / (1 << 20):.2f} MiB")
    page.screenshot(path=str(screenshot_dir / "plan-tiny-gemma3.png"), full_page=True)

    # a combination llama.cpp refuses: its words in place of the figures, then back to a plan
    page.locator('select[name="ctv"]').select_option("q8_0")
    page.locator('select[name="fa"]').select_option("off")
    alert = page.locator("#plan-figures [role=alert]")
    expect(alert).to_contain_text("quantized V cache requires flash_attn to be enabled")
    page.locator('select[name="fa"]').select_option("on")
    expect(alert).to_have_count(0)
    on = plan(path, ContextParams(n_ctx=8192, type_v=GGMLType.Q8_0, flash_attn="on"))
    expect(page.locator('tr.cache[data-cache="non-SWA"] .kv-size .mib')).to_have_attribute(
        "data-bytes", str(on.caches[0].size))
    expect(page).to_have_url(re.compile(r"\?c=8192&ctv=q8_0&fa=on$"))
    assert page.evaluate("window.__same_document") is True

    # Back returns to the plan before it
    page.go_back()
    expect(page).to_have_url(re.compile(r"fa=off$"))
    expect(page.locator("#plan-figures [role=alert]")).to_contain_text("quantized V cache")


def test_fit_answers_after_the_figures(page: Page, server_url: str, tmp_path: Path) -> None:
    path = tmp_path / "tiny-gemma3.gguf"
    write_gemma3(path, GGMLType.Q4_K)
    upload(page, server_url, path)
    page.get_by_role("link", name="Memory plan").click()
    expect(page).to_have_url(PLAN_URL)
    page.wait_for_load_state()  # (htmx reads the form once the page has loaded: typing before is lost)
    page.locator('input[name="fitt"]').fill("0")
    page.locator('input[name="fit"]').fill("40M")
    page.get_by_role("button", name="Plan").click()
    want = fit(path, 40 << 20, ContextParams(), True, 0)
    assert want.largest is not None
    expect(page.locator("#plan-fit .largest")).to_contain_text(f"-c {want.largest}", timeout=60_000)
    expect(page).to_have_url(re.compile(r"\?fit=40M&fitt=0$"))
