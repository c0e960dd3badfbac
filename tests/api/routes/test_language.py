"""The interface's language: chosen from the browser, switched and remembered, in Chinese on the
debugger, the inspector and the error pages, and English untouched."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings

CJK = re.compile(r"[\u4e00-\u9fff]")
ZH = {"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.5"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    return TestClient(create_app(Settings(data_dir=tmp_path_factory.mktemp("data"))))


@pytest.mark.parametrize("url", ["/", "/walkthroughs/simple-ctx/steps/1", "/gguf",
                                 "/walkthroughs/simple-ctx/steps/12"])
def test_pages_follow_the_browser(client, url):
    en = client.get(url, headers={"Accept-Language": "en-US"})
    zh = client.get(url, headers=ZH)
    assert en.status_code == zh.status_code == 200
    assert '<html lang="en">' in en.text and '<html lang="zh-Hans">' in zh.text
    assert zh.headers["content-language"] == "zh-Hans"
    assert "Accept-Language" in ",".join(zh.headers.get_list("vary"))
    assert len(CJK.findall(zh.text)) > 20 and not CJK.search(en.text.replace("简体中文", ""))


def test_a_step_note_in_chinese(client):
    zh = client.get("/walkthroughs/simple-ctx/steps/1", headers=ZH).text
    assert "reserved 32 bytes of header" not in zh  # the engine's note, told in Chinese
    assert "ggml_new_tensor_2d" in zh and "336" in zh


def test_the_kernel_tab_and_the_scheduler_s_passes_in_chinese(client, monkeypatch):
    """The Kernel tab's summary (its kernel module's own words) and a scheduler pass's title (the
    step's call, made from a note) are told in Chinese, as every other panel is."""
    from app import traces
    from engine.compute.kernel_card import summary_of
    from engine.compute.kernels.matmul import compute_forward_mul_mat

    monkeypatch.setattr(traces, "QUICK", 600.0)
    english = summary_of(compute_forward_mul_mat)
    mul_mat = client.get("/walkthroughs/simple-ctx/steps/12", headers=ZH).text
    assert "MUL_MAT" in mul_mat and english not in mul_mat and "共享计数器" in mul_mat
    client.get("/walkthroughs/offload/steps/0", headers=ZH)
    cache = client.app.state.traces
    trace = cache.kept(cache.key("offload", None))
    k = next(s.index for s in trace.steps if s.kind == "pass")
    page = client.get(f"/walkthroughs/offload/steps/{k}", headers=ZH).text
    assert "tensors in buffers" not in page and "第 1 遍" in page


def test_the_switch_is_remembered(tmp_path):
    c = TestClient(create_app(Settings(data_dir=tmp_path)))
    r = c.get("/?lang=zh", headers={"Accept-Language": "en"})
    assert '<html lang="zh-Hans">' in r.text and "lang=zh" in r.headers["set-cookie"]
    assert '<html lang="zh-Hans">' in c.get("/gguf", headers={"Accept-Language": "en"}).text  # the cookie
    r = c.get("/?lang=en", headers=ZH)
    assert '<html lang="en">' in r.text
    assert '<html lang="en">' in c.get("/", headers=ZH).text


def test_errors_in_chinese(client):
    r = client.get("/walkthroughs/nope", headers=ZH)
    assert r.status_code == 404 and CJK.search(r.text) and "nope" in r.text
    assert "There is no walkthrough named" not in r.text
    r = client.get("/walkthroughs/simple-ctx/steps/999", headers=ZH)
    assert r.status_code == 404 and "999" in r.text and CJK.search(r.text)
