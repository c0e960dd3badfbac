"""What a learner sees at the end and writes first: the last step of simple-ctx shows the result
matrix ggml's example prints; a plain script (no run function) runs in the playground and steps
to what it left."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from engine.programs import trace_program

pytestmark = pytest.mark.browser


def test_the_last_step_of_simple_ctx_shows_the_result(page: Page, server_url: str, screenshot_dir: Path):
    trace = trace_program("simple-ctx")
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/{len(trace.steps) - 1}")
    table = page.get_by_role("table", name="values of result")
    expect(table).to_be_visible()  # without a tab click
    for row, values in zip(table.locator("tr").all(), trace.outputs["result"]):
        expect(row).to_have_text(re.compile(r"\s*".join(str(int(v)) for v in values)))
    expect(table.locator("tr").first).to_have_text(re.compile(r"60\s*55\s*50\s*110"))
    page.screenshot(path=str(screenshot_dir / "simple-ctx-result.png"))


SCRIPT = """import numpy as np

from engine.ggml import *

ctx = ggml_init(ggml_init_params(mem_size=256 * 1024, mem_buffer=None, no_alloc=False))
x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4)
set_data(x, np.array([1, 2, 3, 4], dtype=np.float32))
y = ggml_scale(ctx, x, 10.0)
gf = ggml_new_graph(ctx)
ggml_build_forward_expand(gf, y)
ggml_graph_compute_with_ctx(ctx, gf, n_threads)
"""


def test_a_plain_script_runs_in_the_playground(page: Page, server_url: str):
    page.goto(f"{server_url}/playground")
    page.evaluate("(src) => document.querySelector('.CodeMirror').CodeMirror.setValue(src)", SCRIPT)
    page.get_by_role("button", name="Run").click()
    expect(page).to_have_url(re.compile(r"/programs/[0-9a-f]{64}/steps/0$"), timeout=60_000)
    page.wait_for_load_state("load")  # (the scrubber's script listens once the page has loaded)
    scrubber = page.locator("#stepnav input[type=range]")
    scrubber.fill(scrubber.get_attribute("max"))
    expect(page).to_have_url(re.compile(rf"/steps/{scrubber.get_attribute('max')}$"))
    table = page.get_by_role("table", name="values of y")
    expect(table).to_have_text(re.compile(r"10\s*20\s*30\s*40"))
