"""A file over the upload limit in Debian's chromium: the page sends only its header, the
inspector opens, and a tensor's page sends only the bytes it reads when the file is chosen
again."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from app.settings import Settings
from engine.programs import FIXTURES_DIR
from tests.browser.conftest import serving

pytestmark = pytest.mark.browser
MINILM = FIXTURES_DIR / "minilm-q8_0.gguf"


def test_a_large_file_opens_by_its_header(page: Page, tmp_path, screenshot_dir):
    limit = 1_000_000  # MiniLM (25 MB) is over it
    with serving(Settings(data_dir=tmp_path / "data", upload_limit=limit)) as url:
        sent = []
        page.on("request", lambda r: sent.append((r.url, len(r.post_data_buffer or b"")))
                if r.method == "POST" else None)
        page.goto(f"{url}/gguf")
        page.set_input_files("#gguf-file", str(MINILM))
        page.get_by_role("button", name="Inspect").click()
        expect(page).to_have_url(re.compile(r"/gguf/[0-9a-f]{64}$"))
        expect(page.locator("main")).to_contain_text("header-only upload")
        expect(page.locator("main")).to_contain_text("blk.0.attn_q.weight")
        assert all("/gguf/head" in u for u, _ in sent) and sum(n for _, n in sent) < MINILM.stat().st_size
        page.goto(page.url + f"/tensors/{_last_tensor()}")  # its bytes lie past the first 16 MB
        expect(page.locator("section.needs")).to_contain_text("were not sent")
        page.screenshot(path=str(screenshot_dir / "gguf-header-only.png"))
        sent.clear()
        page.locator("section.needs input[type=file]").set_input_files(str(MINILM))
        expect(page.locator("main")).to_contain_text("values read")  # the statistics are back
        expect(page.locator("section.needs")).to_have_count(0)
        assert len(sent) == 1 and sent[0][1] < 200_000  # only the bytes the page reads


def _last_tensor() -> str:
    from engine.gguf import GGUFReader

    r = GGUFReader(MINILM)
    return max(r.tensors, key=lambda t: t.data_offset).name
