"""Thread shares are records: each kind of split (engine.compute.shares.ShareKind) has the app's
label, each range is read by name, and they cross the worker's wire as records of their kind.

Flash attention's split-KV path records the kind "kv", which the panels' old map of kinds lacked
(it showed untranslated); its other paths record chunks of query rows, which the threads panel
unpacked as mul_mat's (chunk, rows, cols) and failed on."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.sandbox.boundary import Limits as Bounds
from app.sandbox.run import Limits
from app.sandbox.wire import Head, MalformedResult, _frame, decode, encode_trace
from app.settings import Settings
from app.views.debugger.threads import SPLIT_LABELS, ranges_text
from engine.compute.shares import Chunk, Interval, ShareKind, Tile, share_ranges
from engine.models import bundled
from engine.trace import record
from engine.trace.steps import ContextMeta, Step, StepKind, ThreadShare
from tests.api.routes.test_playground import run

MODEL = bundled.require(bundled.DATA_DIR).resolve()

# one new token reading 512 cached positions (split-KV: a KV stretch per thread), and four query
# rows reading them (chunks of rows from the shared counter)
ATTENTION = '''"""Flash attention as a decoder's new token reads the cache, and as a prompt does."""

import numpy as np

from engine.ggml import *


def run(n_threads=2):
    ctx = ggml_init(ggml_init_params(mem_size=4 * 1024 * 1024, mem_buffer=None, no_alloc=False))
    rng = np.random.default_rng(0)

    def tensor(type_, *ne):
        t = ggml_new_tensor(ctx, type_, len(ne), list(ne))
        set_data(t, rng.normal(0, 0.5, tuple(reversed(ne))).astype(np.float32))
        return t

    k, v = tensor(GGML_TYPE_F32, 32, 512, 2), tensor(GGML_TYPE_F32, 32, 512, 2)
    one = ggml_flash_attn_ext(ctx, tensor(GGML_TYPE_F32, 32, 1, 2), k, v, None, 0.125, 0.0, 0.0)
    four = ggml_flash_attn_ext(ctx, tensor(GGML_TYPE_F32, 32, 4, 2), k, v, None, 0.125, 0.0, 0.0)
    gf = ggml_new_graph(ctx)
    ggml_build_forward_expand(gf, one)
    ggml_build_forward_expand(gf, four)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    return {"one": one, "four": four}
