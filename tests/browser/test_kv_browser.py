"""The KV panel in Debian's chromium: a tiny Gemma 3 file with a window of 4 positions, its prompt
and three appended tokens (9 positions), stepped to the last pass: the KV cache tab shows the
cells the newest token's sliding-window layers no longer see (struck out, "not seen") beside the
global layer that sees them all, and the two masks the pass reads."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from app.settings import Settings
from engine.programs import trace_program
from engine.trace import StepKind
from tests.browser.conftest import serving
from tests.support.tiny_gemma import WINDOW, write_tiny_gemma

pytestmark = pytest.mark.browser
RECORD_MS = 120_000  # a first visit records the trace
THEN = (5, 6, 7)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    models = tmp_path_factory.mktemp("my-models")
    write_tiny_gemma(models / "gemma3-tiny.gguf", "gemma3")
    with serving(Settings(data_dir=tmp_path_factory.mktemp("data"), models_dir=models)) as url:
        yield url, models / "gemma3-tiny.gguf"


def test_the_kv_tab_shows_the_sliding_window_past_its_edge(page: Page, gemma, screenshot_dir):
    url, path = gemma
    page.set_viewport_size({"width": 1440, "height": 1000})
    page.goto(f"{url}/gguf")
    page.get_by_role("link", name="gemma3-tiny.gguf").click()
    page.get_by_role("link", name="Run it").click(no_wait_after=True)
    expect(page).to_have_url(re.compile(r"/walkthroughs/gemma3/steps/0\?file=[0-9a-f]{64}"),
                             timeout=RECORD_MS)
    expect(page.get_by_role("tab", name="KV cache")).to_have_count(0)  # (no pass yet)

    # the same inputs recorded here: the steps of the last pass (the newest token at position 8)
    trace = trace_program("gemma3", path=str(path), then=THEN)
    n_prompt = len(trace.outputs["prompt_tokens"])
    newest = n_prompt + len(THEN) - 1
    assert newest >= 2 * WINDOW  # the context has passed the window
    step = next(s for s in trace.steps if s.kind == StepKind.NODE and s.n_past == newest
                and s.layer == 0)
    page.goto(page.url.replace("/steps/0?", f"/steps/{step.index}?") + "&then=5,6,7",
              timeout=RECORD_MS)
    expect(page).to_have_url(re.compile(rf"/steps/{step.index}\?.*then=5"), timeout=RECORD_MS)
    page.get_by_role("tab", name="KV cache").click()
    kv = page.locator("#kv")
    expect(kv).to_be_visible()
    expect(kv.locator(".kv-title")).to_contain_text(f"positions {newest}..{newest}")
    expect(kv).to_contain_text("layer 0, a sliding-window layer")

    swa = kv.locator('.kv-strip[data-mask="attn_inp_kq_mask_swa"]')
    unseen = swa.locator(".kv-cell.unseen")
    expect(unseen).to_have_count(newest + 1 - WINDOW)  # positions 0..newest - WINDOW
    expect(unseen.first).to_contain_text("not seen")
    expect(swa.locator(".kv-cell.seen")).to_have_count(WINDOW)
    expect(swa.locator(".kv-strip-head")).to_contain_text(
        f"cells {newest + 1 - WINDOW}..{newest} ({WINDOW} seen)")
    glob = kv.locator('.kv-strip[data-mask="attn_inp_kq_mask"]')
    expect(glob.locator(".kv-cell.unseen")).to_have_count(0)
    expect(glob.locator(".kv-cell.seen")).to_have_count(newest + 1)
    expect(kv.locator("figure.kv-mask")).to_have_count(2)  # the two masks, side by side
    expect(kv.locator('figure[data-mask="attn_inp_kq_mask_swa"] rect.masked').first).to_be_attached()
    kv.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir / "kv-swa-window.png"), full_page=True)
    kv.screenshot(path=str(screenshot_dir / "kv-panel.png"))
