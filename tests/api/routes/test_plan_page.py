"""The memory plan page over HTTP: every figure it shows is plan()'s own (the engine's plan is
held equal to llama.cpp's by tests/conformance/test_plan.py), the settings travel in the query and
an htmx request gets the figures alone with the URL to push, a setting llama.cpp refuses is a 422
in its words, hostile values are refused before any plan is made, and a plan is made of the
bundled model, an upload (a header-only one too) and a models folder's file."""

from __future__ import annotations

import html
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.cli_plan import plan_lines
from app.main import create_app
from app.settings import Settings
from app.views import plan as plan_view
from engine.models.params import ContextParams
from engine.models.plan import FIT_MARGIN, MAPPED, Plan, fit, plan
from engine.programs import FIXTURES_DIR
from tests.api.routes.test_heads import send_head
from tests.conformance.test_models_moe_mamba import write_tiny_mamba
from tests.conformance.test_plan import write_gemma3, write_sparse_llama
from engine.core.types import GGMLType

FRAGMENT = {"HX-Request": "true", "HX-Target": "plan-figures"}
MIB = 1 << 20


@pytest.fixture(scope="module")
def client(model_data):
    return TestClient(create_app(Settings(data_dir=model_data, fixtures_dir=FIXTURES_DIR)))


def text(body: str) -> str:
    """A page's words: tags dropped, entities read, spaces folded."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


def shown_bytes(body: str) -> list[int]:
    return [int(x) for x in re.findall(r'data-bytes="(\d+)"', body)]


def cache_bytes(body: str) -> dict[str, int]:
    """The buffer of each cache, as the caches' table shows it."""
    return {name: int(n) for name, n in re.findall(
        r'<tr class="cache" data-cache="([^"]+)">.*?<td class="num kv-size"><span class="mib" '
        r'title="[^"]*" data-bytes="(\d+)"', body, re.S)}


def assert_shows(body: str, p: Plan) -> None:
    """Every buffer of plan p in the page: the bar's segments and the table's rows (MiB to two
    decimals, bytes), llama.cpp's log lines, the caches, the compute buffer's peak, the layers."""
    words = text(body)
    assert f"In all: {p.total / MIB:.2f} MiB" in words and f"{p.total:,} bytes" in words
    rows = [(b.name, b.size) for b in p.model] + [(c.name, c.size) for c in p.caches] + \
        [("CPU", p.compute), ("CPU", p.output)]
    table = re.findall(r'<tr class="buffer-\w+" data-name="([^"]+)">.*?<td class="num">([\d.]+)</td>'
                       r'<td class="num">([\d,]+)</td>', body, re.S)
    assert [(name, int(n.replace(",", ""))) for name, _mib, n in table] == rows
    assert [m for _name, m, _n in table] == [f"{size / MIB:.2f}" for _name, size in rows]
    segments = re.findall(r'class="mem-seg [^"]*"[^>]*title="[^"]*: ([\d,]+) bytes"><span>([^<]+)</span>', body)
    assert [(int(n.replace(",", "")), label) for n, label in segments] == \
        [(size, f"{name} {size / MIB:.2f} MiB") for name, size in rows]
    for line in plan_lines(p)[1:]:
        if line.startswith("sched_reserve"):
            assert html.escape(line, quote=False) in body
            break
        assert html.escape(line, quote=False) in body, line
    assert cache_bytes(body) == {c.name: c.size for c in p.caches}
    for t in p.peak[:plan_view.PEAK_ROWS]:
        assert f"<code>{t.name}</code>" in body
        assert f'data-bytes="{t.size}"' in body
    have = shown_bytes(body)
    for la in p.layers:
        for n in list(la.weights.values()) + list(la.types.values()) + ([la.cache_bytes] if la.cache_bytes else []):
            assert n in have


def test_the_bundled_gemma_as_the_issue_quotes_it(client: TestClient, gemma_path: Path):
    r = client.get("/plan/bundled?c=4096&ctk=q8_0&ctv=q8_0&fa=on")
    assert r.status_code == 200, text(r.text)[:500]
    p = plan(gemma_path, ContextParams(n_ctx=4096, type_k=GGMLType.Q8_0, type_v=GGMLType.Q8_0,
                                       flash_attn="on"))
    assert_shows(r.text, p)
    words = text(r.text)
    assert "n_ctx = 4096" in words and "type_k = q8_0" in words
    # flash attention off is refused with a quantized V cache: the side says so in llama.cpp's words
    off = re.search(r'data-fa="off">(.*?)</div>', r.text, re.S)[1]
    assert "quantized V cache requires flash_attn to be enabled" in off
    # the logits are the peak, with their shape
    assert p.peak[0].name == "result_output"
    assert f"[{p.peak[0].ne[0]:,}, {p.peak[0].ne[1]:,}]" in words
    # the layers' weights with mmap are in the mapped buffer's column
    assert re.search(rf'<th class="num">{MAPPED}</th>', r.text)


