"""Hostile header-only uploads (app/heads.py): a few bytes that declare a big file never become a
big allocation. A header-only file is refused by every route that reads tensor data (its holes
would read as zeros), the size it declares is capped before a sparse file is made, and the bytes
sent for it later are capped per request and in all, counted in the store's limit and evicted.

The cases about the server's time, memory and processes run against one served app
(tests/support/served.py), each measured against the memory before it; the rest in-process."""

from __future__ import annotations

import re
import struct
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app import heads
from app.heads import PROBE, SEND_MAX, SIZE_MAX
from app.main import create_app
from app.settings import Settings
from app.store import HeaderOnly, UploadStore
from app.traces import TraceCache
from engine.gguf import GGUFReader
from engine.programs import FIXTURES_DIR
from tests.api.routes.test_heads import send_head
from tests.support.served import Served, serve

MiB = 1 << 20
MINILM = FIXTURES_DIR / "minilm-q8_0.gguf"
ANSWER = 5.0  # seconds the server may take to answer a hostile request
GROWTH = 50 * MiB  # bytes the server's memory may grow in one hostile case
STORE_LIMIT = 8 * MiB  # the served app's store: a few header-only files' bytes overflow it


def gguf_head(sizes: list[int]) -> bytes:
    """A GGUF file's metadata, written by hand: no key-value pairs, one F32 tensor per size in
    `sizes` (bytes, a multiple of 32), so the data section starts right after it."""
    infos, offset = b"", 0
    for k, nbytes in enumerate(sizes):
        name = f"w{k}".encode()
        # name, n_dims, ne[0], type (GGML_TYPE_F32), offset in the data section
        infos += struct.pack("<Q", len(name)) + name + struct.pack("<IqiQ", 1, nbytes // 4, 0, offset)
        offset += nbytes
    head = b"GGUF" + struct.pack("<Iqq", 3, len(sizes), 0) + infos
    assert len(head) % 32 == 0, "the data section would start after padding"
    return head


HOSTILE = gguf_head([150 * MiB] * 4)  # the red team's file: 160 bytes declaring 600 MiB of weights
HOSTILE_SIZE = len(HOSTILE) + 600 * MiB


def test_the_hostile_head_is_what_the_red_team_sent(tmp_path: Path) -> None:
    path = tmp_path / "hostile.gguf"
    path.write_bytes(HOSTILE)
    with open(path, "r+b") as f:
        f.truncate(HOSTILE_SIZE)
    r = GGUFReader(path)
    assert len(HOSTILE) == 160 and r.data_offset == 160 and r.data_size == 600 * MiB
    r.close()


def post_head(c: httpx.Client | TestClient, head: bytes, size: int) -> str:
    """A header-only upload of `head` declaring `size` bytes: its digest."""
    r = c.post(f"/gguf/head?size={size}", content=head)
    assert r.status_code == 200 and "url" in r.json(), r.text
    return r.json()["url"].rsplit("/", 1)[1]


def disk_used(uploads: Path) -> int:
    """Bytes the stored files take, as the store counts them (a sparse file: its blocks)."""
    return sum(min(p.stat().st_size, p.stat().st_blocks * 512) for p in uploads.glob("*.gguf"))


# --- against the served app: time, memory, processes ------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Served, Path]:
    tmp = tmp_path_factory.mktemp("hostile")
    env = {"GGML_LENS_DATA": str(tmp / "data"), "GGML_LENS_STORE_LIMIT": str(STORE_LIMIT)}
    with serve(tmp / "server.log", env=env) as s:
        yield s, tmp / "data" / "uploads"


def timed(c: httpx.Client, method: str, url: str, **kw) -> httpx.Response:
    t = time.monotonic()
    r = c.request(method, url, **kw)
    took = time.monotonic() - t
    assert took < ANSWER, f"{method} {url} took {took:.1f} s"
    return r


def settled_growth(s: Served, before: int) -> int:
    """How much the server's memory grew since `before`, after a moment for work it left running."""
    time.sleep(1.0)
    return s.rss() - before


def test_160_bytes_declaring_600_mib_are_not_loaded(served: tuple[Served, Path]) -> None:
    s, _uploads = served
    with s.client(timeout=ANSWER) as c:
        digest = post_head(c, HOSTILE, HOSTILE_SIZE)
        before = s.rss()
        r = timed(c, "GET", f"/walkthroughs/gguf-load?file={digest}", follow_redirects=True)
        assert r.status_code == 422 and "header-only upload" in r.text
        for url in (f"/walkthroughs/gguf-load/steps/3?file={digest}",
                    f"/walkthroughs/gguf-load/recording?file={digest}",
                    f"/walkthroughs/gguf-load/eval-callback.txt?file={digest}"):
            r = timed(c, "GET", url)
            assert r.status_code == 422 and "header-only upload" in r.text, url
        growth = settled_growth(s, before)
    print(f"gguf-load on 160 bytes declaring 600 MiB: the server grew {growth / MiB:.1f} MiB")
    assert growth < GROWTH
    assert s.no_children_within(5) == [] and s.alive()


def test_a_declared_size_past_the_cap_is_refused_before_anything_is_kept(
        served: tuple[Served, Path]) -> None:
    s, uploads = served
    with s.client(timeout=ANSWER) as c:
        kept = sorted(uploads.iterdir())
        before = s.rss()
        for size in (2**62, SIZE_MAX + 1):
            r = timed(c, "POST", f"/gguf/head?size={size}", content=HOSTILE)
            assert r.status_code == 422 and f"{SIZE_MAX:,}" in r.json()["error"], r.text
        assert sorted(uploads.iterdir()) == kept  # no sparse file was made
        assert post_head(c, HOSTILE, SIZE_MAX)  # the cap itself is allowed: a hole costs no disk
        growth = settled_growth(s, before)
    assert growth < GROWTH
    assert s.no_children_within(5) == [] and s.alive()


def test_bytes_past_the_per_request_cap_are_refused_unread(served: tuple[Served, Path]) -> None:
    s, uploads = served
    with s.client(timeout=ANSWER) as c:
        digest = post_head(c, HOSTILE, HOSTILE_SIZE + 32)
        probe = HOSTILE + bytes(PROBE - len(HOSTILE))  # the file's first bytes: the head, then its hole
        stored = uploads / f"{digest}.gguf"
        used = disk_used(uploads)
        before = s.rss()
        for n in (SEND_MAX + 1, 600 * MiB):  # a body as large as the cap, and one only declared
            body = probe + bytes(min(n, SEND_MAX + 1))
            r = timed(c, "POST", f"/gguf/{digest}/bytes?probe={PROBE}&ranges=160:{n}", content=body)
            assert r.status_code == 413 and f"{SEND_MAX:,}" in r.json()["error"], r.text
        assert stored.stat().st_blocks * 512 <= 8192 and disk_used(uploads) == used
        r = timed(c, "POST", f"/gguf/{digest}/bytes?probe={PROBE}&ranges=160:{SEND_MAX}",
                  content=probe + bytes(SEND_MAX))
        assert r.json() == {"ok": True}  # the cap itself is allowed
        growth = settled_growth(s, before)
    assert growth < GROWTH
    assert s.no_children_within(5) == [] and s.alive()


def test_the_bytes_sent_later_count_in_the_store_limit(served: tuple[Served, Path]) -> None:
    s, uploads = served
    piece = 3 * MiB
    with s.client(timeout=ANSWER) as c:
        digests = []
        for k in range(3):  # three files, each sent 6 MiB: more than the store keeps
            size = HOSTILE_SIZE + 32 * (k + 2)  # (another size: another file)
            digest = post_head(c, HOSTILE, size)
            digests.append(digest)
            probe = HOSTILE + bytes(PROBE - len(HOSTILE))
            for start in (PROBE, PROBE + piece):  # (past the probe: the first bytes stay the same)
                r = timed(c, "POST", f"/gguf/{digest}/bytes?probe={PROBE}&ranges={start}:{piece}",
                          content=probe + bytes(range(256)) * (piece // 256))
                assert r.json() == {"ok": True}, r.text
                assert disk_used(uploads) <= STORE_LIMIT
        assert (uploads / f"{digests[-1]}.gguf").is_file()
        gone = digests[0]
        assert not (uploads / f"{gone}.gguf").exists() and not (uploads / f"{gone}.have").exists()
        assert timed(c, "GET", f"/gguf/{gone}").status_code == 404
    assert s.alive()


# --- in-process: what the routes answer -------------------------------------------------------

@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    return TestClient(create_app(Settings(data_dir=tmp_path / "data", fixtures_dir=FIXTURES_DIR,
                                          upload_limit=100_000)))


@pytest.fixture
def minilm_head(client: TestClient) -> str:
    """MiniLM sent by its header only (it is over the client's upload limit): its digest."""
    data = MINILM.read_bytes()
    url, _sent = send_head(client, data, len(data), 1 << 16)
    return url.rsplit("/", 1)[1]


def test_a_model_walkthrough_refuses_a_header_only_file(client: TestClient, minilm_head: str) -> None:
    for url in (f"/walkthroughs/minilm/steps/0?file={minilm_head}",
                f"/walkthroughs/minilm/recording?file={minilm_head}",
                f"/walkthroughs/minilm/chat?file={minilm_head}&message=hi"):
        r = client.get(url, follow_redirects=False)
        assert r.status_code == 422 and "header-only upload" in r.text, url
    # (the file's page offers no run: it says why)
    assert "Only the file&#39;s first bytes were sent" in client.get(f"/gguf/{minilm_head}").text


def test_a_recording_queued_by_any_route_refuses_a_header_only_file(tmp_path: Path) -> None:
    store = UploadStore(tmp_path, upload_limit=10**9, store_limit=10**9)
    digest = heads.store_head(store, HOSTILE, HOSTILE_SIZE)
    cache = TraceCache(4, uploads=store)
    recipe = cache.key("gguf-load", 1, digest)
    with pytest.raises(HeaderOnly, match="header-only upload"):
        cache.input_path(recipe)
    with pytest.raises(HeaderOnly):  # (what a job, or a worker process, runs)
        cache.record(recipe)
    assert store.path(digest) is not None and not store.whole(digest)
    whole = MINILM.read_bytes()
    pending = store.begin()
    pending.write(whole)
    pending.finish()
    pending.commit()
    assert store.whole(pending.digest)
    assert cache.input_path(cache.key("gguf-load", 1, pending.digest)) == store.path(pending.digest)


def test_the_inspector_shows_no_hole_as_data(client: TestClient, minilm_head: str) -> None:
    reader = GGUFReader(MINILM)
    t = max(reader.tensors, key=lambda t: t.data_offset)
    page = f"/gguf/{minilm_head}/tensors/{t.name}"
    # the block explainer alone (htmx) goes to the tensor's page, which asks for the bytes
    r = client.get(page + "?row=1&block=2", headers={"HX-Request": "true", "HX-Target": "gguf-block"})
    assert r.status_code == 200 and r.headers["HX-Redirect"] == page + "?row=1&block=2"
    assert "Block explainer" not in r.text
    text = client.get(page).text
    assert "were not sent" in text and "values read" not in text and "Block explainer" not in text
    # the byte map shows no bytes of a tensor's data that were not sent
    seg = next(i for i, s in enumerate(reader.byte_map()) if s.kind == "tensor_data" and s.label == t.name)
    text = client.get(f"/gguf/{minilm_head}?seg={seg}").text
    assert "These bytes were not sent" in text
    dump = re.search(r'<pre class="hexdump"[^>]*>(.*?)</pre>', text, re.S).group(1)
    assert dump.strip() == ""
    reader.close()


def test_the_bytes_a_header_only_file_holds_are_capped(client: TestClient, minilm_head: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    data = MINILM.read_bytes()
    [(_a, held)] = heads.have(client.app.state.store, minilm_head)
    end = held + 4096  # bytes of tensor data past the head

    def send(spans: list[tuple[int, int]]) -> httpx.Response:
        ranges = ",".join(f"{a}:{n}" for a, n in spans)
        body = data[:PROBE] + b"".join(data[a:a + n] for a, n in spans)
        return client.post(f"/gguf/{minilm_head}/bytes?probe={PROBE}&ranges={ranges}", content=body)

    monkeypatch.setattr(heads, "HELD_MAX", held + 1000)
    assert send([(end, 1000)]).json() == {"ok": True}
    r = send([(end + 2000, 1)])
    assert r.status_code == 413 and "holds at most 1" in r.json()["error"]
    assert send([(end, 1000)]).json() == {"ok": True}  # bytes it holds again cost nothing
    monkeypatch.setattr(heads, "HELD_MAX", 1 << 30)
    monkeypatch.setattr(heads, "RANGES_MAX", 3)
    assert send([(end + 2000, 1)]).json() == {"ok": True}  # three ranges: the head, two pieces
    r = send([(end + 4000, 1)])
    assert r.status_code == 413 and "in 3 ranges" in r.json()["error"]
    assert send([(end + 4000, 0)] * 100).json() == {"ok": True}  # empty ranges are not kept
    assert heads.have(client.app.state.store, minilm_head) == [(0, held), (end, end + 1000),
                                                                (end + 2000, end + 2001)]


def test_hostile_byte_ranges_are_refused_plainly(client: TestClient, minilm_head: str) -> None:
    r = client.post(f"/gguf/{minilm_head}/bytes?probe=0&ranges={'9' * 5000}:1", content=b"")
    assert r.status_code == 422  # a number past 19 digits: refused by the route's pattern
    r = client.post(f"/gguf/{minilm_head}/bytes?probe=0&ranges={2**62}:1", content=b"")
    assert r.status_code == 422 and "outside the file" in r.json()["error"]
    r = client.post(f"/gguf/{'0' * 64}/bytes?probe=0&ranges=0:1", content=b"x")
    assert r.status_code == 404
