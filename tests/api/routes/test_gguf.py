"""The GGUF inspector's routes, as a table of (request, htmx target, status, texts expected),
plus the checks a table cannot hold: row counts, a Q8_0 block against engine.quants.dequantize,
bad and hostile uploads, the size limit while streaming, eviction, and a second worker."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from app.store import UploadStore, UploadTooLarge
from engine.gguf import GGUFReader
from engine.quants import dequantize
from engine.core.types import GGMLType
from engine.programs import FIXTURES_DIR

FIXTURES = FIXTURES_DIR
MINILM = FIXTURES / "minilm-q8_0.gguf"
VOCAB = FIXTURES / "ggml-vocab-llama-spm.gguf"
BAD = {  # payloads the reader must refuse, and a word its GGUFError message holds
    "negative n_tensors": (b"GGUF\x03\x00\x00\x00" + b"\xff" * 8, "n_tensors at byte 8"),
    "not gguf": (b"PK\x03\x04 this is a zip file, not a model", "invalid magic"),
    "cut short": (MINILM.read_bytes()[:50_000], "cannot fit in the 46315 bytes left"),
    "cut in the data": (MINILM.read_bytes()[:1_000_000], "lies past the end of the file"),
    "empty with a name": (b"", "magic"),
}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


M, V = sha(MINILM), sha(VOCAB)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("data")))
    return TestClient(app)


def htmx(target: str | None) -> dict[str, str]:
    return {"HX-Request": "true", "HX-Target": target} if target else {}


def upload(client: TestClient, name: str, data: bytes):
    return client.post("/gguf", files={"file": (name, data, "application/octet-stream")},
                       follow_redirects=False)


CASES = [  # (url, htmx target, status, texts the response must hold)
    ("/gguf", None, 200, ["Inspect", "minilm-q8_0.gguf", "ggml-vocab-llama-spm.gguf",
                          f'href="/gguf/{M}"', "What a GGUF file holds"]),
    (f"/gguf/{M}", None, 200, ["MiniLM L6 H384 Uncased", "101 tensors", "73 keys",
                               'id="gguf-bytemap"', 'id="gguf-kv-table"',
                               'id="gguf-tensors-table"', "25,285,312 bytes",
                               f"/walkthroughs/gguf-load?file={M}"]),
    (f"/gguf/{V}", None, 200, ["llama-spm", "This file holds no tensors", "32,000 items"]),
    # metadata search, as a page and as the htmx partial
    (f"/gguf/{M}?q=head_count", None, 200, ["1 of 73 keys match", "bert.attention.",
                                            "head_count", "<html"]),
    (f"/gguf/{M}?q=HEAD_COUNT", "gguf-kv-table", 200, ["1 of 73 keys match",
                                                       'id="gguf-kv-table"']),
    (f"/gguf/{M}?q=no-such-key", "gguf-kv-table", 200, ["0 of 73 keys match"]),
    # tensors: filter, sort, grouping
    (f"/gguf/{M}?filter=attn_q", "gguf-tensors-table", 200,
     ["12 of 101 tensors match", "blk.5.attn_q.weight", "64 × F32, 37 × Q8_0"]),
    (f"/gguf/{M}?filter=q8_0&group=none", "gguf-tensors-table", 200, ["37 of 101 tensors match"]),
    (f"/gguf/{M}?sort=size&order=desc", "gguf-tensors-table", 200,
     ['aria-sort="descending"', "size ▼"]),
    (f"/gguf/{M}?sort=nonsense&order=sideways", None, 200, ["101 tensors"]),  # lenient
    # the byte map: the magic by default, any item by its index
    (f"/gguf/{M}", "gguf-bytemap", 200, ["47 47 55 46", "GGUF"]),
    (f"/gguf/{M}?seg=4", "gguf-bytemap", 200, ["general.architecture", "8 = str",
                                               "uint64 length"]),
    (f"/gguf/{M}?seg=99999", "gguf-bytemap", 200, ["Inside tensor data (101)", "previous item"]),
    # a long array, paged (tokens beside their scores and types)
    (f"/gguf/{V}/kv/tokenizer.ggml.tokens?page=2", None, 200,
     ["Items 101–200 of 32,000", "page 2 of 320", "&lt;0x61&gt;", "6 (byte)", "score"]),
    (f"/gguf/{V}/kv/tokenizer.ggml.tokens?page=320", "gguf-array", 200,
     ["Items 31,901–32,000 of 32,000"]),
    (f"/gguf/{V}/kv/tokenizer.ggml.scores?q=%E2%96%81theory", "gguf-array", 200,
     ["1 of", "▁theory"]),
    (f"/gguf/{M}/kv/tokenizer.ggml.tokens?page=99999", None, 200, ["page 306 of 306"]),
    (f"/gguf/{M}/kv/general.name", None, 200, ["MiniLM L6 H384 Uncased"]),
    # tensors
    (f"/gguf/{M}/tensors/token_embd.weight", None, 200,
     ["Q8_0", "[384, 30,522]", "evenly spaced rows", "Block explainer", "heatmap",
      f"/walkthroughs/gguf-load?file={M}", "data:image/png;base64,"]),
    (f"/gguf/{M}/tensors/token_embd_norm.bias", None, 200,
     ["F32 is not quantized", "Computed on all 384 values", "Row 0, block 0"]),
    (f"/gguf/{M}/tensors/blk.0.ffn_up.weight?row=3&block=2", "gguf-block", 200,
     ["Row 3, block 2", "value = d × q", 'id="gguf-block"']),
    # unknown things and hostile names
    (f"/gguf/{'0' * 64}", None, 404, ["No GGUF file with this hash"]),
    (f"/gguf/{M.upper()}", None, 404, ["No GGUF file"]),
    ("/gguf/..%2f..%2fetc%2fpasswd", None, 404, []),
    ("/gguf/%2e%2e%2f%2e%2e%2fetc%2fpasswd", None, 404, []),
    ("/gguf/../../etc/passwd", None, 404, []),
    (f"/gguf/{M[:63]}", None, 404, []),
    (f"/gguf/{M}.gguf", None, 404, []),
    (f"/gguf/{M}/tensors/..%2f..%2fetc%2fpasswd", None, 404, ["no tensor named"]),
    (f"/gguf/{M}/tensors/%00%ff", None, 404, ["no tensor named"]),
    (f"/gguf/{M}/kv/..%2f..%2f..%2fetc%2fshadow", None, 404, ["no key named"]),
    (f"/gguf/{M}/tensors/token_embd.weight?row=-1", None, 422, ["row"]),
    (f"/gguf/{M}/tensors/token_embd.weight?block=abc", None, 422, ["block"]),
    (f"/gguf/{M}/kv/general.name?page=0", None, 422, ["page"]),
]


@pytest.mark.parametrize("url, target, status, texts", CASES,
                         ids=[f"{c[0][:60]}|{c[1]}" for c in CASES])
def test_routes(client: TestClient, url: str, target: str | None, status: int,
                texts: list[str]) -> None:
    r = client.get(url, headers=htmx(target))
    assert r.status_code == status, r.text[-800:]
    for text in texts:
        assert text in r.text, f"{text!r} not in {url}"
    assert "Traceback" not in r.text
    if target and status == 200:  # a partial alone, rooted at the element it replaces
        assert "<html" not in r.text and r.text.lstrip().startswith(("<div", "<section"))
        assert f'id="{target}"' in r.text.split(">", 1)[0]
        assert r.headers["HX-Push-Url"].startswith("/gguf/")


def test_every_tensor_is_listed(client: TestClient) -> None:
    html = client.get(f"/gguf/{M}").text
    assert html.count('class="tensor-row"') == 101
    with GGUFReader(MINILM) as r:
        for t in r.tensors:
            assert f"<code>{t.name}</code>" in html
    flat = client.get(f"/gguf/{M}?group=none").text
    assert flat.count('class="tensor-row"') == 101 and 'scope="rowgroup"' not in flat
    grouped = re.findall(r'scope="rowgroup">(blk\.\d+|\(not in a layer\))', html)
    assert grouped == [f"blk.{i}" for i in range(6)] + ["(not in a layer)"]


def test_sorted_by_size(client: TestClient) -> None:
    html = client.get(f"/gguf/{M}?sort=size&order=desc&group=none").text
    names = re.findall(r'class="tensor-row">\s*<td class="num">\d+</td>\s*<td><a [^>]*><code>'
                       r'([^<]+)</code>', html)
    with GGUFReader(MINILM) as r:
        sizes = {t.name: t.nbytes for t in r.tensors}
    assert len(names) == 101 and names[0] == "token_embd.weight"
    assert [sizes[n] for n in names] == sorted(sizes.values(), reverse=True)


def test_q8_0_block_matches_dequantize(client: TestClient) -> None:
    row, block = 5, 3
    r = client.get(f"/gguf/{M}/tensors/token_embd.weight?row={row}&block={block}",
                   headers=htmx("gguf-block"))
    assert r.status_code == 200
    with GGUFReader(MINILM) as g:
        t = g.tensors[g.find_tensor("token_embd.weight")]
        assert t.type == GGMLType.Q8_0
        row_bytes = g.tensor_bytes(t)[row * t.nb[1]:(row + 1) * t.nb[1]].copy()
    # the oracle: the whole row through engine.quants.dequantize, then this block's 32 values
    expected = dequantize(GGMLType.Q8_0, row_bytes, t.ne[0])[block * 32:(block + 1) * 32]
    shown = re.findall(r'<span class="v">([^<]+)</span>', r.text)
    assert shown == [f"{v:.6g}" for v in expected]
    # and by Q8_0's definition: d (fp16) times each int8 quant
    raw = row_bytes[block * 34:(block + 1) * 34]
    d = float(raw[:2].view(np.float16)[0])
    qs = raw[2:].view(np.int8)
    assert re.findall(r'<span class="q">q (-?\d+)</span>', r.text) == [str(q) for q in qs]
    assert np.allclose(np.float32(d) * qs.astype(np.float32), expected)
    assert f"at byte {t.data_offset + row * t.nb[1] + block * 34:,} of the file" in r.text
    assert f"{d:.6g}" in r.text


def test_htmx_swap_keeps_the_other_panels_state(client: TestClient) -> None:
    current = f"http://testserver/gguf/{M}?q=head&seg=7&filter=attn"
    r = client.get(f"/gguf/{M}?sort=size&order=desc&filter=attn",
                   headers=htmx("gguf-tensors-table") | {"HX-Current-URL": current})
    push = r.headers["HX-Push-Url"]
    assert "seg=7" in push and "q=head" in push and "sort=size" in push
    # htmx restoring history asks for the whole page
    r = client.get(f"/gguf/{M}?q=head", headers=htmx("gguf-kv-table")
                   | {"HX-History-Restore-Request": "true"})
    assert "<html" in r.text and "HX-Push-Url" not in r.headers


@pytest.mark.parametrize("fixture", [MINILM, VOCAB], ids=lambda p: p.name)
def test_upload_fixture(tmp_path: Path, fixture: Path) -> None:
    client = TestClient(create_app(Settings(data_dir=tmp_path)))
    # the fixture itself: the same content as the shipped file, so its page is the fixture's
    r = upload(client, fixture.name, fixture.read_bytes())
    assert r.status_code == 303 and r.headers["location"] == f"/gguf/{sha(fixture)}"
    assert client.get(r.headers["location"]).status_code == 200
    assert list((tmp_path / "uploads").iterdir()) == []
    # the same file with 32 bytes after its data section (ggml ignores them): a new upload
    data = fixture.read_bytes() + bytes(32)
    digest = hashlib.sha256(data).hexdigest()
    r = upload(client, fixture.name, data)
    assert r.status_code == 303 and r.headers["location"] == f"/gguf/{digest}"
    stored = tmp_path / "uploads" / f"{digest}.gguf"
    assert stored.read_bytes() == data
    page = client.get(r.headers["location"])
    assert page.status_code == 200 and "trailing bytes" in page.text
    again = upload(client, fixture.name, data)
    assert again.headers["location"] == r.headers["location"]
    assert sorted(p.name for p in (tmp_path / "uploads").iterdir()) == [stored.name]


@pytest.mark.parametrize("what", list(BAD))
def test_bad_upload_is_a_readable_422(tmp_path: Path, what: str) -> None:
    client = TestClient(create_app(Settings(data_dir=tmp_path)))
    data, words = BAD[what]
    r = upload(client, "model.gguf", data)
    assert r.status_code == 422
    assert "This is not a valid GGUF file" in r.text and words in r.text
    assert 'role="alert"' in r.text and "Traceback" not in r.text
    assert list((tmp_path / "uploads").iterdir()) == []  # nothing kept, no partial file
    assert client.get("/gguf").status_code == 200  # and the server goes on
    assert client.get(f"/gguf/{M}").status_code == 200


def test_no_file_chosen(tmp_path: Path) -> None:
    client = TestClient(create_app(Settings(data_dir=tmp_path)))
    r = client.post("/gguf", files={"file": ("", b"", "application/octet-stream")})
    assert r.status_code == 422 and "No file was chosen" in r.text
    r = client.post("/gguf", files={"other": ("x.gguf", b"GGUF", "application/octet-stream")})
    assert r.status_code == 422 and "no field named" in r.text
    r = client.post("/gguf", content=b"--nonsense", headers={
        "content-type": "multipart/form-data; boundary=zz"})
    assert r.status_code == 422 and "Traceback" not in r.text


def test_oversize_upload_is_refused_while_streaming(tmp_path: Path) -> None:
    limit = 100_000
    client = TestClient(create_app(Settings(data_dir=tmp_path, upload_limit=limit)))
    uploads = tmp_path / "uploads"
    # announced too large: refused before reading
    r = upload(client, "big.gguf", VOCAB.read_bytes())
    assert r.status_code == 413 and "100,000 bytes" in r.text
    # no length announced (chunked): refused once the limit is passed, partial file deleted
    data = VOCAB.read_bytes()

    def body():
        for i in range(0, len(data), 10_000):
            yield data[i:i + 10_000]
    r = client.post("/gguf", content=body(), headers={"content-type": "application/octet-stream"})
    assert r.status_code == 413 and "too large" in r.text
    assert list(uploads.iterdir()) == []
    # under the limit a file is read (and this one, cut short, refused as GGUF)
    small = VOCAB.read_bytes()[:100]
    assert upload(client, "small.gguf", small).status_code == 422
    assert client.get("/gguf").status_code == 200


def test_store_refuses_past_the_limit_as_bytes_arrive(tmp_path: Path) -> None:
    store = UploadStore(tmp_path, upload_limit=25_000, store_limit=10**9, fixtures_dir=None)
    pending = store.begin()
    pending.write(bytes(10_000))
    pending.write(bytes(10_000))
    assert pending.path.stat().st_size == 20_000
    with pytest.raises(UploadTooLarge):
        pending.write(bytes(10_000))
    assert not pending.path.exists() and list(tmp_path.iterdir()) == []


def test_store_evicts_oldest(tmp_path: Path) -> None:
    store = UploadStore(tmp_path, upload_limit=10_000, store_limit=2_500, fixtures_dir=None)
    digests = []
    for k in range(3):
        pending = store.begin()
        pending.write(bytes([k]) * 1_000)
        digests.append(pending.finish())
        path = pending.commit()
        os.utime(path, (1_000_000 + k, 1_000_000 + k))  # k-th is the k-th oldest
    store.evict()
    assert store.path(digests[0]) is None
    assert store.path(digests[1]) is not None and store.path(digests[2]) is not None
    assert store.path("../" + digests[1]) is None and store.path(digests[1].upper()) is None


def test_a_second_worker_serves_the_same_upload(tmp_path: Path) -> None:
    one = TestClient(create_app(Settings(data_dir=tmp_path)))
    two = TestClient(create_app(Settings(data_dir=tmp_path)))
    location = upload(one, "vocab.gguf", VOCAB.read_bytes()).headers["location"]
    r = two.get(location + "/kv/tokenizer.ggml.tokens?page=3")
    assert r.status_code == 200 and "Items 201–300 of 32,000" in r.text


def odd_file() -> bytes:
    """A valid file full of odd things: names needing escapes, many types, random blocks
    (NaN and inf scales included), an empty tensor, a 3-d tensor, control characters."""
    from engine.gguf.format import GGUFValueType as Kind
    from engine.gguf.writer import GGUFContext
    from engine.core.types import traits

    rng = np.random.default_rng(7)
    ctx = GGUFContext()
    ctx.set_val("general.name", Kind.STRING, "odd <script>alert(1)</script>")
    ctx.set_val("weird/../key?#", Kind.STRING, "bell\x07 nul\x00 end")
    ctx.set_arr("numbers", Kind.FLOAT64, np.linspace(-1, 1, 1000))
    ctx.set_arr("flags", Kind.BOOL, [True, False] * 300)
    for name, type_, ne in [("a/b?c#d", GGMLType.I32, (8, 3)), ("ü<b>", GGMLType.F16, (64, 2)),
                            ("bf", GGMLType.BF16, (32,)), ("k4", GGMLType.Q4_K, (512, 3)),
                            ("nl", GGMLType.IQ4_NL, (64, 2, 2)), ("empty", GGMLType.F32, (0,)),
                            ("q2", GGMLType.IQ2_XXS, (256, 1))]:
        tr = traits(type_)
        n = int(np.prod(ne)) // tr.blck_size * tr.type_size
        ctx.add_tensor(name, type_, ne, rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    return ctx.to_bytes()


def test_an_odd_file_renders_every_view(tmp_path: Path) -> None:
    client = TestClient(create_app(Settings(data_dir=tmp_path)))
    r = upload(client, "odd.gguf", odd_file())
    assert r.status_code == 303, r.text[-500:]
    base = r.headers["location"]
    page = client.get(base)
    assert page.status_code == 200 and "<script>alert" not in page.text
    links = set(re.findall(r'href="(/gguf/[0-9a-f]{64}/(?:tensors|kv)/[^"#]+)"', page.text))
    assert len(links) == 7 + 2  # every tensor, and the two arrays
    links |= {f"{base}/kv/general.name", f"{base}/kv/weird%2F..%2Fkey%3F%23"}
    for seg in range(0, 40):
        links.add(f"{base}?seg={seg}")
    for link in sorted(links):
        link = link.replace("&amp;", "&")
        for extra in ("", "?row=1&block=1" if "/tensors/" in link else "?page=2&q=1"):
            r = client.get(link + extra if "?" not in link else link)
            assert r.status_code == 200, (link, r.text[-600:])
            assert "Traceback" not in r.text and "Something went wrong" not in r.text
    r = client.get(f"{base}/tensors/{'a%2Fb%3Fc%23d'}")
    assert r.status_code == 200 and "I32" in r.text
    assert "This tensor has no elements" in client.get(f"{base}/tensors/empty").text
