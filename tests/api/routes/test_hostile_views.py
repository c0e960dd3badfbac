"""Hostile tensor views and hostile arrays, as the red team sent them (issue 48, items 1 and 5).

Item 1: `ggml_view_4d(ctx, a, 4, 5, 1, 1, 2**62, 16, 16, 0)` is a view ggml accepts; opening a step
of its program killed the server (numpy's bounds check overflowed and the view was read). Now
every step of it, and of its kin, renders: the panels that would read outside the tensor's
memory say why in the panel (the engine's rule, the numbers), the rest of the page works, and a
legal view with a huge nb where ne = 1 still shows its values.

Item 5: an array value was stringified whole on every request of its page. Now a page decodes
its own items only, and a search reads the array a chunk at a time.

The cases about the server's time and memory run against one served app (tests/support/served.py),
each measured against the memory before it; the rest in-process.
"""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from app.views.gguf.array import ARRAY_PAGE, SEARCH_MAX
from engine.gguf.format import GGUFValueType
from engine.gguf.writer import GGUFContext
from tests.support.served import Served, serve

MiB = 1 << 20
ANSWER = 5.0  # seconds the server may take to answer a page
GROWTH = 50 * MiB  # bytes the server's memory may grow in one hostile case
ARRAY_GROWTH = 20 * MiB  # ... in the array case (stringified whole, one page of 4M ints added 33 MiB)
RECORDING = 120  # seconds a program's recording may take on a loaded machine

POOL = 1 << 18  # the programs' context: room for their views and a graph
HEAD = f'''import numpy as np
from engine.ggml import *

ctx = ggml_init(ggml_init_params(mem_size={POOL}, mem_buffer=None, no_alloc=False))
a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 64)
ggml_set_name(a, "a")
set_data(a, np.arange(64, dtype=np.float32))
'''
# (kept in no variable: a program's outputs are read when it ends, and this one only by the pages)
RED_TEAM = HEAD + '''ggml_set_name(ggml_view_4d(ctx, a, 4, 5, 1, 1, 2**62, 16, 16, 0), "red")
'''
# its kin, each named; True where every byte it reaches lies in the pool (its values are shown)
KIN = {
    "red": (False, "ggml_view_4d(ctx, a, 4, 5, 1, 1, 2**62, 16, 16, 0)"),
    "tall": (True, "ggml_view_4d(ctx, a, 4, 1, 1, 1, 2**63 + 4, 2**64 - 1, 2**62, 8)"),
    "nb0": (True, "ggml_view_4d(ctx, a, 4, 5, 1, 1, 0, 0, 0, 0)"),
    "before": (True, "ggml_view_1d(ctx, a, 4, -8)"),
    "many": (False, "ggml_view_2d(ctx, a, 1, 2**62, 0, 0)"),  # in the pool, but 2**62 elements
    "past": (False, f"ggml_view_2d(ctx, a, 4, 2, {POOL}, 0)"),  # its second row past the pool
    "wide": (False, "ggml_view_1d(ctx, a, 2**62, 0)"),
    "viewed": (True, "ggml_view_1d(ctx, red, 4, 8)"),
    "permuted": (True, "ggml_permute(ctx, red, 1, 0, 2, 3)"),  # (ggml's int staging: nb 2**62 -> 0)
    "transposed": (False, "ggml_transpose(ctx, red)"),
}
KIN_PROGRAM = HEAD + "".join(f'{name} = {expr}\nggml_set_name({name}, "{name}")\n'
                             for name, (_, expr) in KIN.items()) + '''
s = ggml_add(ctx, tall, tall)  # a node over a legal view with huge strides: the Kernel tab
gf = ggml_new_graph(ctx)
ggml_build_forward_expand(gf, s)
ggml_graph_compute_with_ctx(ctx, gf, n_threads)
'''
RED_ADD = HEAD + '''v = ggml_view_4d(ctx, a, 4, 5, 1, 1, 2**62, 16, 16, 0)
s = ggml_add(ctx, v, v)
gf = ggml_new_graph(ctx)
ggml_build_forward_expand(gf, s)
ggml_graph_compute_with_ctx(ctx, gf, n_threads)
'''
REFUSED = "does not hold"  # the engine's words for a view it did not read (TensorBoundsError)


