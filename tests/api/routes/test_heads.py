"""Header-only uploads: a file over the upload limit is inspected from its first bytes, and a
tensor page gets exactly the bytes it reads when the browser sends them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from engine.programs import FIXTURES_DIR
from tests.api.routes.test_models_dir import write_big_sparse

MINILM = FIXTURES_DIR / "minilm-q8_0.gguf"
VOCAB = FIXTURES_DIR / "ggml-vocab-llama-spm.gguf"


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    return TestClient(create_app(Settings(data_dir=tmp_path / "data", fixtures_dir=FIXTURES_DIR,
                                          upload_limit=100_000)))


def send_head(client: TestClient, data: bytes, size: int, first: int) -> tuple[str, list[int]]:
    """The browser's side (app/static/heads.js): the first bytes, more while asked."""
    n, sent = first, []
    while True:
        sent.append(n)
        j = client.post(f"/gguf/head?size={size}", content=data[:n]).json()
        if "url" in j:
            return j["url"], sent
        assert j["need"] > n, j
        n = j["need"]


def test_a_40_gb_file_is_inspected_by_its_header(client: TestClient, tmp_path: Path) -> None:
    big = tmp_path / "big.gguf"
    write_big_sparse(big)
    head = big.open("rb").read(1 << 20)
    url, sent = send_head(client, head, big.stat().st_size, len(head))
    page = client.get(url).text
    assert "42,949,673,120 bytes" in page and "token_embd.weight" in page
    assert "header-only upload" in page and "Load into a context" not in page
    stored = next((tmp_path / "data" / "uploads").glob("*.gguf"))
    assert stored.stat().st_size == big.stat().st_size
    assert stored.stat().st_blocks * 512 < 4 << 20  # a sparse file: the holes cost no disk
    # the same file sent with another first length is the same file
    assert send_head(client, head[:300_000], big.stat().st_size, 300_000)[0] == url


def test_metadata_longer_than_the_first_bytes_asks_for_more(client: TestClient) -> None:
    data = VOCAB.read_bytes()
    url, sent = send_head(client, data, len(data), 4096)
    assert len(sent) > 1 and sent[-1] <= len(data)
    assert "tokenizer.ggml.tokens" in client.get(url).text


def test_a_broken_header_is_a_readable_error(client: TestClient) -> None:
    data = bytearray(MINILM.read_bytes()[:65536])
    data[4:8] = (99).to_bytes(4, "little")  # version 99
    r = client.post(f"/gguf/head?size={MINILM.stat().st_size}", content=bytes(data))
    assert r.status_code == 422
    j = r.json()
    assert j["field"] == "version" and j["offset"] == 4 and "99" in j["rule"]
    r = client.post("/gguf/head?size=10", content=b"x" * 20)
    assert r.status_code == 422 and "20 bytes sent of a file of 10" in r.json()["error"]


def test_a_tensor_page_gets_the_bytes_it_reads(client: TestClient) -> None:
    data = MINILM.read_bytes()
    url, _ = send_head(client, data, len(data), 1 << 16)
    digest = url.rsplit("/", 1)[1]
    tensor = f"{url}/tensors/blk.0.attn_q.weight"
    page = client.get(tensor).text
    assert "were not sent" in page
    ranges = re.search(r'data-ranges="([\d:,]+)"', page).group(1)
    spans = [tuple(map(int, r.split(":"))) for r in ranges.split(",")]
    body = data[:4096] + b"".join(data[a:a + n] for a, n in spans)
    wrong = b"\0" * 4096 + body[4096:]
    r = client.post(f"/gguf/{digest}/bytes?probe=4096&ranges={ranges}", content=wrong)
    assert r.status_code == 422 and "another file" in r.json()["error"]
    r = client.post(f"/gguf/{digest}/bytes?probe=4096&ranges={ranges}", content=body[:-1])
    assert r.status_code == 413
    r = client.post(f"/gguf/{digest}/bytes?probe=4096&ranges={ranges}", content=body)
    assert r.json() == {"ok": True}
    page = client.get(tensor).text
    assert "were not sent" not in page
    # the statistics and the block explainer read the bytes sent: the same as the whole file's
    whole = client.get(tensor.replace(digest, _sha(MINILM))).text
    def stats(html: str) -> list[str]:
        return re.findall(r"<dd>([^<]*)</dd>", html[html.index("values read"):])[:6]

    assert stats(page) == stats(whole)
    r = client.post(f"/gguf/{_sha(MINILM)}/bytes?probe=4096&ranges=0:1", content=data[:4097])
    assert r.status_code == 422 and "uploaded whole" in r.json()["error"]


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
