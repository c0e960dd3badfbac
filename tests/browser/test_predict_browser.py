"""Prediction mode on a walkthrough's debugger: before stepping on, the learner clicks where the
next tensor will land on the pool bar; the step is taken and the truth is drawn over the guess.
The truth is the engine's: the header offset of the object the step made, from the state it
rebuilds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from engine.programs import trace_program

pytestmark = pytest.mark.browser


def test_a_click_on_the_pool_bar_is_compared_with_the_real_offset(page: Page, server_url: str, screenshot_dir: Path):
    trace = trace_program("simple-ctx")
    k = next(s.index for s in trace.steps if s.call.startswith("b = ggml_new_tensor_2d"))
    state = trace.state_at(k)
    b = state.tensor(trace.steps[k].tensor)
    header, end = next((h, offs + size) for h, offs, size, _t, _n in state.headers(b.ctx.id) if offs == b.offs)

    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/{k - 1}")
    page.get_by_label("Predict").check()
    page.get_by_role("button", name="Next step").click()
    ask = page.get_by_role("region", name="Predict the next step")
    expect(ask).to_contain_text(f"Step {k} will add a tensor to context 0")
    expect(page).to_have_url(re.compile(rf"/steps/{k - 1}$"))  # held back until the guess

    bar = page.locator('#pool .poolbar[data-ctx="0"]')
    x = page.evaluate("([offset]) => lensPredict.xOf(document.querySelector('#pool .poolbar[data-ctx=\"0\"]'), offset)",
                      [header + 40])
    box = bar.bounding_box()
    page.mouse.click(x, box["y"] + box["height"] / 2)
    expect(page).to_have_url(re.compile(rf"/steps/{k}$"))
    verdict = page.locator("#pool .predict-verdict")
    expect(verdict).to_contain_text(f"It landed at {hex(header)}–{hex(end)} (its data at {hex(b.data - b.ctx.base)})")
    expect(verdict).to_contain_text("is inside it: right.")
    clicked = int(re.search(r"Your click, (0x[0-9a-f]+)", verdict.inner_text()).group(1), 16)
    assert header <= clicked < end and abs(clicked - (header + 40)) <= 16  # (a pixel is a few bytes there)
    truth = page.locator("#pool .predict-truth").bounding_box()
    guess = page.locator("#pool .predict-guess").bounding_box()
    assert truth["x"] <= guess["x"] <= truth["x"] + truth["width"]  # the guess drawn inside the truth
    page.locator("#pool").screenshot(path=str(screenshot_dir / "predict.png"))

    page.keyboard.press("ArrowRight")  # set_data adds no object: no question, the step is taken
    expect(page).to_have_url(re.compile(rf"/steps/{k + 1}$"))
    expect(page.get_by_role("region", name="Predict the next step")).to_have_count(0)

    r = next(s.index for s in trace.steps if s.call.startswith("result = ggml_mul_mat"))
    result = trace.state_at(r).tensor(trace.steps[r].tensor)
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/{r - 1}")
    expect(page.get_by_label("Predict")).to_be_checked()  # the mode is remembered
    page.keyboard.press("ArrowRight")
    ask = page.get_by_role("region", name="Predict the next step")
    ask.get_by_label("shape").fill(", ".join(str(int(n)) for n in result.ne[:2]))
    ask.get_by_label("data offset").fill("0")
    ask.get_by_role("button", name="Step and compare").click()
    expect(page).to_have_url(re.compile(rf"/steps/{r}$"))
    verdict = page.locator("#pool .predict-verdict")
    expect(verdict).to_contain_text(f"shape: you said [{int(result.ne[0])}, {int(result.ne[1])}], right.")
    expect(verdict).to_contain_text(f"data offset: you said 0x0; it is {hex(result.data - result.ctx.base)}.")