def panel(page: str, pid: str) -> str:
    """The text of one panel of a step page (its section), unescaped."""
    m = re.search(rf'<section id="{pid}".*?</section>', page, re.S)
    assert m, f"no panel {pid}"
    return html.unescape(m.group(0))


def tensor_keys(page: str) -> dict[str, str]:
    """The tensors panel's rows: name -> the key that selects it."""
    return {html.unescape(name): key for key, name in
            re.findall(r'<td><a href="[^"]*?[?&](?:amp;)?t=(\d+\.\d+)[^"]*">([^<]*)</a></td>', page)}


def follow(get, url: str) -> str:
    """A program's run page followed until its trace is recorded: the step's URL."""
    deadline = time.monotonic() + RECORDING
    while "/steps/" not in url:
        r = get(url)
        if r.status_code == 303:
            url = r.headers["location"]
        else:
            assert r.status_code == 202, (r.status_code, r.text[-2000:])
            time.sleep(0.2)
        assert time.monotonic() < deadline, "the recording never finished"
    return url


def submit(post, get, source: str) -> str:
    r = post("/programs", data={"source": source, "threads": "1"})
    assert r.status_code == 303, r.text[-2000:]
    return follow(get, r.headers["location"])


# --- in-process: what each panel says -------------------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def client(data):
    app = create_app(Settings(data_dir=data, programs=True))
    yield TestClient(app)
    app.state.jobs.close(wait=60)


def get(client):
    return lambda url: client.get(url, follow_redirects=False)


def post(client):
    return lambda url, **kw: client.post(url, follow_redirects=False, **kw)


def every_step(client, first: str) -> list[str]:
    """Every step page of a trace, from the URL of its first step (each must answer 200)."""
    base = first.split("/steps/")[0]
    pages, n = [], 0
    while (r := client.get(f"{base}/steps/{n}")).status_code == 200:
        pages.append(r.text)
        n += 1
    assert r.status_code == 404 and n > 3, r.text[-2000:]
    return pages


def test_the_red_team_program_records_and_every_step_renders(client):
    first = submit(post(client), get(client), RED_TEAM)
    base = first.split("/steps/")[0]
    pages = every_step(client, first)
    last = pages[-1]
    red = tensor_keys(last)["red"]
    for hex_mode in ("struct", "data"):
        r = client.get(f"{base}/steps/{len(pages) - 1}?t={red}&hex={hex_mode}")
        assert r.status_code == 200
        strides, values = panel(r.text, "strides"), panel(r.text, "values")
        assert "nb = [4, 4611686018427387904, 16, 16]" in strides
        assert f"Its bytes are not read: view4: data + ggml_nbytes(tensor) <= mem_buffer + mem_size {REFUSED}" \
            in strides
        assert "ne [4, 5, 1, 1], nb [4, 4611686018427387904, 16, 16]" in strides
        assert 'class="error" role="alert"' in values and REFUSED in values and 'class="values"' not in values
        assert ("to_numpy" in panel(r.text, "hexview")) == (hex_mode == "data")
        assert "red" in tensor_keys(panel(r.text, "tensors"))  # the rest of the page works
        assert 'id="graph"' in r.text and 'id="source"' in r.text
    r = client.get(f"{base}/steps/{len(pages) - 1}?t={tensor_keys(last)['a']}")
    assert REFUSED not in panel(r.text, "strides") + panel(r.text, "values")
    assert ">63<" in panel(r.text, "values")  # a's values, as before


def test_after_a_restart_the_permalink_records_again_and_renders(client, data):
    first = submit(post(client), get(client), RED_TEAM)
    fresh = TestClient(create_app(Settings(data_dir=data, programs=True)))  # a new server, same data
    url = first.replace("/steps/0", "/steps/3")
    r = fresh.get(url, follow_redirects=False)
    if r.status_code != 200:  # recorded again, then the step
        url = follow(lambda u: fresh.get(u, follow_redirects=False), r.headers["location"])
        r = fresh.get(url)
    assert r.status_code == 200 and "Strides" in r.text
    fresh.app.state.jobs.close(wait=60)


