"""Walkthrough routes as a table: (url, htmx?, status, text expected)."""

from __future__ import annotations

import html
import re

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from engine.programs import PROGRAMS

CASES = [
    ("/", False, 200, ["simple-ctx", "GGUF inspector", "Two matrices in one context"]),
    ("/walkthroughs/simple-ctx", False, 200, ["Previous step", "Next step", "ggml_init"]),
    ("/walkthroughs/simple-ctx/steps/0", False, 200, ['aria-disabled="true" data-key="ArrowLeft"',
                                                       "allocated a pool of 84432 bytes"]),
    ("/walkthroughs/simple-ctx/steps/1", False, 200, ["reserved 32 bytes of header, 336 of tensor struct",
                                                       "type = GGML_TYPE_F32", "ne = {2, 4, 1, 1}"]),
    ("/walkthroughs/simple-ctx/steps/1", True, 200, ['<div id="debugger"']),
    ("/walkthroughs/simple-ctx/steps/12", False, 200, ["MUL_MAT -&gt; &#39;node_0&#39;", "thread 0",
                                                        "<svg", "110"]),
    ("/walkthroughs/simple-ctx/steps/13", False, 200, ['aria-disabled="true" data-key="ArrowRight"']),
    ("/walkthroughs/threads/steps/18?threads=3", False, 200, ["thread 2", "chunks"]),
    ("/walkthroughs/quantized-tensor/steps/20?t=0.1168&row=2&block=0", False, 200,
     ["Dequantized", "scale, fp16"]),
    ("/walkthroughs/views-and-permute/steps/12", False, 200, ["permuted", "not contiguous"]),
    ("/walkthroughs/nope", False, 404, ["There is no walkthrough named"]),
    ("/walkthroughs/simple-ctx/steps/999", False, 404, ["there is no step 999"]),
    ("/walkthroughs/simple-ctx/steps/-1", False, 404, ["there is no step -1"]),
    ("/walkthroughs/simple-ctx/steps/1?threads=99", False, 422, ["threads"]),
    ("/walkthroughs/simple-ctx/steps/1?t=../../etc", False, 422, ["not valid"]),
    ("/walkthroughs/simple-ctx/goto?step=5", False, 200, ["step 5"]),
    ("/walkthroughs/simple-ctx/steps/4?t=0.32&hex=data", False, 200,
     ["data at pool offset 0x170", "element 7", 'data-field="element 1">41<']),
    ("/walkthroughs/simple-ctx/steps/4?hex=everything", False, 422, ["not valid"]),
    ("/walkthroughs/gguf-load/steps/0?file=" + "0" * 64, False, 404, ["No GGUF file with hash"]),
    ("/walkthroughs/simple-ctx/steps/0?file=" + "0" * 64, False, 422, ["reads no file"]),
    ("/walkthroughs/gguf-load/steps/0?file=../x", False, 422, ["not valid"]),
]


@pytest.fixture(scope="module")
def client(model_data):
    return TestClient(create_app(Settings(data_dir=model_data)))


