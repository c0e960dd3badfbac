"""A Llama 3 file in Debian's chromium: "Run it" in the inspector opens the model walkthrough, whose
steps are the engine's builder's own calls (engine/models/llama.py, decoder.py, common.py), each
shown in its file at its line; the next token's odds and "append" work as for Gemma; the Chat tab
turns a message into the prompt the file's chat template renders."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from app.settings import Settings
from engine.core.types import GGMLType
from engine.programs import trace_program
from tests.browser.conftest import serving
from tests.conformance.test_models import write_tiny_llama
from tests.support.vocab import vocab_files

pytestmark = pytest.mark.browser
RECORD_MS = 120_000  # a first visit records the trace


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    """A models folder holding a Llama 3 file: llama.cpp's llama-bpe vocabulary (byte-level BPE,
    128,256 tokens), 2 layers of random Q4_K weights."""
    from engine.gguf.api import gguf_free, gguf_init_from_file, gguf_set_val_str, gguf_write_to_file
    from tests.api.routes.test_models_dir import LLAMA3_CHAT

    mine = tmp_path_factory.mktemp("my-models")
    vocab = next(p for p in vocab_files() if p.name == "ggml-vocab-llama-bpe.gguf")
    write_tiny_llama(mine / "plain.gguf", GGMLType.Q4_K, vocab=vocab)
    g = gguf_init_from_file(mine / "plain.gguf")
    gguf_set_val_str(g, "tokenizer.chat_template", LLAMA3_CHAT)  # (a Llama 3 chat template)
    gguf_write_to_file(g, mine / "llama3-tiny.gguf")
    gguf_free(g)
    (mine / "plain.gguf").unlink()
    with serving(Settings(data_dir=tmp_path_factory.mktemp("data"), models_dir=mine)) as url:
        yield url, mine / "llama3-tiny.gguf"


def test_run_it_steps_through_the_llama_builder(page: Page, llama3, screenshot_dir):
    url, path = llama3
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{url}/gguf")
    page.get_by_role("link", name="llama3-tiny.gguf").click()
    expect(page.locator("main")).to_contain_text("llama")
    page.get_by_role("link", name="Run it").click(no_wait_after=True)
    expect(page).to_have_url(re.compile(r"/walkthroughs/model/steps/0\?file=[0-9a-f]{64}"),
                             timeout=RECORD_MS)
    expect(page.locator("#answer .tokens")).to_contain_text("<|begin_of_text|>")
    expect(page.locator("#source")).to_contain_text("engine/models/common.py")  # gguf_init_from_file

    # the second layer's attention norm: a call of engine/models/llama.py, at its line
    trace = trace_program("model", path=str(path))
    files = [name for name, _ in trace.also]
    k = files.index("engine/models/llama.py") + 1
    step = next(s for s in trace.steps if s.file == k and s.layer == 1 and "rms_norm" in s.call)
    page.goto(page.url.replace("/steps/0", f"/steps/{step.index}"), timeout=RECORD_MS)
    source = page.locator("#source")
    expect(source.locator("p.file")).to_contain_text("engine/models/llama.py")
    expect(source.locator(".line.current")).to_contain_text("rms_norm")
    expect(source.locator(".line.current .ln")).to_have_text(str(step.line))
    page.screenshot(path=str(screenshot_dir / "model-llama3-walkthrough.png"))

    page.get_by_role("tab", name="Next token").click()
    table = page.locator("#nexttoken table.top10").first
    expect(table.locator("tr")).to_have_count(10)
    first = table.locator("tr").first.locator("code.tok").inner_text()
    table.locator("tr").first.get_by_role("link", name="append").click()
    expect(page).to_have_url(re.compile(r"/steps/\d+\?.*then=\d+"), timeout=RECORD_MS)  # the new pass
    expect(page.locator("#answer code.tok.appended")).to_have_text(first)

    page.get_by_role("tab", name="Chat").click()
    chat = page.locator("#chat")
    expect(chat).to_contain_text("tokenizer.chat_template")
    chat.get_by_label("Your message").fill("What is a tensor?")
    chat.get_by_role("button", name="Send").click()
    expect(page).to_have_url(re.compile(r"/steps/0\?.*prompt=.*start_header_id"), timeout=RECORD_MS)
    expect(page.locator("#answer .tokens")).to_contain_text("<|start_header_id|>")
    expect(page.locator("#answer .tokens")).to_contain_text("assistant")
    page.get_by_role("tab", name="Chat").click()
    page.screenshot(path=str(screenshot_dir / "model-chat.png"))