def test_every_kin_of_the_view_renders_readable_or_refused(client):
    first = submit(post(client), get(client), KIN_PROGRAM)
    base = first.split("/steps/")[0]
    pages = every_step(client, first)
    last = len(pages) - 1
    keys = tensor_keys(pages[-1])
    for name, (readable, _expr) in KIN.items():
        r = client.get(f"{base}/steps/{last}?t={keys[name]}&hex=data")
        assert r.status_code == 200, name
        strides, values = panel(r.text, "strides"), panel(r.text, "values")
        assert (REFUSED not in strides + values) == readable, (name, strides, values)
    tall = client.get(f"{base}/steps/{last}?t={keys['tall']}").text
    assert "nb = [4, 9223372036854775812, 18446744073709551615, 4611686018427387904]" in panel(tall, "strides")
    assert [c for c in re.findall(r"<td>([^<]*)</td>", panel(tall, "values"))] == ["2", "3", "4", "5"]
    many = panel(client.get(f"{base}/steps/{last}?t={keys['many']}").text, "values")
    assert "ggml_nelements(tensor) * element size <= INT64_MAX " + REFUSED in many
    # the node over the legal view: the Kernel tab works its first element through
    nodes = [n for n, p in enumerate(pages) if 'id="worked-element"' in p]
    assert nodes, "no step shows the ADD node's kernel"
    assert "dst[0] = src0[0] + src1[0] = 2 + 2 = 4" in html.unescape(pages[nodes[0]])


def test_a_graph_over_the_red_team_view_ends_with_the_rule(client):
    first = submit(post(client), get(client), RED_ADD)
    pages = every_step(client, first)
    last = html.unescape(pages[-1])
    assert f"TensorBoundsError: view4: data + ggml_nbytes(tensor) <= mem_buffer + mem_size {REFUSED}" in last


# --- in-process: an array's pages ----------------------------------------------------------------

def forged_gguf(ints: int, strings: int) -> bytes:
    """A GGUF file of metadata only: `ints` int32 items 0, 1, ... and `strings` strings
    "tok000000", "tok000001", ..."""
    g = GGUFContext()
    g.set_val("general.name", GGUFValueType.STRING, "forged")
    g.set_arr("hostile.ints", GGUFValueType.INT32, np.arange(ints, dtype=np.int32))
    g.set_arr("hostile.strings", GGUFValueType.STRING, [f"tok{i:06d}" for i in range(strings)])
    return g.to_bytes()


def upload(c, data: bytes) -> str:
    r = c.post("/gguf", files={"file": ("forged.gguf", data, "application/octet-stream")},
               follow_redirects=False)
    assert r.status_code == 303, r.text[-2000:]
    return r.headers["location"].rsplit("/", 1)[1].split("?")[0]


def rows(page: str) -> list[tuple[int, str]]:
    return [(int(i), html.unescape(v)) for i, v in re.findall(
        r'<tr class="array-row"><td class="num">(\d+)</td><td><code class="token">([^<]*)</code>', page)]


def test_an_array_page_holds_its_items_and_a_search_its_matches(client):
    n = 3 * ARRAY_PAGE + 7
    digest = upload(client, forged_gguf(n, n))
    url = f"/gguf/{digest}/kv/hostile.ints"
    page = client.get(url + "?page=2").text
    assert rows(page) == [(i, str(i)) for i in range(ARRAY_PAGE, 2 * ARRAY_PAGE)]
    assert f"Items 101–200 of {n}" in html.unescape(page) and "page 2 of 4" in page
    page = client.get(url + "?page=1000000").text  # past the end: the last page
    assert rows(page) == [(i, str(i)) for i in range(3 * ARRAY_PAGE, n)]
    page = client.get(url + "?q=1").text  # every item with a 1 in it, in order, a page at a time
    ones = [i for i in range(n) if "1" in str(i)]
    assert rows(page) == [(i, str(i)) for i in ones[:ARRAY_PAGE]]
    assert f"of {len(ones)} matching “1”" in html.unescape(page)
    page = client.get(url + "?q=1&page=99").text
    last = (len(ones) - 1) // ARRAY_PAGE * ARRAY_PAGE
    assert rows(page) == [(i, str(i)) for i in ones[last:]]
    page = client.get(f"/gguf/{digest}/kv/hostile.strings?q=TOK00030&page=1").text
    assert rows(page) == [(i, f"tok{i:06d}") for i in range(300, 307)]
    assert "the search read" not in page


