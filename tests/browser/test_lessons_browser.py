"""A lesson as a learner takes it: a wrong answer gets the hint (and where the answer lies), a
right one is explained and moves on, the debugger goes to the step the question was about, and
the learner's place survives a reload. The right answers are the engine's own numbers, read from
the state it rebuilds (not the lesson's resolver)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from engine.core.context import ggml_used_mem
from engine.programs import trace_program

pytestmark = pytest.mark.browser


def debugger_step(page: Page) -> int:
    return int(page.locator("#stepnav output").inner_text().split("/")[0])


def test_a_lesson_answered_wrong_then_right_advances_and_keeps_its_place(page: Page, server_url: str,
                                                                           screenshot_dir: Path):
    trace = trace_program("simple-ctx")
    a = next(s.index for s in trace.steps if s.call.startswith("a = ggml_new_tensor_2d"))
    mem_size = trace.state_at(0).contexts[0].mem_size
    used_after_a = ggml_used_mem(trace.state_at(a).contexts[0])

    page.goto(f"{server_url}/")
    newcomer = page.get_by_role("region", name="New to ggml? Learn with lessons")
    newcomer.get_by_role("link", name=re.compile("^Start")).click()
    expect(page).to_have_url(re.compile(r"/lessons/context-arena$"))
    first = page.get_by_role("region", name="Question 1 of 5")
    expect(first).to_be_visible()
    expect(page.locator("#debugger #stepnav output")).to_have_text(re.compile(r"^0 /"))
    expect(page.locator("#debugger #pool")).to_have_class(re.compile("lesson-focus"))  # the panel that shows it

    first.get_by_label("Your answer").fill(str(mem_size - 16))
    first.get_by_role("button", name="Check").click()
    expect(first.locator(".verdict")).to_contain_text("Hint:")
    expect(first.locator(".verdict")).to_contain_text(f"higher than {mem_size - 16}")
    first.get_by_label("Your answer").fill(str(mem_size))
    first.get_by_role("button", name="Check").click()
    expect(first.locator(".verdict")).to_contain_text(f"Right. The answer is {mem_size}")
    first.get_by_role("button", name="Next question").click()

    second = page.get_by_role("region", name="Question 2 of 5")
    expect(second).to_be_visible()
    expect(page.locator("#debugger #stepnav output")).to_have_text(re.compile(rf"^{a - 1} /"))  # before the call
    second.get_by_label("Your answer").fill(hex(used_after_a))  # hex reads too
    second.get_by_role("button", name="Check").click()
    expect(second.locator(".verdict")).to_contain_text(f"The answer is {used_after_a}")
    expect(page.locator("#debugger #stepnav output")).to_have_text(re.compile(rf"^{a} /"))  # the truth
    expect(page).to_have_url(re.compile(r"/lessons/context-arena$"))  # the lesson kept its address
    page.screenshot(path=str(screenshot_dir / "lesson.png"))
    second.get_by_role("button", name="Next question").click()
    expect(page.get_by_role("region", name="Question 3 of 5")).to_be_visible()

    page.reload()
    expect(page.get_by_role("region", name="Question 3 of 5")).to_be_visible()
    for n in (1, 2):
        expect(page.get_by_role("button", name=f"Question {n}", exact=True)).to_have_class(re.compile("done"))
    page.get_by_role("link", name="Lessons").first.click()
    item = page.locator('.lessonitem[data-lesson="context-arena"]')
    expect(item).to_contain_text("2 of 5 answered")