def test_flash_attention_on_and_off_side_by_side(client: TestClient, gemma_path: Path):
    r = client.get("/plan/bundled?c=32768&fa=off")
    assert r.status_code == 200
    on = plan(gemma_path, ContextParams(n_ctx=32768, flash_attn="on"))
    off = plan(gemma_path, ContextParams(n_ctx=32768, flash_attn="off"))
    assert_shows(r.text, off)
    for side, p in (("on", on), ("off", off)):
        block = re.search(rf'data-fa="{side}">(.*?)</div>', r.text, re.S)[1]
        assert shown_bytes(block)[0] == p.compute
        assert f"<code>{p.peak[0].name}</code>" in block
    current = re.findall(r'<div class="side current" data-fa="(\w+)"', r.text)
    assert current == ["off"]
    words = text(r.text)
    if off.compute > on.compute:
        assert f"Without flash attention the compute buffer is {off.compute / MIB:.2f} MiB" in words
    else:
        assert f"Here flash attention leaves the compute buffer as it is ({on.compute / MIB:.2f} MiB)" in words


def test_load_mode_none_reads_the_weights_into_a_cpu_buffer(client: TestClient, gemma_path: Path):
    r = client.get("/plan/bundled?c=4096&lm=none")
    assert r.status_code == 200
    p = plan(gemma_path, ContextParams(n_ctx=4096, load_mode="none"))
    assert [b.name for b in p.model][0] == "CPU" and not p.mmap
    assert_shows(r.text, p)
    assert '<option value="none" selected>none</option>' in r.text


def test_htmx_asks_for_the_figures_alone_and_gets_the_url(client: TestClient, gemma_path: Path):
    r = client.get("/plan/bundled?c=8192&b=2048&ub=512&ctk=f16&ctv=f16&fa=auto&fit=&fitt=1024",
                   headers=FRAGMENT)
    assert r.status_code == 200
    assert "<html" not in r.text
    assert re.match(r'\s*<div id="plan-figures"', r.text)
    assert r.headers["HX-Push-Url"] == "/plan/bundled?c=8192"  # the defaults left out
    p = plan(gemma_path, ContextParams(n_ctx=8192))
    assert cache_bytes(r.text) == {c.name: c.size for c in p.caches}
    # a page of the same URL is the whole page, its form holding the values
    page = client.get("/plan/bundled?c=8192")
    assert '<form id="plan-form"' in page.text and 'name="c" min="0" max="32768" value="8192"' in page.text


@pytest.mark.parametrize("query,words", [
    ("ctv=q8_0&fa=off", "quantized V cache requires flash_attn to be enabled"),
    ("ctk=q3_K", "Unsupported cache type: q3_K"),
    ("fa=maybe", "error: unknown value for --flash-attn: 'maybe'"),
    ("b=0&ub=0", "n_batch and n_ubatch cannot both be zero"),
])
def test_a_refused_combination_is_llama_cpps_words(client: TestClient, query: str, words: str):
    for headers in ({}, FRAGMENT):
        r = client.get(f"/plan/bundled?{query}", headers=headers)
        assert r.status_code == 422
        assert words in text(r.text) and "Traceback" not in r.text
        assert 'role="alert"' in r.text
    # htmx restoring history (Back) swaps in only a 2xx answer: the refused page comes back as one
    r = client.get(f"/plan/bundled?{query}", headers={"HX-Request": "true", "HX-History-Restore-Request": "true"})
    assert r.status_code == 200 and words in text(r.text) and "<html" in r.text