'''


def test_every_kind_of_split_has_a_label():
    assert set(SPLIT_LABELS) == set(ShareKind) and all(SPLIT_LABELS.values())


def test_ranges_are_read_by_name():
    assert ranges_text(ShareKind.ROWS, (Interval(0, 3), Interval(6, 9))) == "[0, 3), [6, 9)"
    assert ranges_text(ShareKind.INTERLEAVED, (1, 3, 5)) == "1, 3, 5"
    assert ranges_text(ShareKind.CHUNKS, (Tile("e1.2", Interval(0, 16), Interval(16, 32)),
                                          Chunk(3, Interval(8, 12)))) == \
        "chunk e1.2: rows 0-15 x cols 16-31; chunk 3: rows 8-11"
    assert ranges_text(ShareKind.CHUNKS, ()) == "no chunk left"
    assert ranges_text(ShareKind.IDLE, ()) == "nothing"


@pytest.mark.parametrize("kind, plain, why", [
    (ShareKind.ROWS, [7], "7 is not an interval"),
    (ShareKind.INTERLEAVED, [[0, 1]], r"\[0, 1\] is not an index"),
    (ShareKind.CHUNKS, [[0, [1]]], r"\[1\] is not an interval"),
    (ShareKind.CHUNKS, [["e0.1", [0, 1], [2]]], r"\[2\] is not an interval"),
    (ShareKind.ALL, [[0, 1]], "has no ranges"),
    (ShareKind.KV, [[0, "x"]], "'x' is not an index"),
])
def test_a_range_that_does_not_fit_its_kind_is_refused(kind, plain, why):
    with pytest.raises(ValueError, match=why):
        share_ranges(kind, plain)


def _forged(*shares: ThreadShare) -> bytes:
    """A worker's output: one step holding these shares."""
    step = Step(0, StepKind.CALL, "x", 1, (), contexts=(ContextMeta(1, 1 << 20, 0, None, False),),
                threads=shares)
    return _frame(Head(ok=True, program="forged", source="x = 1\n", steps=[step], patches=[[]]), [])


def test_shares_cross_the_wire_as_records_of_their_kind(tmp_path):
    src = tmp_path / "program.py"
    src.write_text(ATTENTION)
    ns: dict = {}
    exec(compile(ATTENTION, str(src), "exec"), ns)
    back = decode(encode_trace(record(ns["run"], str(src), "program", 2)), Bounds())
    shares = [t for s in back.steps for t in s.threads]
    assert {t.kind for t in shares} == {ShareKind.KV, ShareKind.CHUNKS}
    assert all(type(r) is (Interval if t.kind == ShareKind.KV else Chunk)
               for t in shares for r in t.ranges)
    good = decode(_forged(ThreadShare(0, ShareKind.CHUNKS, (("e0.1", (0, 16), (0, 8)),), 0.0, ())),
                  Bounds())
    assert good.steps[0].threads[0].ranges == (Tile("e0.1", Interval(0, 16), Interval(0, 8)),)


@pytest.mark.parametrize("share, why", [
    (ThreadShare(0, ShareKind.ROWS, ((0, 1, 2),), 0.0, ()),
     r"step 0: a share of kind 'rows': \(0, 1, 2\) is not an interval"),
    (ThreadShare(0, ShareKind.INTERLEAVED, (((0,),),), 0.0, ()),
     "step 0: a share of kind 'interleaved': .* is not an index"),
    (ThreadShare(0, "diagonal", (), 0.0, ()),
     "the head is not a result: Invalid enum value 'diagonal'"),
])
def test_a_share_that_is_not_of_its_kind_is_malformed(share, why):
    with pytest.raises(MalformedResult, match=why):
        decode(_forged(share), Bounds())


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    (data / "models").mkdir()
    (data / "models" / MODEL.name).symlink_to(MODEL)
    app = create_app(Settings(data_dir=data, programs=True))
    app.state.programs.limits = Limits(cpu=20, wall=40)
    yield TestClient(app)
    app.state.jobs.close(wait=60)


def _node_steps(tmp_path: Path) -> list[int]:
    """The indices of the program's two node steps (the worker records the same steps)."""
    src = tmp_path / "program.py"
    src.write_text(ATTENTION)
    ns: dict = {}
    exec(compile(ATTENTION, str(src), "exec"), ns)
    trace = record(ns["run"], str(src), "program", 2)
    return [s.index for s in trace.steps if s.kind == "node"]


def test_the_threads_panel_names_flash_attentions_splits(client, tmp_path):
    """Run in the playground on two threads: at the split-KV node each thread's share reads
    "KV positions: [start, end)", at the other node "chunks: chunk c: rows a-b"."""
    first = run(client, ATTENTION, threads=2)
    assert first.status_code == 303, first.text[-2000:]
    kv_step, rows_step = _node_steps(tmp_path)
    pages = {}
    for name, k in (("kv", kv_step), ("rows", rows_step)):
        url = re.sub(r"/steps/\d+", f"/steps/{k}", first.headers["location"])
        r = client.get(url)
        assert r.status_code == 200, r.text[-2000:]
        pages[name] = html.unescape(r.text)
    shares = re.findall(r'<div class="what">([^<]*)</div>', pages["kv"])
    assert shares == ["KV positions: [0, 256)", "KV positions: [256, 512)"]
    shares = re.findall(r'<div class="what">([^<]*)</div>', pages["rows"])
    assert len(shares) == 2 and all(re.fullmatch(r"chunks: chunk \d: rows \d-\d(; chunk \d: rows "
                                                 r"\d-\d)*", s) for s in shares), shares