def test_a_search_reads_at_most_search_max_items(client):
    digest = upload(client, forged_gguf(SEARCH_MAX + 5, 1))
    page = html.unescape(client.get(f"/gguf/{digest}/kv/hostile.ints?q={SEARCH_MAX + 2}").text)
    assert "Nothing matches" in page
    assert f"the search read the first {SEARCH_MAX:,} of {SEARCH_MAX + 5:,} items" in page
    page = html.unescape(client.get(f"/gguf/{digest}/kv/hostile.ints?q={SEARCH_MAX - 1}").text)
    assert rows(page) == [(SEARCH_MAX - 1, str(SEARCH_MAX - 1))]


# --- against the served app: time, memory, processes ------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    tmp = tmp_path_factory.mktemp("hostile-views")
    with serve(tmp / "server.log", env={"GGML_LENS_DATA": str(tmp / "data")}) as s:
        yield s


def timed(c: httpx.Client, url: str) -> httpx.Response:
    t = time.monotonic()
    r = c.get(url)
    took = time.monotonic() - t
    assert took < ANSWER, f"GET {url} took {took:.1f} s"
    assert r.status_code == 200, (url, r.status_code, r.text[-2000:])
    return r


def settled_growth(s: Served, before: int) -> int:
    """How much the server's memory grew since `before`, after a moment for work it left running."""
    time.sleep(1.0)
    return s.rss() - before


def test_served_every_step_of_the_red_team_program_answers(served: Served):
    s = served
    with s.client(timeout=RECORDING) as c:
        first = submit(lambda u, **kw: c.post(u, **kw), lambda u: c.get(u), RED_TEAM)
    base = first.split("/steps/")[0]
    with s.client(timeout=ANSWER) as c:
        timed(c, first)  # (the trace loaded, the templates compiled: then measured)
        before = s.rss()
        n, keys = 0, {}
        while (r := c.get(f"{base}/steps/{n}")).status_code == 200:
            keys |= tensor_keys(r.text)
            for key in keys.values():
                for mode in ("struct", "data"):
                    timed(c, f"{base}/steps/{n}?t={key}&hex={mode}")
            n += 1
        assert r.status_code == 404 and "red" in keys
        red = timed(c, f"{base}/steps/{n - 1}?t={keys['red']}").text
        assert REFUSED in panel(red, "strides")
        growth = settled_growth(s, before)
    print(f"every step of the red team's program: the server grew {growth / MiB:.1f} MiB")
    assert growth < GROWTH
    assert s.no_children_within(5) == [] and s.alive()


def test_served_a_16_mib_array_is_answered_a_page_at_a_time(served: Served):
    s = served
    n_ints, n_strings = 1 << 22, 1 << 20  # 16 MiB of int32, and a million strings (17 MiB)
    with s.client(timeout=60) as c:
        digest = upload(c, forged_gguf(n_ints, n_strings))
    with s.client(timeout=ANSWER) as c:
        timed(c, f"/gguf/{digest}")
        before = s.rss()
        ints, strings = f"/gguf/{digest}/kv/hostile.ints", f"/gguf/{digest}/kv/hostile.strings"
        last = n_ints // ARRAY_PAGE * ARRAY_PAGE  # the first item of the last page
        for url, first, stop in ((ints, 0, ARRAY_PAGE), (f"{ints}?page=20000", 1999900, 2000000),
                                 (f"{ints}?page=1000000000", last, n_ints),  # past the end: the last
                                 (f"{strings}?page=5000", 499900, 500000)):
            page = html.unescape(timed(c, url).text)
            assert [i for i, _ in rows(page)] == list(range(first, stop)), url
        page = html.unescape(timed(c, f"{ints}?q=999999").text)
        assert rows(page) == [(999999, "999999")]
        assert f"the search read the first {SEARCH_MAX:,} of {n_ints:,} items" in page
        page = html.unescape(timed(c, f"{strings}?q=tok99999").text)
        assert rows(page) == [(i, f"tok{i:06d}") for i in range(999990, 1000000)]
        growth = settled_growth(s, before)
    print(f"pages and searches of 16 MiB arrays: the server grew {growth / MiB:.1f} MiB")
    assert growth < ARRAY_GROWTH
    assert s.alive()