@pytest.mark.parametrize("url,htmx,status,texts", CASES, ids=[c[0] for c in CASES])
def test_routes(client, url, htmx, status, texts):
    r = client.get(url, headers={"HX-Request": "true"} if htmx else {})
    assert r.status_code == status, r.text[:500]
    for text in texts:
        assert text in r.text, text
    assert "Traceback" not in r.text
    if htmx:
        assert "<html" not in r.text  # only the partial


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_walkthrough_renders_its_steps(client, name):
    first = client.get(f"/walkthroughs/{name}/steps/0")
    assert first.status_code == 200
    n = int(first.text.split('max="')[1].split('"')[0])
    spread = 8 if PROGRAMS[name].model else 25  # a real model's 3,000 steps: a few pages
    steps = range(n + 1) if n < 40 else sorted({*range(0, n + 1, max(1, n // spread)), n})
    for k in steps:  # every step of the small ones; 25 spread over the large ones
        r = client.get(f"/walkthroughs/{name}/steps/{k}", headers={"HX-Request": "true"})
        assert r.status_code == 200, (name, k, r.text[:300])


def test_gguf_load_reads_an_uploaded_file(client, tmp_path):
    """The inspector's "Load into a context" opens gguf-load on the uploaded file."""
    import numpy as np

    from engine.gguf.api import gguf_add_tensor, gguf_init_empty, gguf_write_to_file

    g = gguf_init_empty()
    gguf_add_tensor(g, "tiny.weight", 0, [4, 2], np.arange(8, dtype=np.float32).tobytes())
    path = tmp_path / "tiny.gguf"
    gguf_write_to_file(g, path, False)
    r = client.post("/gguf", files={"file": ("tiny.gguf", path.read_bytes())},
                    follow_redirects=False)
    assert r.status_code == 303
    digest = r.headers["location"].rsplit("/", 1)[-1]
    page = client.get(f"/walkthroughs/gguf-load?file={digest}")
    assert page.status_code == 200 and f"file={digest}" in page.text
    last = int(page.text.split('max="')[1].split('"')[0])
    end = client.get(f"/walkthroughs/gguf-load/steps/{last}?file={digest}")
    assert "tiny.weight" in end.text and "GGUF tensor data binary blob" in end.text


def test_graph_svg_is_sent_only_when_the_graph_changed(client, tmp_path):
    """The DAG's SVG has its own immutable URL, keyed by the drawing's hash; the element holding
    it is named by that key, so htmx keeps it on the page (hx-preserve) while the graph drawn
    stays the same, and fetches the new URL only when it changes."""
    full = client.get("/walkthroughs/simple-ctx/steps/12")  # a page: the SVG is inline
    key = full.text.split('aria-labelledby="graph-h" data-key="')[1].split('"')[0]
    assert "<svg" in full.text and len(key) == 16
    assert f'id="dag-{key}" class="dag" hx-preserve="true"' in full.text
    same = client.get("/walkthroughs/simple-ctx/steps/13", headers={"HX-Request": "true"})
    assert f'id="dag-{key}" class="dag" hx-preserve="true"' in same.text and "<svg" not in same.text
    assert 'id="graph-style"' in same.text  # the highlight is still sent
    other = client.get("/walkthroughs/simple-ctx/steps/9",  # mid-build: a smaller graph
                       headers={"HX-Request": "true"})
    other_key = other.text.split('aria-labelledby="graph-h" data-key="')[1].split('"')[0]
    assert other_key != key and "<svg" not in other.text
    url = html.unescape(other.text.split(f'id="dag-{other_key}"')[1].split('hx-get="')[1]
                        .split('"')[0])
    svg = client.get(url)
    assert svg.status_code == 200 and "<svg" in svg.text
    assert svg.headers["content-type"].startswith("image/svg+xml")
    assert "immutable" in svg.headers["cache-control"]
    # another worker, which drew nothing yet, draws the same bytes from the URL alone, and
    # refuses a key that is not the step's drawing
    fresh = TestClient(create_app(Settings(data_dir=tmp_path)))
    assert fresh.get(url).text == svg.text
    assert fresh.get(url.replace(other_key, key)).status_code == 404


def _tensor_rows(text: str) -> list[tuple[str, str, bool]]:
    """The tensors panel's rows: (link, name, selected)."""
    section = text.split('<section id="tensors"')[1].split("</section>")[0]
    return [(html.unescape(href), html.unescape(name), "selected" in cls) for cls, href, name in
            re.findall(r'<tr class="([^"]*)">\s*<td><a href="([^"]+)">([^<]*)</a>', section)]


def test_the_tensor_list_is_paged_and_finds_any_tensor(client):
    """A model's list of tensors comes a page at a time (the page holding the selected tensor);
    a later page comes alone (htmx swaps it in), its tensors are links that select them, and
    the filter finds a tensor by name whatever page it is on."""
    from app.views.debugger.tensors import PAGE

    first = client.get("/walkthroughs/tiny-llama/steps/0")
    last = int(first.text.split('max="')[1].split('"')[0])
    base = f"/walkthroughs/tiny-llama/steps/{last}"
    page0 = client.get(f"{base}?tp=0")
    rows0 = _tensor_rows(page0.text)
    assert len(rows0) == PAGE and f"Rows 1 to {PAGE} shown." in page0.text
    total = int(page0.text.split(" tensor(s) in creation order.")[0].rsplit(">", 1)[1])
    assert total > PAGE
    assert 'aria-label="page 2 of the tensor list"' in page0.text
    part = client.get(f"{base}/tensors?tp=1", headers={"HX-Request": "true"})
    assert part.status_code == 200 and part.text.lstrip().startswith('<section id="tensors"')
    assert "<html" not in part.text and "Page:" in part.text
    rows1 = _tensor_rows(part.text)
    assert 0 < len(rows1) <= PAGE and not {r[0] for r in rows1} & {r[0] for r in rows0}
    href, name, _selected = next(r for r in rows1 if r[1] != "(unnamed)")
    # its link selects it: the step's page opens the list at the page holding it, its row marked
    chosen = client.get(href)
    assert chosen.status_code == 200 and href.startswith(f"{base}?")
    assert (href, name, True) in _tensor_rows(chosen.text)
    assert f"Rows {PAGE + 1} to " in chosen.text
    # the filter finds it from any page, and says how many match
    found = client.get(f"{base}/tensors", params={"tp": 0, "tq": name.upper()})
    assert name in [r[1] for r in _tensor_rows(found.text)]
    assert f"of {total} tensors match" in found.text
    nothing = client.get(f"{base}/tensors", params={"tq": "no such tensor"})
    assert not _tensor_rows(nothing.text) and "No tensor's name contains" in nothing.text
    assert client.get(f"{base}/tensors?tp=-1").status_code == 422


def test_a_search_for_a_tensors_name_opens_its_steps_with_it_selected(client):
    """A step found by a tensor's whole name opens with that tensor selected, its row on the
    tensor list's page shown (a model's list is paged: it would not be on the first page), and a
    search for other words links the steps as they are."""
    import re

    found = client.get("/walkthroughs/tiny-llama/search", params={"q": "blk.1.ffn_up.weight"})
    links = re.findall(r'href="(/walkthroughs/tiny-llama/steps/\d+\?[^"]*)"', found.text)
    assert links and all("t=" in link for link in links)
    step = client.get(links[0].replace("&amp;", "&"))
    assert ("blk.1.ffn_up.weight", True) in [(r[1], r[2]) for r in _tensor_rows(step.text)]
    other = client.get("/walkthroughs/tiny-llama/search", params={"q": "mul_mat"})
    assert "t=" not in "".join(re.findall(r'href="(/walkthroughs/tiny-llama/steps/[^"]*)"', other.text))


def test_the_tensor_list_is_the_same_in_chinese(client):
    r = client.get("/walkthroughs/tiny-llama/steps/0?tp=0&lang=zh")
    last = int(r.text.split('max="')[1].split('"')[0])
    page = client.get(f"/walkthroughs/tiny-llama/steps/{last}?tp=0&lang=zh")
    assert "按名称筛选" in page.text and "显示第 1 到第 100 行。" in page.text
    client.get("/?lang=en")  # (the language is a cookie: the other tests read English)


def test_gemma3_reads_the_learners_prompt_and_appends_tokens(client):
    """The prompt is an input of the trace; "append" runs one more pass through the KV cache;
    the odds shown are the model's (the engine's builder gives the same top token)."""
    r = client.get("/walkthroughs/gemma3?prompt=The%20capital%20of%20Italy%20is")
    assert r.status_code == 200
    assert "prompt=The%20capital%20of%20Italy%20is" in str(r.url)
    page = html.unescape(r.text)
    assert "<bos>" in page and "Italy" in page and "Next token after the prompt" in page
    link = page.split('title="run one more pass with this token through the KV cache"')[0]
    append = link.rsplit('href="', 1)[1].split('"')[0]
    assert "then=" in append
    r2 = client.get(append)
    assert r2.status_code == 200
    page2 = html.unescape(r2.text)
    assert "1 appended" in page2 and "Next token after" in page2
    n1 = int(r.text.split('max="')[1].split('"')[0])
    n2 = int(r2.text.split('max="')[1].split('"')[0])
    assert n2 > n1  # one more pass: its calls and nodes


def test_gemma3_refuses_bad_inputs(client):
    assert client.get("/walkthroughs/gemma3/steps/0?then=abc").status_code == 422
    assert client.get("/walkthroughs/gemma3/steps/0?prompt=" + "x" * 401).status_code == 422
    r = client.get("/walkthroughs/simple-ctx/steps/0?prompt=hello")
    assert r.status_code == 422 and "reads no prompt" in r.text
    r = client.get("/walkthroughs/gemma3/steps/0?then=999999")  # the run stops, and says why
    assert r.status_code == 200 and "Traceback" not in r.text
    assert "appended token ids must lie in [0, 262144)" in html.unescape(r.text)
