"""The mem_size accountant in Debian's chromium: on simple-ctx it tells what the `+ 1024` paid for
and what a smaller pool fails on; on simple-backend (no_alloc contexts) it holds no data."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from engine.core.accountant import account
from engine.programs import trace_program

pytestmark = pytest.mark.browser


def _last_account(name: str):
    trace = trace_program(name)
    state = trace.state_at(len(trace.steps) - 1)
    return len(trace.steps) - 1, {cid: account(ctx) for cid, ctx in state.contexts.items()}


def test_simple_ctx_account(page: Page, server_url: str, screenshot_dir):
    last, accs = _last_account("simple-ctx")
    acc = accs[0]
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/{last}")
    page.get_by_role("tab", name="mem_size").click()  # a tab under the DAG
    panel = page.locator("#accountant")
    expect(panel).to_contain_text(f"asked {acc.mem_size} bytes")
    expect(panel).to_contain_text(f"used {acc.used}")
    expect(panel.locator(".slack")).to_have_text(str(acc.slack))
    # the example's formula counts 2 tensors; the pool holds 3: the third is paid by the + 1024
    expect(panel).to_contain_text("3 × ggml_tensor_overhead() (368)")
    expect(panel).to_contain_text(f"The smallest mem_size that holds these objects is {acc.used}")
    expect(panel.locator(".acct-fail")).to_contain_text(
        f"not enough space in the context's memory pool (needed {acc.used}, "
        f"available {acc.used - 16})")
    panel.screenshot(path=str(screenshot_dir / "walkthrough-accountant.png"))
    # right after ggml_init nothing is used yet: everything is slack
    init = next(s.index for s in trace_program("simple-ctx").steps if "ggml_init(" in s.call)
    page.goto(f"{server_url}/walkthroughs/simple-ctx/steps/{init}")
    expect(page.locator("#accountant .slack")).to_have_text(str(acc.mem_size))


def test_backend_program_account(page: Page, server_url: str):
    last, accs = _last_account("simple-backend")
    page.goto(f"{server_url}/walkthroughs/simple-backend/steps/{last}")
    panel = page.locator("#accountant .account")
    expect(panel).to_have_count(len(accs))
    for i, (cid, acc) in enumerate(sorted(accs.items())):
        assert acc.data == 0  # no_alloc: the data lives in backend buffers
        expect(panel.nth(i)).to_contain_text(f"context {cid}: asked {acc.mem_size} bytes")
        expect(panel.nth(i).locator("tr", has_text="tensor data")).to_contain_text("0")
