"""A models folder in Debian's chromium: `ggml-lens serve --models DIR` lists the folder's GGUF
files and opens a 40 GB one by its header, in place."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from app.settings import Settings
from engine.programs import FIXTURES_DIR
from tests.api.routes.test_models_dir import write_big_sparse
from tests.browser.conftest import serving

pytestmark = pytest.mark.browser


def test_a_models_folder_lists_and_opens_in_place(page: Page, tmp_path, screenshot_dir):
    models = tmp_path / "models"
    models.mkdir()
    write_big_sparse(models / "big-40g.gguf")
    (models / "minilm.gguf").write_bytes((FIXTURES_DIR / "minilm-q8_0.gguf").read_bytes())
    with serving(Settings(data_dir=tmp_path / "data", models_dir=models)) as url:
        page.goto(f"{url}/gguf")
        card = page.locator("section.models")
        expect(card).to_contain_text(f"Your models in {models.resolve()}")
        expect(card.get_by_role("link")).to_have_count(2)
        card.get_by_role("link", name="big-40g.gguf").click()
        expect(page).to_have_url(re.compile(r"/gguf/[0-9a-f]{64}$"))
        expect(page.locator("main")).to_contain_text("token_embd.weight")
        expect(page.locator("main")).to_contain_text("40")
        page.screenshot(path=str(screenshot_dir / "gguf-models-folder.png"))
        assert not list((tmp_path / "data").rglob("*.gguf"))  # nothing was copied
