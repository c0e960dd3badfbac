"""The mnist-train walkthrough in Debian's chromium: a learner watches a gradient being filled,
sees a weight's value beside its gradient, follows the backward nodes in the DAG, and reads how
training went in the Training tab."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from engine.programs import trace_program

pytestmark = pytest.mark.browser


def _step_of(trace, text: str) -> int:
    return next(s.index for s in trace.steps if text in s.call)


def test_training_step_and_curves(page: Page, server_url: str, screenshot_dir: Path):
    trace = trace_program("mnist-train")
    out = trace.outputs  # what the engine computed while the program ran
    page.goto(f"{server_url}/")
    page.get_by_role("link", name="mnist-train").click()
    # (recording it takes seconds: its progress shows until the debugger opens)
    expect(page).to_have_url(re.compile(r"/walkthroughs/mnist-train/steps/0$"), timeout=120_000)

    # the node that fills fc1.weight's gradient (an OUT_PROD of the backward pass)
    n = _step_of(trace, "-> 'grad for fc1.weight'")
    page.goto(f"{server_url}/walkthroughs/mnist-train/steps/{n}")
    expect(page.locator("#source")).to_contain_text("OUT_PROD")
    dag = page.locator("#graph svg").first
    expect(dag).to_contain_text("grad for fc1.weight")
    expect(page.locator("#graph .backward-legend")).to_contain_text("Outlined purple: the backward pass")
    expect(dag.locator("g.node polygon[stroke=\"#8a3ffc\"]").first).to_be_attached()
    page.get_by_role("tab", name="Tensors").click()
    page.get_by_role("link", name="fc1.weight", exact=True).first.click()
    page.get_by_role("tab", name="Values").click()
    values = page.locator("#values")
    expect(values).to_contain_text("value of fc1.weight")
    expect(values).to_contain_text("its gradient, grad for fc1.weight")
    expect(values.locator(".pair .heat")).to_have_count(2)  # 64 x 32 values each: two heatmaps
    page.screenshot(path=str(screenshot_dir / "walkthrough-train-gradient.png"), full_page=True)

    # the AdamW steps come last in the training step
    n = _step_of(trace, "-> 'adamw step for fc1.weight'")
    page.goto(f"{server_url}/walkthroughs/mnist-train/steps/{n}")
    expect(page.locator("#source")).to_contain_text("OPT_STEP_ADAMW")

    page.get_by_role("tab", name="Training").click()
    panel = page.locator("#training")
    acc, unc = out["test_accuracy"]
    expect(panel).to_contain_text(f"Accuracy on 250 digits it never saw: {100 * acc:.1f}% ± {100 * unc:.1f}%")
    expect(panel.locator("figure.chart")).to_have_count(2)
    expect(panel.locator("polyline.train")).to_have_count(2)
    wrong = sum(p != y for p, y in zip(out["test_pred"][:24], out["test_labels"][:24]))
    expect(panel.locator("ul.digits li")).to_have_count(24)
    expect(panel.locator("ul.digits li.wrong")).to_have_count(wrong)
    assert acc > 0.85  # the network learned to read digits
    page.screenshot(path=str(screenshot_dir / "walkthrough-train.png"), full_page=True)
