"""What the debugger is shown of llama.cpp's tiled products (engine/compute/kernels/tiled.py): each
thread's share is the chunks (MUL_MAT) or the groups of weight rows (MUL_MAT_ID's tiled experts)
that ggml's tiled driver gives it, covering dst once; and the gate reads src1's ne[1] alone."""

from __future__ import annotations

from collections import Counter

import numpy as np

from engine import ggml as eng
from engine.compute.kernels.tiled import TILED_MIN_BATCH, TILED_MMID_GROUP, chunk_grid, takes
from engine.compute.plan import tiled_build
from engine.compute.shares import ShareKind
from engine.core.optable import GGMLOp
from engine.core.types import GGMLType as T


def shares_of(build, n_threads: int) -> list:
    """The thread shares of the graph's one MUL_MAT or MUL_MAT_ID node, computed watched inside
    tiled_build(); build(ctx) makes the node (its data zeros)."""
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 25))
    out = build(ctx)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, out)
    seen = []

    def observer(node, ask, shares):
        if not ask and node.op in (GGMLOp.MUL_MAT, GGMLOp.MUL_MAT_ID):
            seen.append(shares)
        return True
    with tiled_build():
        assert eng.ggml_graph_compute_with_ctx(ctx, gf, n_threads, observer) == 0
    [shares] = seen
    return shares


def cells(tiles) -> Counter:
    return Counter((t.chunk.split(".")[0] if isinstance(t.chunk, str) else "", r, c)
                   for t in tiles for r in range(*t.rows) for c in range(*t.cols))


def test_mul_mat_chunks_cover_dst_once():
    """640 x 2048 Q6_K by 64 rows on 1, 2 and 3 threads: the tiled driver's chunk grid (256 x 256
    halved while under four a thread), every cell of dst in one chunk of one thread."""
    for n_threads in (1, 2, 3):
        shares = shares_of(lambda ctx: eng.ggml_mul_mat(ctx, eng.ggml_new_tensor_2d(ctx, T.Q6_K, 2048, 640),
                                                        eng.ggml_new_tensor_2d(ctx, T.F32, 2048, 64)), n_threads)
        n0, n1, d0, d1 = chunk_grid(640, 64, n_threads)
        assert n0 * n1 >= 4 * n_threads and max(d0, d1) <= 256
        tiles = [t for s in shares for t in s.ranges]
        assert all(s.kind == ShareKind.CHUNKS for s in shares)
        assert sorted(t.chunk for t in tiles) == list(range(n0 * n1))
        assert cells(tiles) == Counter(("", r, c) for r in range(640) for c in range(64))


def test_mul_mat_id_tiled_experts_split_by_groups():
    """An expert with 8 or more rows is shared out by groups of 64 weight rows ("e0.g1"), one with
    fewer by mul_mat chunks ("e1.0"); together they cover each expert's product once."""
    ids = np.array([[0, 2]] * 8 + [[1, 0]] * 3 + [[0, 3]], np.int32)  # rows a expert: 12, 3, 8, 1

    def build(ctx):
        i = eng.ggml_new_tensor_2d(ctx, T.I32, 2, 12)
        eng.data_bytes(i)[:] = ids.reshape(-1).view(np.uint8)
        return eng.ggml_mul_mat_id(ctx, eng.ggml_new_tensor_3d(ctx, T.Q4_K, 256, 150, 4),
                                   eng.ggml_new_tensor_3d(ctx, T.F32, 256, 2, 12), i)
    for n_threads in (1, 3):
        tiles = [t for s in shares_of(build, n_threads) for t in s.ranges]
        groups = {t.chunk for t in tiles if ".g" in t.chunk}
        assert groups == {f"e{e}.g{g}" for e in (0, 2) for g in range(-(-150 // TILED_MMID_GROUP))}
        assert {t.chunk.split(".")[0] for t in tiles if ".g" not in t.chunk} == {"e1", "e3"}
        want = Counter((f"e{e}", r, c) for e, n in enumerate((12, 3, 8, 1)) for r in range(150)
                       for c in range(n))
        assert cells(tiles) == want


def test_gate_reads_ne1_alone():
    """takes: a tiled type by src1 rows ne[1] of at least TILED_MIN_BATCH; ne[1] * ne[2] does not
    count; another type or use_ref never."""
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 20, no_alloc=True))
    w, q8 = eng.ggml_new_tensor_2d(ctx, T.Q3_K, 256, 16), eng.ggml_new_tensor_2d(ctx, T.Q8_0, 256, 16)
    x = {n: eng.ggml_new_tensor_2d(ctx, T.F32, 256, n) for n in (TILED_MIN_BATCH - 1, TILED_MIN_BATCH)}
    wide = eng.ggml_new_tensor_3d(ctx, T.F32, 256, TILED_MIN_BATCH - 1, 4)
    assert takes(w, x[TILED_MIN_BATCH]) and not takes(w, x[TILED_MIN_BATCH - 1])
    assert not takes(w, wide) and not takes(q8, x[TILED_MIN_BATCH])
    assert not takes(w, x[TILED_MIN_BATCH], use_ref=True)
