"""Compare: two model files stepped in lockstep. The engine's figures against numpy computed
directly from the values it collected, the KLD against perplexity.py's own functions, identical
files giving no error, a mismatched pair refused in words; then the page, its fragment, its job's
progress and its refusals."""

from __future__ import annotations

import math
import re
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.routes import compare as route
from app.settings import Settings
from engine.gguf import GGUFReader
from engine.gguf.quantize import QuantizeParams, llama_model_quantize
from engine.models.compare import (MAX_VALUES, CompareError, Mismatch, compare_files,
                                   kept_values, layer_errors, node_diff, run_layers)
from engine.programs import FIXTURES_DIR
from engine.models.perplexity import KLDSums, base_rows, kld_rows
from engine.quants import dequantize
from engine.quants.ftype import parse_ftype
from tests.support.tiny_gemma import write_tiny_gemma

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A models folder: a tiny gemma3 (F32), its Q8_0 quantization, and a tiny gemma2."""
    root = tmp_path_factory.mktemp("cmp-models")
    write_tiny_gemma(root / "tiny-gemma3.gguf", "gemma3")
    write_tiny_gemma(root / "tiny-gemma2.gguf", "gemma2")
    shutil.copyfile(FIXTURES_DIR / "minilm-q8_0.gguf", root / "minilm.gguf")  # (an encoder)
    llama_model_quantize(root / "tiny-gemma3.gguf", root / "tiny-gemma3-q8_0.gguf",
                         QuantizeParams(parse_ftype("Q8_0").ftype))
    return {"f32": root / "tiny-gemma3.gguf", "q8": root / "tiny-gemma3-q8_0.gguf",
            "gemma2": root / "tiny-gemma2.gguf", "root": root}


@pytest.fixture(scope="module")
def quantized(files):
    return compare_files(files["f32"], files["q8"], PROMPT)


@pytest.fixture(scope="module")
def same(files):
    return compare_files(files["f32"], files["f32"], PROMPT)


def test_every_node_pairs_and_its_metrics_are_numpys(quantized):
    c = quantized
    assert len(c.a.nodes) == len(c.b.nodes) == len(c.diffs) > 100
    assert any(d.max_abs > 0 for d in c.diffs)  # Q8_0 is not F32: some node differs
    for x, y, d in zip(c.a.nodes, c.b.nodes, c.diffs):
        assert (x.name, x.ne) == (y.name, y.ne)
        a, b = x.values.astype(np.float64).ravel(), y.values.astype(np.float64).ravel()
        assert d.n == a.size
        if a.size == 0:
            continue
        assert d.max_abs == np.max(np.abs(b - a))
        ref = np.sum(a * a)
        if ref > 0:
            assert d.rel_rms == pytest.approx(np.sqrt(np.sum((b - a) ** 2) / ref), rel=1e-12)
        if np.linalg.norm(a) > 0 and np.linalg.norm(b) > 0:
            assert d.cosine == pytest.approx(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)), rel=1e-12)


def test_the_last_node_is_the_logits_and_the_layers_are_found(quantized):
    c = quantized
    last = c.a.nodes[-1]
    assert last.name == "result_output"
    # (the vocabulary's rows are longer than the cap: the last row's first MAX_VALUES values)
    np.testing.assert_array_equal(last.values[-1], c.a.logits[-1][:last.values.shape[1]])
    points = layer_errors(c)
    assert [p.layer for p in points] == list(range(c.a.n_layer))
    for p in points:
        assert c.a.nodes[p.node].name == f"l_out-{p.layer}"
        assert p.rel_rms == c.diffs[p.node].rel_rms


def test_every_node_has_its_layer(quantized):
    nodes, layers = quantized.a.nodes, run_layers(quantized.a)
    first = next(i for i, n in enumerate(nodes) if n.name == "norm-0")
    last = next(i for i, n in enumerate(nodes) if n.name == f"l_out-{quantized.a.n_layer - 1}")
    assert layers[:first] == (None,) * first and layers[last + 1:] == (None,) * (len(nodes) - last - 1)
    assert [x for x in layers[first:last + 1]] == sorted(layers[first:last + 1])  # (in order)
    for node, il in zip(nodes, layers):
        if re.fullmatch(r".*-\d+", node.name):
            assert node.name.endswith(f"-{il}")
    unnamed = [il for n, il in zip(nodes, layers) if n.name.startswith("cache_k_l")]
    assert unnamed == list(range(quantized.a.n_layer))  # a layer's cache write is in its layer


def test_the_kld_is_perplexitys_own(quantized):
    c = quantized
    targets = np.array([*c.a.tokens[1:], int(np.argmax(c.a.logits[-1]))], np.int64)
    s = KLDSums()
    kld_rows(c.b.logits, base_rows(c.a.logits, targets)[1], targets, s)
    assert [t.kld for t in c.tokens] == [float(k) for k in s.kld_values]
    assert sum(t.same_top for t in c.tokens) == s.n_same_top
    assert [t.target for t in c.tokens] == targets.tolist()
    for t in c.tokens:  # the top candidates: the largest of each run's softmax
        assert t.top_a[0].token == int(np.argmax(c.a.logits[t.position]))
        assert t.top_b[0].token == int(np.argmax(c.b.logits[t.position]))


def test_identical_files_give_no_error(same):
    assert all(d.max_abs == 0 and d.rel_rms == 0 for d in same.diffs)
    assert all(d.cosine is None or d.cosine == pytest.approx(1.0, abs=1e-12) for d in same.diffs)
    assert all(w.same_bytes and w.max_abs == 0 and w.rel_rms == 0 for w in same.weights)
    assert all(t.same_top for t in same.tokens)
    # the tool's KLD keeps the base's log-probabilities in 16 bits: a file against itself gives
    # a few millionths, never more (llama-perplexity prints the same)
    assert all(abs(t.kld) < 1e-4 for t in same.tokens)


def test_the_weights_error_is_the_dequantized_difference(files, quantized):
    with GGUFReader(files["f32"]) as a, GGUFReader(files["q8"]) as b:
        for w in quantized.weights:
            ta, tb = a.tensors[a.find_tensor(w.name)], b.tensors[b.find_tensor(w.name)]
            x = dequantize(ta.type, a.tensor_bytes(ta), ta.n_elements).astype(np.float64)
            y = dequantize(tb.type, b.tensor_bytes(tb), tb.n_elements).astype(np.float64)
            assert w.same_bytes == (ta.type == tb.type)
            assert w.max_abs == np.max(np.abs(y - x))
            assert w.rel_rms == pytest.approx(np.sqrt(np.sum((y - x) ** 2) / np.sum(x * x)), rel=1e-9)
    assert any(w.type_b == "q8_0" and w.rel_rms > 0 for w in quantized.weights)


def test_a_mismatched_pair_is_refused(files):
    with pytest.raises(CompareError) as e:
        compare_files(files["f32"], files["gemma2"], PROMPT)
    assert e.value.kind == Mismatch.ARCH and e.value.values == {"a": "gemma3", "b": "gemma2"}


def test_node_diff_edges():
    z = np.zeros(4, np.float32)
    d = node_diff(z, z)
    assert (d.max_abs, d.rel_rms, d.cosine) == (0.0, 0.0, None)
    d = node_diff(z, np.ones(4, np.float32))
    assert (d.max_abs, d.rel_rms, d.cosine) == (1.0, math.inf, None)


def test_a_node_keeps_its_last_rows_under_the_cap():
    from engine.ggml import (ggml_init, ggml_init_params, ggml_new_tensor_2d, GGML_TYPE_F32)
    from engine.core.tensor_data import set_data

    ctx = ggml_init(ggml_init_params(mem_size=1 << 24, mem_buffer=None, no_alloc=False))
    rows = MAX_VALUES // 100 + 7
    t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 100, rows)
    values = np.arange(100 * rows, dtype=np.float32).reshape(rows, 100)
    set_data(t, values)
    first, kept = kept_values(t)
    assert first == rows - MAX_VALUES // 100
    np.testing.assert_array_equal(kept, values[first:])


# --- the page -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def app_data(tmp_path_factory):
    return tmp_path_factory.mktemp("cmp-data")


@pytest.fixture(scope="module")
def client(files, app_data):
    return TestClient(create_app(Settings(data_dir=app_data, models_dir=files["root"])))


def _digest(client: TestClient, name: str) -> str:
    page = client.get("/compare").text
    m = re.search(r'<option value="([0-9a-f]{64})"[^>]*>' + re.escape(name) + "</option>", page)
    assert m, name
    return m.group(1)


@pytest.fixture(autouse=True)
def _wait_for_the_job(monkeypatch):
    monkeypatch.setattr(route, "QUICK", 600.0)


def test_the_form_lists_the_folder_and_the_types(client):
    r = client.get("/compare")
    assert r.status_code == 200
    assert "tiny-gemma3.gguf" in r.text and 'value="Q4_0"' in r.text and 'value="Q4_K_M"' in r.text
    assert 'value="IQ2_XXS"' not in r.text  # (it needs an importance matrix)


def test_a_quantization_made_here_stepped_node_by_node(client, files, app_data):
    a = _digest(client, "tiny-gemma3.gguf")
    r = client.get("/compare", params={"a": a, "b": "Q8_0", "prompt": PROMPT, "n": 40})
    assert r.status_code == 200, r.text
    assert re.search(r"Node 40 of \d+: ", r.text)
    assert 'id="cmp-tokens"' in r.text and 'id="cmp-weights"' in r.text and "<svg" in r.text
    assert r.text.count('class="bar here"') == 1 and "Inside layer " in r.text
    made = list((app_data / "quantized").glob("*.gguf"))
    assert len(made) == 1  # kept under the source's hash and the type
    # the same pair quantized here and from the folder: the same figures
    q8 = _digest(client, "tiny-gemma3-q8_0.gguf")
    r2 = client.get("/compare", params={"a": a, "b": q8, "prompt": PROMPT, "n": 40})
    metrics = lambda t: re.findall(r'<dd class="[a-z-]+">([^<]*)</dd>', t)  # noqa: E731
    assert metrics(r.text) == metrics(r2.text) and metrics(r.text)[0] != "0"
    # htmx asks for the node alone
    part = client.get("/compare", params={"a": a, "b": "Q8_0", "prompt": PROMPT, "n": 41},
                      headers={"HX-Request": "true", "HX-Target": "cmp-node"})
    assert part.text.lstrip().startswith('<section id="cmp-node"') and "Node 41 of" in part.text
    assert "<html" not in part.text
    assert list((app_data / "quantized").glob("*.gguf")) == made


def test_a_mismatched_pair_is_refused_in_words(client):
    a, b = _digest(client, "tiny-gemma3.gguf"), _digest(client, "tiny-gemma2.gguf")
    r = client.get("/compare", params={"a": a, "b": b, "prompt": PROMPT})
    assert r.status_code == 422
    assert "different architectures (&#39;gemma3&#39; and &#39;gemma2&#39;)" in r.text
    assert "Traceback" not in r.text


def test_an_encoder_is_refused_in_words(client):
    a = _digest(client, "minilm.gguf")
    r = client.get("/compare", params={"a": a, "b": a, "prompt": PROMPT})
    assert r.status_code == 422 and "&#39;bert&#39; is not a decoder" in r.text


@pytest.mark.parametrize("params, words", [
    ({"b": "Q9_9"}, "is not a file type this page quantizes to"),
    ({"b": "Q8_0", "prompt": "  "}, "Write a prompt"),
    ({"b": "Q8_0", "prompt": "word " * 40}, "this page runs at most 32"),
    ({"b": "0" * 64}, "No GGUF file with this hash"),
])
def test_bad_inputs_are_refused_in_words(client, params, words):
    a = _digest(client, "tiny-gemma3.gguf")
    r = client.get("/compare", params={"a": a, "prompt": PROMPT, **params})
    assert r.status_code == 422 and words in r.text


def test_a_long_run_shows_its_progress_then_the_page(client, monkeypatch):
    monkeypatch.setattr(route, "QUICK", 0.0)
    a = _digest(client, "tiny-gemma3.gguf")
    params = {"a": a, "b": "Q4_0", "prompt": "The capital of Italy is"}
    r = client.get("/compare", params=params)
    assert r.status_code == 202 and 'id="cmp-progress"' in r.text and 'hx-trigger="every 1s"' in r.text
    deadline, said = time.monotonic() + 120, set()
    while True:
        poll = client.get("/compare", params=params, headers={"HX-Request": "true", "HX-Target": "cmp-progress"})
        if "HX-Redirect" in poll.headers or time.monotonic() > deadline:
            break
        assert poll.status_code == 202
        said |= set(re.findall(r"(Quantizing the model to Q4_0|Running the first model|Running the "
                               r"second model|Comparing the weights)", poll.text))
        time.sleep(0.02)
    assert poll.headers["HX-Redirect"].startswith("/compare?")
    assert said  # (where it was, in words, at least once)


def test_an_upload_is_checked_and_kept(client, files):
    r = client.post("/compare/upload", content=b"not a gguf file at all")
    assert r.status_code == 422 and "not a valid GGUF file" in r.json()["error"]
    r = client.post("/compare/upload", content=files["q8"].read_bytes())
    digest = r.json()["digest"]
    a = _digest(client, "tiny-gemma3.gguf")
    page = client.get("/compare", params={"a": a, "b": digest, "prompt": PROMPT})
    assert page.status_code == 200 and "uploaded file" in page.text
    form = client.get("/compare", params={"a": digest}).text  # an upload as the first file
    assert re.search(rf'id="cmp-a".*?<option value="{digest}" selected>uploaded file', form, re.S)


def test_an_upload_past_the_limit_is_refused(files, tmp_path):
    small = TestClient(create_app(Settings(data_dir=tmp_path, models_dir=files["root"], upload_limit=1000)))
    r = small.post("/compare/upload", content=files["q8"].read_bytes())
    assert r.status_code == 413 and "1,000 bytes" in r.json()["error"]
    assert not list((tmp_path / "uploads").glob("*"))


def test_a_refusal_found_by_the_job_ends_the_polling(client, monkeypatch):
    monkeypatch.setattr(route, "QUICK", 0.0)
    a, b = _digest(client, "tiny-gemma3.gguf"), _digest(client, "tiny-gemma2.gguf")
    params = {"a": a, "b": b, "prompt": "A prompt of its own"}
    assert client.get("/compare", params=params).status_code in (202, 422)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        poll = client.get("/compare", params=params, headers={"HX-Request": "true", "HX-Target": "cmp-progress"})
        if "HX-Redirect" in poll.headers:
            break
        time.sleep(0.1)
    assert poll.headers["HX-Redirect"].startswith("/compare?")
    area = client.app.state.compare
    monkeypatch.setattr(area.jobs, "submit", lambda *args: pytest.fail("run again"))
    page = client.get("/compare", params=params)  # the refusal kept: said at once, not run again
    assert page.status_code == 422 and "different architectures" in page.text


def test_every_stage_of_a_comparison_has_words():
    from app.views.compare import QUANTIZING, STAGES
    from engine.models.compare import CompareStage

    assert set(STAGES) == {QUANTIZING} | {s.value for s in CompareStage}