@pytest.mark.parametrize("query,words", [
    ("c=1000000000000", "-c 1,000,000,000,000: at most 32,768 here (the model's own context)"),
    ("c=32769", "-c 32,769: at most 32,768 here"),
    ("c=-5", "-c '-5': not a whole number"),
    ("c=4e9", "-c '4e9': not a whole number"),
    ("ub=99999999", "-ub 99,999,999: at most 32,768 here"),
    ("b=" + "9" * 5000, "-b '" + "9" * 32 + "…': not a whole number"),
    ("fit=lots", "--fit 'lots': not a size"),
    ("fit=9999T", "--fit 9999T: at most"),
    ("nr=maybe", "-nr is a switch: 1 (given) or 0, not 'maybe'"),
    ("lm=disk", "error: invalid argument: disk (-lm"),
    ("ctk=%00%0a", "Unsupported cache type"),
])
def test_hostile_values_are_refused_before_any_plan(client: TestClient, monkeypatch, query: str, words: str):
    def no_plan(*a, **k):
        raise AssertionError("a refused value must not reach plan()")

    monkeypatch.setattr(plan_view, "plan", no_plan)
    monkeypatch.setattr(plan_view, "fit", no_plan)
    plan_view._plans.clear()
    r = client.get(f"/plan/bundled?{query}", headers=FRAGMENT)
    assert r.status_code == 422
    assert words in text(r.text), text(r.text)
    assert len(r.text) < 20_000  # the value is shown cut, not echoed whole


