"""The KV panel (app/views/debugger/kv.py) on the model walkthroughs, over tiny Gemma files with a
window of 4 positions: its figures are the engine's — the cells allocated are what KVCache
allocated for the same settings, the cells in use the tokens so far, n_kv the width of the mask
the attention node reads — and the window it draws is the mask's: the cells a layer sees at the
newest token are where the mask the FLASH_ATTN_EXT node of that layer read (its src[3], in the
recorded state at that node) holds 0, and they follow llama.cpp's n_swa rule."""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from app.views.debugger.kv import MASKS, KVView, kv_view
from app.views.debugger.where import Where
from engine.compute.kernels.common import to_f32
from engine.core.optable import GGMLOp
from engine.core.tensor_data import to_numpy
from engine.models.decoder import kv_cells
from engine.trace import StepKind, Trace
from tests.conformance.test_models import write_tiny_llama
from tests.support.tiny_gemma import WINDOW, write_tiny_gemma
from tests.support.vocab import vocab_files

PROMPT = "The capital of France is a fine city"
THEN = (5, 6, 7)
# (walkthrough, file, settings as the query gives them, as the recipe reads them)
CASES = {
    "gemma2": ("model", "gemma2-tiny.gguf", "&ub=32&c=512", (("n_ubatch", "32"), ("n_ctx", "512"))),
    "gemma3": ("gemma3", "gemma3-tiny.gguf", "", ()),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    models = tmp_path_factory.mktemp("models")
    write_tiny_gemma(models / "gemma2-tiny.gguf", "gemma2")
    write_tiny_gemma(models / "gemma3-tiny.gguf", "gemma3")
    spm = next(p for p in vocab_files() if p.name == "ggml-vocab-llama-spm.gguf")
    write_tiny_llama(models / "llama-tiny.gguf", vocab=spm)
    return models


@pytest.fixture(scope="module")
def client(models: Path, tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    return TestClient(create_app(Settings(data_dir=tmp_path_factory.mktemp("data"),
                                          models_dir=models)))


@pytest.fixture(scope="module", params=sorted(CASES))
def recorded(request, client: TestClient, models: Path):
    """(walkthrough, the file's path and hash, the query, the trace the app recorded)."""
    name, filename, extra, settings = CASES[request.param]
    store = client.app.state.store
    model = next(f for f in store.models() if f.name == filename)
    query = f"file={model.digest}&prompt={PROMPT}&then={','.join(map(str, THEN))}{extra}"
    assert client.get(f"/walkthroughs/{name}?{query}", follow_redirects=False).status_code in (
        200, 202, 303)
    traces = client.app.state.traces
    trace = traces.trace(traces.key(name, None, model.digest, PROMPT, THEN, settings), "test",
                         wait=300)
    assert isinstance(trace, Trace) and trace.error is None, trace
    return name, models / filename, model.digest, query, trace


def passes(trace: Trace) -> list[int]:
    return sorted({s.n_past for s in trace.steps if s.kind == StepKind.NODE and s.n_past is not None})


def attention_mask(trace: Trace, n_past: int, layer: int) -> np.ndarray:
    """The mask the layer's FLASH_ATTN_EXT node of that pass read: its src[3] in the state
    recorded at the node, [n tokens, n_kv cells]."""
    node = next(s for s in trace.steps if s.kind == StepKind.NODE and s.n_past == n_past
                and s.layer == layer and s.call.startswith(GGMLOp.FLASH_ATTN_EXT.name))
    state = trace.state_at(node.index)
    fa = state.tensor(node.tensor)
    mask = fa.source(3)
    return to_f32(to_numpy(mask), mask.type).reshape(-1, int(mask.ne[0]))


def view_at(trace: Trace, name: str, k: int) -> KVView:
    view = kv_view(trace, trace.steps[k], trace.state_at(k), Where(name, k))
    assert view is not None
    return view


def test_the_panels_figures_are_the_engines(recorded) -> None:
    """At a step of every pass: the cells allocated are KVCache's for the same settings, the
    cells in use the tokens so far, n_kv the attention's mask width (llama.cpp's padding to 256),
    and the sliding window's edges, drawn and told, the mask's and the n_swa rule's."""
    from engine.models import load_model
    from engine.models.params import ContextParams

    name, path, _digest, _query, trace = recorded
    n_prompt = len(trace.outputs["prompt_tokens"])
    swa = [bool(x) for x in trace.outputs["kv_swa_layers"]]
    sliding, glob = swa.index(True), swa.index(False)
    if name == "model":  # the builder's own KVCache, opened with the same settings
        model = load_model(path, params=ContextParams(n_ctx=512, n_ubatch=32, n_threads=1))
        cells, cells_swa, asked = model.kv_cache.n_ctx, model.kv_cache.n_ctx_swa, 512
        assert (cells, cells_swa) == (512, 256)  # (a SWA cache smaller than the context)
    else:  # the gemma3 walkthrough's own cache: 256 cells per layer
        cells = cells_swa = asked = 256
    assert trace.outputs["kv_n_swa"] == WINDOW

    seen_past_window = False
    for n_past in passes(trace):
        k = max(s.index for s in trace.steps if s.n_past == n_past)
        view = view_at(trace, name, k)
        main, window = attention_mask(trace, n_past, glob), attention_mask(trace, n_past, sliding)
        n_new = main.shape[0]
        assert (view.n_past, view.n_new, view.n_used) == (n_past, n_new, n_past + n_new)
        assert (view.n_ctx_asked, view.n_ctx, view.n_ctx_swa) == (asked, cells, cells_swa)
        assert view.n_kv == main.shape[1] == kv_cells(n_past + n_new, cells)
        assert view.n_swa == WINDOW
        newest = n_past + n_new - 1
        strips = {s.mask: s for s in view.strips}
        for mask, strip, first in ((main, strips[MASKS[0]], 0),
                                   (window, strips[MASKS[1]], max(0, newest - WINDOW + 1))):
            seen = np.flatnonzero(mask[-1] == 0)  # the newest token's row
            assert (strip.first, strip.last, strip.n_seen) == (seen[0], seen[-1], seen.size)
            assert (seen[0], seen[-1]) == (first, newest)  # causal, and the window's rule
            assert [c.seen for c in strip.cells] == [bool(mask[-1][c.index] == 0)
                                                     for c in strip.cells]
            assert [c.pos for c in strip.cells if c.pos is not None] == \
                list(range(strip.cells[0].index, newest + 1))  # one position per cell in use
        grids = {g.name: g for g in view.masks}
        for g in view.masks:  # each links to its tensor, where the step that set it left it
            url = re.fullmatch(rf"/walkthroughs/{name}/steps/(\d+)\?(?:.*&)?t=(\d+)\.(\d+)(?:&.*)?",
                               g.url)
            assert url is not None, g.url
            k_set, ref = int(url[1]), (int(url[2]), int(url[3]))
            assert k_set == view.set_step and trace.state_at(k_set).tensor(ref).name == g.name
        for mask_name, mask in ((MASKS[0], main), (MASKS[1], window)):
            g = grids[mask_name]
            assert [pos for _y, pos, _runs in g.rows] == list(range(n_past, newest + 1))
            for r, (_y, _pos, runs) in enumerate(g.rows):  # each run: cells of one value
                for run in runs:
                    a = round((run.x - g.x0) / g.cell) + g.cols[0][1]
                    b = a + round(run.w / g.cell)
                    assert np.all((mask[r, a:b] != 0) == run.masked), (mask_name, r, a, b)
        seen_past_window |= newest >= WINDOW
    assert seen_past_window
    assert n_prompt <= 32 and len(passes(trace)) == 1 + len(THEN)  # one ubatch, then one each


def test_the_kv_tab_is_on_the_page_from_the_first_pass(client: TestClient, recorded) -> None:
    name, _path, _digest, query, trace = recorded
    first = min(s.index for s in trace.steps if s.n_past is not None)
    before = client.get(f"/walkthroughs/{name}/steps/{max(0, first - 1)}?{query}")
    assert before.status_code == 200 and 'id="kv"' not in before.text
    k = len(trace.steps) - 1  # the end: the last pass's cache
    page = client.get(f"/walkthroughs/{name}/steps/{k}?{query}")
    assert page.status_code == 200
    assert 'data-panel="kv" aria-controls="kv">KV cache</button>' in page.text
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page.text)))
    n_used = len(trace.outputs["prompt_tokens"]) + len(THEN)
    assert f"cells in use {n_used}" in text
    newest = n_used - 1
    assert f"cells {newest - WINDOW + 1}..{newest} ({WINDOW} seen)" in text
    unseen = re.findall(r'class="kv-cell [a-z]+ unseen"', page.text)
    assert len(unseen) == newest + 1 - WINDOW  # the cells left behind by the window


def test_a_model_without_a_window_has_one_mask(client: TestClient) -> None:
    """A Llama file: no sliding-window cache, one causal mask, every cell in use seen."""
    digest = next(f.digest for f in client.app.state.store.models() if f.name == "llama-tiny.gguf")
    traces = client.app.state.traces
    trace = traces.trace(traces.key("model", None, digest, PROMPT, THEN), "test", wait=300)
    assert isinstance(trace, Trace) and trace.error is None, trace
    assert trace.outputs["kv_n_swa"] == 0 and not any(trace.outputs["kv_swa_layers"])
    view = view_at(trace, "model", len(trace.steps) - 1)
    newest = len(trace.outputs["prompt_tokens"]) + len(THEN) - 1
    assert view.n_ctx_swa is None and view.n_used == newest + 1 and view.n_ctx == 256
    assert [g.name for g in view.masks] == [s.mask for s in view.strips] == [MASKS[0]]
    row = attention_mask(trace, newest, 0)[-1]
    assert view.strips[0].n_seen == np.count_nonzero(row == 0) == newest + 1


def test_no_kv_panel_without_a_kv_cache(client: TestClient) -> None:
    assert 'id="kv"' not in client.get("/walkthroughs/simple-add/steps/3").text