def test_a_file_with_too_many_layers_is_not_planned(tmp_path: Path, monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    write_sparse_llama(models / "deep.gguf", 64, 300, 128, 2, 320, GGMLType.F16)
    c = TestClient(create_app(Settings(data_dir=tmp_path / "data", models_dir=models)))
    monkeypatch.setattr(plan_view, "plan", lambda *a, **k: pytest.fail("planned a 300-layer file"))
    digest = c.app.state.store.models()[0].digest
    assert f"/plan/{digest}" in c.get("/plan").text  # the index lists the models folder
    r = c.get(f"/plan/{digest}")
    assert r.status_code == 422
    assert "This file has 300 layers; this page plans files of at most 256" in text(r.text)
    r = c.get(f"/plan/{digest}/fit?fit=8G", headers={"HX-Request": "true", "HX-Target": "plan-fit"})
    assert r.status_code == 422 and "files of at most 128 layers (this one has 300)" in text(r.text)


def upload(client: TestClient, data: bytes) -> str:
    r = client.post("/gguf", files={"file": ("m.gguf", data, "application/octet-stream")},
                    follow_redirects=False)
    assert r.status_code == 303, text(r.text)[:300]
    return r.headers["location"].rsplit("/", 1)[1]


@pytest.mark.parametrize("arch,write", [("gemma3", lambda p: write_gemma3(p, GGMLType.Q4_K)),
                                        ("mamba", lambda p: write_tiny_mamba(p, GGMLType.Q4_0))])
def test_an_uploads_plan_from_the_inspectors_link(client: TestClient, tmp_path: Path, arch, write):
    path = tmp_path / f"{arch}.gguf"
    write(path)
    digest = upload(client, path.read_bytes())
    inspector = client.get(f"/gguf/{digest}").text
    assert f'href="/plan/{digest}"' in inspector and "Memory plan" in inspector
    r = client.get(f"/plan/{digest}?c=1024")
    assert r.status_code == 200, text(r.text)[:500]
    p = plan(path, ContextParams(n_ctx=1024))
    assert_shows(r.text, p)
    assert f'href="/gguf/{digest}"' in r.text  # back to the inspector
    if arch == "mamba":
        assert [c.name for c in p.caches] == ["RS"] and "r and s" in text(r.text)
    else:  # a window of 64: the SWA cache holds the window and a ubatch, padded to 256
        assert {c.name: c.cells for c in p.caches} == {"non-SWA": 1024, "SWA": 768}
    assert str(client.app.state.settings.data_dir) not in r.text  # no server path shown


def test_a_header_only_upload_is_planned(tmp_path: Path):
    """A 7B-shaped LLaMA too large to upload: its header sent alone, it is planned as the
    whole file (plan() reads no weight)."""
    big = tmp_path / "llama-7b-shaped.gguf"
    size = write_sparse_llama(big, 4096, 32, 11008, 32, 32000, GGMLType.Q4_0)
    c = TestClient(create_app(Settings(data_dir=tmp_path / "data", upload_limit=100_000)))
    head = big.open("rb").read(1 << 20)
    url, _sent = send_head(c, head, size, len(head))
    digest = url.rsplit("/", 1)[1]
    r = c.get(f"/plan/{digest}?c=4096&nr=1")
    assert r.status_code == 200, text(r.text)[:500]
    p = plan(big, ContextParams(n_ctx=4096, no_repack=True))
    assert_shows(r.text, p)
    assert "header-only upload" in text(r.text)


def test_an_architecture_the_engine_does_not_plan(client: TestClient):
    digest = next(f.digest for f in client.app.state.store.fixtures() if f.name == "minilm-q8_0.gguf")
    r = client.get(f"/plan/{digest}")
    assert r.status_code == 422
    words = text(r.text)
    assert "architecture 'bert' is not planned" in words and "Traceback" not in r.text
    assert str(FIXTURES_DIR) not in words


def test_no_such_file(client: TestClient, tmp_path: Path):
    r = client.get("/plan/" + "0" * 64)
    assert r.status_code == 404 and "No GGUF file with this hash" in text(r.text)
    assert client.get("/plan/../../etc/passwd").status_code == 404
    empty = TestClient(create_app(Settings(data_dir=tmp_path / "empty")))
    r = empty.get("/plan/bundled")
    assert r.status_code == 404 and "not installed here" in text(r.text)
    assert "No model file here yet." in text(empty.get("/plan").text)


def test_fit_the_largest_context(client: TestClient, gemma_path: Path):
    page = client.get("/plan/bundled?fit=1.5G&ub=256")
    assert page.status_code == 200
    assert 'hx-get="/plan/bundled/fit?ub=256&amp;fit=1.5G"' in page.text  # loaded after the figures
    r = client.get("/plan/bundled/fit?ub=256&fit=1.5G", headers={"HX-Request": "true", "HX-Target": "plan-fit"})
    assert r.status_code == 200 and re.match(r'\s*<section id="plan-fit"', r.text)
    f = fit(gemma_path, int(1.5 * (1 << 30)), ContextParams(n_ubatch=256), True, FIT_MARGIN)
    words = text(r.text)
    assert f.largest is not None
    assert f"-c {f.largest}" in words
    assert f'href="/plan/bundled?c={f.largest}&amp;ub=256&amp;fit=1.5G"' in r.text
    if f.n_ctx is None:
        assert "llama-fit-params gives up" in words
    else:
        assert f"-c {f.n_ctx} -ub {f.n_ubatch}" in words
    assert f"({f.used_max / MIB:.2f} MiB of host buffers" in words
    # without JavaScript the answer is a page of its own; a refused memory is a 422
    assert "<html" in client.get("/plan/bundled/fit?ub=256&fit=1.5G").text
    bad = client.get("/plan/bundled/fit?fit=many", headers={"HX-Request": "true", "HX-Target": "plan-fit"})
    assert bad.status_code == 422 and "--fit 'many': not a size" in text(bad.text)


@pytest.mark.parametrize("name,query,asked", [
    ("model", "c=512&fa=on&ctk=q8_0", ContextParams(n_ctx=512, flash_attn="on", type_k=GGMLType.Q8_0)),
    ("gemma3", "fa=off", ContextParams(flash_attn="off", no_repack=True)),  # it never repacks: -nr
])
def test_a_walkthroughs_settings_link_to_their_plan(client: TestClient, gemma_path: Path, name, query, asked):
    page = client.get(f"/walkthroughs/{name}/steps/0?{query}")
    assert page.status_code == 200
    href = html.unescape(re.search(r'<a class="plan-link" href="([^"]+)">Memory plan</a>', page.text)[1])
    r = client.get(href)
    assert r.status_code == 200, text(r.text)[:300]
    assert_shows(r.text, plan(gemma_path, asked))


def test_requests_plan_in_parallel(client: TestClient, gemma_path: Path):
    """Several plans at once, as the server's threads make them: each its own, equal to plan()'s
    (the engine's simulated memory is shared by a thread's plans unless each has its own)."""
    contexts = (1024, 2048, 3072, 5120, 6144, 7168)
    plan_view._plans.clear()
    with ThreadPoolExecutor(len(contexts)) as pool:
        pages = list(pool.map(lambda c: client.get(f"/plan/bundled?c={c}&fa=off", headers=FRAGMENT), contexts))
    for c, r in zip(contexts, pages):
        assert r.status_code == 200, text(r.text)[:300]
        p = plan(gemma_path, ContextParams(n_ctx=c, flash_attn="off"))
        assert cache_bytes(r.text) == {k.name: k.size for k in p.caches}


def test_every_buffer_kind_has_a_label():
    assert set(plan_view.KIND_LABELS) == set(plan_view.BufferKind)
