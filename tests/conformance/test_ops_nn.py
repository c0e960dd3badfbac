"""The neural-network ops (engine/ops/nn.py and their kernels) against real ggml.

Each op is built on both engines from the same seeded leaves; the result's type, ne, nb, op,
op_params, name and the context's used memory must be identical, and the values within the NMSE
bound test-backend-ops uses for the op (1e-7 unless noted). Thread shares are read back through the
compute observer and compared with ggml's split for the op, written out here independently.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from engine import ggml as eng
from engine.core.errors import GGMLAssertionError, GGMLNotSupportedError
from engine.core.optable import GGMLOp
from engine.core.types import GGMLType
from tests.support.graphs import Leaf, check_op, engine_result, engine_shares, values

F32, F16, BF16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.I64
Q4_0, Q8_0, Q4_K, Q6_K = GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K
THREADS = [1, 2, 3, 4]


def idx_leaf(type_, ne, high, seed=1, values=None):
    """Integer indices in [0, high)."""
    if values is None:
        values = np.random.default_rng(seed).integers(0, high, size=tuple(reversed(ne)))
    return Leaf(type_, ne, values=np.asarray(values))


def dr_split(nr, nth):
    """get_thread_range: [dr*ith, min(dr*ith + dr, nr)) with dr = ceil(nr/nth)."""
    dr = (nr + nth - 1) // nth
    return [(min(dr * i, nr), min(dr * i + dr, nr)) for i in range(nth)]


def with_add(op_build):
    """Follow a single-task op by an ADD, so the graph runs on all n threads (n_tasks of ADD)."""
    def build(g, ctx, *ts):
        r = op_build(g, ctx, *ts)
        return g.ggml_add(ctx, r, r)
    return build


# --- get_rows --------------------------------------------------------------------------------

@pytest.mark.parametrize("src_type", [F32, F16, BF16, I32, Q4_0, Q8_0, Q4_K, Q6_K])
def test_get_rows_types(src_type):
    ne0 = 256 if src_type in (Q4_K, Q6_K) else 64
    leaves = [Leaf(src_type, (ne0, 10), low=-100 if src_type == I32 else -1,
                   high=100 if src_type == I32 else 1), idx_leaf(I32, (7,), 10)]
    check_op(lambda g, ctx, a, b: g.ggml_get_rows(ctx, a, b), leaves, 1, exact=True)


@pytest.mark.parametrize("n_threads", THREADS)
def test_get_rows_batched_threads(n_threads):
    # a [8, 6, 3, 2], b [5, 3, 2]: per (i11, i12) matrix its own indices
    leaves = [Leaf(F32, (8, 6, 3, 2)), idx_leaf(I32, (5, 3, 2), 6)]
    build = with_add(lambda g, ctx, a, b: g.ggml_get_rows(ctx, a, b))
    check_op(build, leaves, n_threads, exact=True)
    check_op(lambda g, ctx, a, b: g.ggml_get_rows(ctx, a, b), leaves, n_threads, exact=True)
    (shares,) = engine_shares(build, leaves, n_threads, GGMLOp.GET_ROWS)
    assert [s.ranges for s in shares] == [(r,) for r in dr_split(5 * 3 * 2, n_threads)]
    assert {s.kind for s in shares} == {"rows"}


def test_get_rows_non_contiguous_source():
    # a [8, 3 matrices, 5 rows] seen as [8, 5, 3]: rows are 96 bytes apart, matrices 32
    leaves = [Leaf(F32, (8, 3, 5), permute=(0, 2, 1, 3)), idx_leaf(I32, (4, 3), 5)]
    check_op(lambda g, ctx, a, b: g.ggml_get_rows(ctx, a, b), leaves, 2, exact=True)


# --- set_rows --------------------------------------------------------------------------------

@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("idx_type", [I32, I64])
@pytest.mark.parametrize("dst_type", [F32, F16, BF16])
def test_set_rows(dst_type, idx_type, n_threads):
    # dst a [16, 10, 4, 2], rows b [16, 5, 4, 2], indices c [5, 2, 1] broadcast over dims 2, 3
    c = np.stack([np.random.default_rng(s).permutation(10)[:5] for s in range(2)])
    leaves = [Leaf(dst_type, (16, 10, 4, 2)), Leaf(F32, (16, 5, 4, 2)),
              idx_leaf(idx_type, (5, 2, 1), 10, values=c.reshape(1, 2, 5))]
    build = with_add(lambda g, ctx, a, b, c: g.ggml_set_rows(ctx, a, b, c))
    check_op(lambda g, ctx, a, b, c: g.ggml_set_rows(ctx, a, b, c), leaves, n_threads, exact=True)
    check_op(build, leaves, n_threads, exact=True)
    (shares,) = engine_shares(build, leaves, n_threads, GGMLOp.SET_ROWS)
    assert [s.ranges for s in shares] == [(r,) for r in dr_split(5, n_threads)]


@pytest.mark.parametrize("dst_type", [Q8_0, Q4_0])
def test_set_rows_quantized(dst_type):
    leaves = [Leaf(dst_type, (64, 6)), Leaf(F32, (64, 3)), idx_leaf(I64, (3,), 6, values=[4, 0, 2])]
    check_op(lambda g, ctx, a, b, c: g.ggml_set_rows(ctx, a, b, c), leaves, 2, exact=True)


def test_set_rows_non_contiguous_rows():
    # b with permuted dims 1, 2 (rows still contiguous): accepted by ggml
    leaves = [Leaf(F32, (8, 6, 3)), Leaf(F32, (8, 3, 4), permute=(0, 2, 1, 3)),
              idx_leaf(I32, (4, 3), 6, values=np.array([[0, 1, 2, 3], [5, 4, 3, 2],
                                                        [1, 3, 5, 0]]))]
    check_op(lambda g, ctx, a, b, c: g.ggml_set_rows(ctx, a, b, c), leaves, 3, exact=True)


def test_set_rows_repeated_index_keeps_the_last_row():
    # one thread writes the rows in order: a repeated index keeps the later row (rising indices
    # and others take different paths in the engine)
    for rows in ([3, 1, 3, 0, 1], [0, 2, 4, 5, 5], [0, 2, 3, 4, 5]):
        leaves = [Leaf(F32, (8, 6)), Leaf(F32, (8, 5)), idx_leaf(I64, (5,), 6, values=rows)]
        check_op(lambda g, ctx, a, b, c: g.ggml_set_rows(ctx, a, b, c), leaves, 1, exact=True)


# --- diag_mask -------------------------------------------------------------------------------

@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("fn", ["ggml_diag_mask_inf", "ggml_diag_mask_zero",
                                "ggml_diag_mask_inf_inplace"])
def test_diag_mask(fn, n_threads):
    for n_past in (0, 2):
        def build(g, ctx, a):
            return getattr(g, fn)(ctx, a, n_past)
        check_op(build, [Leaf(F32, (9, 7, 3, 2))], n_threads, exact=True)
    shares = engine_shares(lambda g, ctx, a: g.ggml_diag_mask_inf(ctx, a, 1),
                           [Leaf(F32, (9, 7, 3))], n_threads, GGMLOp.DIAG_MASK_INF)[0]
    assert [s.ranges for s in shares] == [tuple(range(i, 7, n_threads)) for i in range(n_threads)]
    assert {s.kind for s in shares} == {"interleaved"}


# --- soft_max --------------------------------------------------------------------------------

@pytest.mark.parametrize("n_threads", THREADS)
def test_soft_max_plain(n_threads):
    check_op(lambda g, ctx, a: g.ggml_soft_max(ctx, a), [Leaf(F32, (37, 5, 3), low=-5, high=5)],
             n_threads)
    check_op(lambda g, ctx, a: g.ggml_soft_max_inplace(ctx, a), [Leaf(F32, (16, 4))], n_threads)


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("mask_type", [F16, F32])
def test_soft_max_ext_mask_broadcast(mask_type, n_threads):
    # a [32, 6, 4, 2]; mask [32, 8, 2, 1]: rows by query row, dims 2 and 3 by modulo
    leaves = [Leaf(F32, (32, 6, 4, 2), low=-3, high=3),
              Leaf(mask_type, (32, 8, 2, 1), low=-2, high=2)]
    for scale, max_bias in ((0.125, 0.0), (0.5, 8.0)):
        check_op(lambda g, ctx, a, m: g.ggml_soft_max_ext(ctx, a, m, scale, max_bias), leaves,
                 n_threads)
    shares = engine_shares(lambda g, ctx, a, m: g.ggml_soft_max_ext(ctx, a, m, 0.125, 0.0), leaves,
                           n_threads, GGMLOp.SOFT_MAX)[0]
    assert [s.ranges for s in shares] == [tuple(range(i, 6, n_threads)) for i in range(n_threads)]


@pytest.mark.parametrize("n_threads", [1, 2])
def test_soft_max_silu_swiglu_bits_with_nan_inf_and_huge(n_threads):
    """ggml's exp polynomial lane by lane, bit for bit, NaN's sign included (a row holding a
    NaN is all NaN, with the sign ggml's vector instructions give it), and the lanes beyond
    |n| > 126 and 192."""
    special = [np.nan, np.inf, -np.inf, 88.7, 89.0, -87.0, -104.0, -150.0, 200.0, -200.0, 0.0, -0.0]
    rng = np.random.default_rng(3)
    x = np.concatenate([special, rng.uniform(-120, 120, 4 * 37 - len(special))]).astype(np.float32)
    leaves = [Leaf(F32, (37, 4), values=x.reshape(4, 37))]
    g = np.random.default_rng(4).uniform(-3, 3, 4 * 37).astype(np.float32).reshape(4, 37)
    gate = [Leaf(F32, (37, 4), values=g)]
    for build, lv in ((lambda gg, ctx, a: gg.ggml_soft_max(ctx, a), leaves),
                      (lambda gg, ctx, a: gg.ggml_silu(ctx, a), leaves),
                      (lambda gg, ctx, a, b: gg.ggml_swiglu_split(ctx, a, b), leaves + gate)):
        ours, theirs = check_op(build, lv, n_threads, exact=True)
        a, b = (np.asarray(values(r), np.float32) for r in (ours, theirs))
        assert a.tobytes() == b.tobytes()


def test_soft_max_causal_mask_and_sinks():
    n_kv, n_q, n_head = 12, 5, 6
    mask = np.triu(np.full((n_q, n_kv), -np.inf), k=n_kv - n_q + 1)
    leaves = [Leaf(F32, (n_kv, n_q, n_head), low=-4, high=4),
              Leaf(F16, (n_kv, n_q), values=mask), Leaf(F32, (n_head,), low=-2, high=2)]

    def build(g, ctx, a, m, s):
        r = g.ggml_soft_max_ext(ctx, a, m, 0.3, 2.0)
        g.ggml_soft_max_add_sinks(r, s)
        return r
    for n in (1, 3):
        check_op(build, leaves, n)


# --- rope ------------------------------------------------------------------------------------

NEOX = 2


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("mode", [0, NEOX])
def test_rope_basic(mode, n_threads):
    # x [64, 4 heads, 7 tokens, 2]; positions not in order, some large
    pos = [3, 0, 17, 1024, 5, 5, 99]
    leaves = [Leaf(F32, (64, 4, 7, 2)), idx_leaf(I32, (7,), 0, values=pos)]
    for n_dims in (64, 32):
        check_op(lambda g, ctx, a, b: g.ggml_rope(ctx, a, b, n_dims, mode), leaves, n_threads)
    shares = engine_shares(lambda g, ctx, a, b: g.ggml_rope(ctx, a, b, 64, mode), leaves,
                           n_threads, GGMLOp.ROPE)[0]
    assert [s.ranges for s in shares] == [(r,) for r in dr_split(4 * 7 * 2, n_threads)]


@pytest.mark.parametrize("mode", [0, NEOX])
def test_rope_ext_yarn_freq_factors(mode):
    pos = list(range(40, 49))
    leaves = [Leaf(F32, (48, 3, 9)), idx_leaf(I32, (9,), 0, values=pos),
              Leaf(F32, (16,), low=0.5, high=4.0)]

    def build(g, ctx, a, b, c):
        return g.ggml_rope_ext(ctx, a, b, c, 32, mode, 4096, 500000.0, 0.25, 1.0, 1.2, 32.0, 1.0)
    check_op(build, leaves, 3)

    def build_nc(g, ctx, a, b, c):  # no freq factors, ext_factor 0, attn_factor != 1
        return g.ggml_rope_ext(ctx, a, b, None, 48, mode, 0, 10000.0, 1.0, 0.0, 0.7, 0.0, 0.0)
    check_op(build_nc, leaves, 2)


def test_rope_f16_and_non_contiguous():
    pos = [0, 1, 2, 3, 4]
    check_op(lambda g, ctx, a, b: g.ggml_rope(ctx, a, b, 16, NEOX),
             [Leaf(F16, (16, 3, 5)), idx_leaf(I32, (5,), 0, values=pos)], 2, max_nmse=1e-6)
    # a view with padded rows: x [32, 5, 3] seen as [16, 5, 3] with nb1 = 128
    def build(g, ctx, a, b):
        v = g.ggml_view_3d(ctx, a, 16, 5, 3, 128, 640, 0)
        return g.ggml_rope(ctx, v, b, 16, 0)
    check_op(build, [Leaf(F32, (32, 5, 3)), idx_leaf(I32, (3,), 0, values=[7, 8, 9])], 2)


def test_rope_multi_and_vision():
    n_tok = 4
    pos = np.arange(4 * n_tok) * 3 % 11
    leaves = [Leaf(F32, (32, 2, n_tok)), idx_leaf(I32, (4 * n_tok,), 0, values=pos)]
    sections = (ctypes.c_int * 4)(4, 6, 6, 0)
    for mode, n_dims in ((8, 32), (40, 32), (24, 16)):
        def build(g, ctx, a, b):
            s = list(sections) if g is eng else sections
            return g.ggml_rope_multi(ctx, a, b, None, n_dims, s, mode, 0, 10000.0, 1.0, 0.0, 1.0,
                                     0.0, 0.0)
        check_op(build, leaves, 2)


def test_rope_back():
    leaves = [Leaf(F32, (16, 2, 3)), idx_leaf(I32, (3,), 0, values=[1, 2, 3])]

    def build(g, ctx, a, b):
        return g.ggml_rope_ext_back(ctx, a, b, None, 16, 0, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)
    check_op(build, leaves, 2)


# --- im2col, conv, pool ----------------------------------------------------------------------

@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("dst_type", [F32, F16])
def test_im2col_2d(dst_type, n_threads):
    # kernel [3, 3, IC=5, OC=2], image [9, 8, 5, 2]; stride, padding and dilation all != 1
    kernel_type = F16 if dst_type == F16 else F32
    leaves = [Leaf(kernel_type, (3, 3, 5, 2)), Leaf(F32, (9, 8, 5, 2))]
    for s0, s1, p0, p1, d0, d1 in ((1, 1, 1, 1, 1, 1), (2, 1, 0, 2, 1, 2)):
        def build(g, ctx, a, b):
            return g.ggml_im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, int(dst_type))
        check_op(build, leaves, n_threads, exact=True)
    shares = engine_shares(lambda g, ctx, a, b: g.ggml_im2col(ctx, a, b, 1, 1, 1, 1, 1, 1, True,
                                                              int(dst_type)),
                           leaves, n_threads, GGMLOp.IM2COL)[0]
    assert [s.ranges for s in shares] == [tuple(range(i, 5, n_threads)) for i in range(n_threads)]


def test_im2col_1d_and_f16_source():
    def build1(g, ctx, a, b):
        return g.ggml_im2col(ctx, a, b, 2, 0, 1, 0, 1, 0, False, int(F32))
    check_op(build1, [Leaf(F32, (3, 4, 2)), Leaf(F32, (11, 4, 3))], 2, exact=True)

    def build2(g, ctx, a, b):
        return g.ggml_im2col(ctx, a, b, 1, 1, 1, 0, 1, 1, True, int(F16))
    check_op(build2, [Leaf(F16, (2, 2, 3, 1)), Leaf(F16, (5, 4, 3, 1))], 3, exact=True)
    # a non-contiguous image: batches swapped with channels (planes stay packed)
    check_op(build2, [Leaf(F16, (2, 2, 3, 1)), Leaf(F32, (5, 4, 2, 3), permute=(0, 1, 3, 2))], 2,
             exact=True)


@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize("kernel_type", [F32, F16])
def test_conv_2d_composite(kernel_type, n_threads):
    # ggml_conv_2d: im2col (kernel's type) -> mul_mat -> reshape -> permute -> cont
    leaves = [Leaf(kernel_type, (3, 3, 4, 6)), Leaf(F32, (10, 9, 4, 2))]
    bound = 1e-7 if kernel_type == F32 else 5e-4  # test-backend-ops' bound for conv_2d
    check_op(lambda g, ctx, a, b: g.ggml_conv_2d(ctx, a, b, 1, 2, 1, 0, 1, 1), leaves, n_threads,
             max_nmse=bound)
    check_op(lambda g, ctx, a, b: g.ggml_conv_2d_s1_ph(ctx, a, b), leaves, n_threads,
             max_nmse=bound)


def test_conv_1d_composite():
    check_op(lambda g, ctx, a, b: g.ggml_conv_1d(ctx, a, b, 2, 1, 1),
             [Leaf(F16, (3, 4, 5)), Leaf(F32, (12, 4, 2))], 2, max_nmse=5e-4)


@pytest.mark.parametrize("n_threads", [1, 2, 4])
@pytest.mark.parametrize("kernel_type", [F32, F16])
def test_conv_2d_direct(kernel_type, n_threads):
    leaves = [Leaf(kernel_type, (3, 2, 4, 5)), Leaf(F32, (9, 7, 4, 2))]
    bound = 1e-7 if kernel_type == F32 else 5e-4
    build = lambda g, ctx, a, b: g.ggml_conv_2d_direct(ctx, a, b, 2, 1, 1, 1, 1, 2)  # noqa: E731
    check_op(build, leaves, n_threads, max_nmse=bound)
    shares = engine_shares(build, leaves, n_threads, GGMLOp.CONV_2D)[0]
    # one batch of patches (the 16 MiB work buffer holds them all): dr split of OW*OH*N patches
    n_patches = 5 * 7 * 2  # OW 5, OH 7, N 2
    assert [s.ranges for s in shares] == [(r,) for r in dr_split(n_patches, n_threads)]


@pytest.mark.parametrize("op", [0, 1])  # GGML_OP_POOL_MAX, GGML_OP_POOL_AVG
def test_pool_1d(op):
    for k, s, p in ((3, 2, 1), (2, 2, 0), (4, 1, 2)):
        check_op(lambda g, ctx, a: g.ggml_pool_1d(ctx, a, op, k, s, p),
                 [Leaf(F32, (13, 3, 2))], 1, exact=True)
    check_op(lambda g, ctx, a: g.ggml_pool_1d(ctx, a, op, 3, 1, 1), [Leaf(F16, (10, 4))], 1,
             exact=True)


@pytest.mark.parametrize("op", [0, 1])
def test_pool_2d(op):
    for k0, k1, s0, s1, p0, p1 in ((2, 2, 2, 2, 0.0, 0.0), (3, 2, 1, 2, 1.0, 0.5),
                                   (3, 3, 2, 2, 1.7, 1.0)):
        check_op(lambda g, ctx, a: g.ggml_pool_2d(ctx, a, op, k0, k1, s0, s1, p0, p1),
                 [Leaf(F32, (9, 8, 3, 2))], 1, exact=True)
    check_op(lambda g, ctx, a: g.ggml_pool_2d(ctx, a, op, 2, 2, 1, 1, 0.0, 0.0),
             [Leaf(F16, (5, 6, 2))], 1, exact=True)


@pytest.mark.parametrize("n_threads", [2, 3])
def test_pool_runs_on_thread_zero(n_threads):
    leaves = [Leaf(F32, (8, 6, 2))]
    build = with_add(lambda g, ctx, a: g.ggml_pool_2d(ctx, a, 1, 2, 2, 2, 2, 0.0, 0.0))
    check_op(build, leaves, n_threads, exact=True)
    shares = engine_shares(build, leaves, n_threads, GGMLOp.POOL_2D)[0]
    assert [s.kind for s in shares] == ["all"] + ["idle"] * (n_threads - 1)


# --- upscale, pad, timestep_embedding --------------------------------------------------------

@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("mode", [0, 1, 2, 1 | 256, 2 | 256])  # nearest, bilinear, bicubic (+align)
def test_interpolate(mode, n_threads):
    leaves = [Leaf(F32, (5, 4, 6, 2))]
    for ne in ((10, 8, 6, 2), (7, 3, 3, 4)):
        check_op(lambda g, ctx, a: g.ggml_interpolate(ctx, a, *ne, mode), leaves, n_threads,
                 max_nmse=1e-12)
    shares = engine_shares(lambda g, ctx, a: g.ggml_interpolate(ctx, a, 10, 8, 6, 2, mode), leaves,
                           n_threads, GGMLOp.UPSCALE)[0]
    assert [s.ranges for s in shares] == [tuple(range(i, 6, n_threads)) for i in range(n_threads)]


def test_upscale_non_contiguous():
    check_op(lambda g, ctx, a: g.ggml_upscale(ctx, a, 2, 0),
             [Leaf(F32, (4, 3, 2), permute=(1, 0, 2, 3))], 2, exact=True)


@pytest.mark.parametrize("n_threads", THREADS)
def test_pad(n_threads):
    leaves = [Leaf(F32, (5, 4, 3, 2))]
    check_op(lambda g, ctx, a: g.ggml_pad(ctx, a, 3, 2, 1, 1), leaves, n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_pad_ext(ctx, a, 1, 2, 3, 0, 0, 1, 2, 0), leaves, n_threads,
             exact=True)
    check_op(lambda g, ctx, a: g.ggml_pad_ext_circular(ctx, a, 2, 1, 1, 3, 0, 0, 0, 0), leaves,
             n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_pad(ctx, a, 1, 1, 0, 0),
             [Leaf(F32, (4, 3, 2), permute=(0, 2, 1, 3))], n_threads, exact=True)
    shares = engine_shares(lambda g, ctx, a: g.ggml_pad(ctx, a, 3, 2, 1, 1), leaves, n_threads,
                           GGMLOp.PAD)[0]
    assert [s.ranges for s in shares] == [tuple(range(i, 6, n_threads)) for i in range(n_threads)]


@pytest.mark.parametrize("n_threads", THREADS)
def test_timestep_embedding(n_threads):
    leaves = [Leaf(F32, (5,), values=[0.0, 1.0, 17.5, 250.0, 999.0])]
    for dim in (32, 15):
        check_op(lambda g, ctx, t: g.ggml_timestep_embedding(ctx, t, dim, 10000), leaves,
                 n_threads, max_nmse=1e-12)
    shares = engine_shares(lambda g, ctx, t: g.ggml_timestep_embedding(ctx, t, 32, 10000), leaves,
                           n_threads, GGMLOp.TIMESTEP_EMBEDDING)[0]
    assert [s.ranges for s in shares] == [tuple(range(i, 16, n_threads)) for i in range(n_threads)]


# --- misuse, on the engine only (real ggml would abort the process) --------------------------

def new_ctx():
    return eng.ggml_init(eng.ggml_init_params(16 * 1024 * 1024))


def compute(ctx, t, n_threads=2):
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, t)
    return eng.ggml_graph_compute_with_ctx(ctx, gf, n_threads)


def raises_assert(condition, fn, *args):
    with pytest.raises(GGMLAssertionError) as e:
        fn(*args)
    assert e.value.condition == condition
    return e.value


def test_constructor_asserts():
    ctx = new_ctx()
    t = lambda type_, *ne: getattr(eng, f"ggml_new_tensor_{len(ne)}d")(ctx, type_, *ne)  # noqa
    a = t(F32, 8, 6, 3)
    raises_assert("b->type == GGML_TYPE_I32", eng.ggml_get_rows, ctx, a, t(F32, 4, 3))
    raises_assert("a->ne[2] == b->ne[1]", eng.ggml_get_rows, ctx, a, t(I32, 4, 2))
    raises_assert("b->type == GGML_TYPE_F32", eng.ggml_set_rows, ctx, a, t(F16, 8, 2, 3),
                  t(I64, 2, 3))
    raises_assert("b->ne[1] == c->ne[0]", eng.ggml_set_rows, ctx, a, t(F32, 8, 2, 3), t(I64, 3))
    raises_assert("ggml_is_contiguous(a)", eng.ggml_soft_max, ctx, eng.ggml_transpose(ctx, a))
    raises_assert("mask->ne[0] == a->ne[0]", eng.ggml_soft_max_ext, ctx, a, t(F16, 7, 6), 1.0,
                  0.0)
    raises_assert("mask", eng.ggml_soft_max_ext, ctx, a, None, 1.0, 8.0)
    raises_assert("a->op == GGML_OP_SOFT_MAX", eng.ggml_soft_max_add_sinks, a, t(F32, 3))
    pos = t(I32, 3)
    raises_assert('(mode & 1) == 0 && "mode & 1 == 1 is no longer supported"', eng.ggml_rope,
                  ctx, a, pos, 8, 1)
    raises_assert("a->ne[2] == b->ne[0]", eng.ggml_rope, ctx, a, t(I32, 4), 8, 0)
    raises_assert("a->ne[2] * 4 == b->ne[0]", eng.ggml_rope_multi, ctx, a, pos, None, 8,
                  [2, 2, 0, 0], 8, 0, 1e4, 1.0, 0.0, 1.0, 0.0, 0.0)
    raises_assert('(OW > 0) && "b too small compared to a"', eng.ggml_im2col, ctx,
                  t(F32, 5, 5, 2, 1), t(F32, 3, 6, 2, 1), 1, 1, 0, 0, 1, 1, True, F32)
    raises_assert("a->ne[2] == b->ne[2]", eng.ggml_im2col, ctx, t(F32, 3, 3, 2, 1),
                  t(F32, 6, 6, 3, 1), 1, 1, 0, 0, 1, 1, True, F32)
    raises_assert("ne[1] > 0", eng.ggml_pool_2d, ctx, t(F32, 6, 2), 0, 2, 3, 1, 1, 0.0, 0.0)
    raises_assert("scale_factor > 1", eng.ggml_upscale, ctx, a, 1, 0)
    raises_assert("!(mode & GGML_SCALE_FLAG_ANTIALIAS) || "
                  "(mode & 0xFF) == GGML_SCALE_MODE_BILINEAR",
                  eng.ggml_interpolate, ctx, a, 16, 12, 3, 1, 0 | 512)
    raises_assert("a->type == GGML_TYPE_F32", eng.ggml_upscale, ctx, t(F16, 4, 4), 2, 0)
    q, k, v = t(F32, 16, 5, 4), t(F16, 16, 9, 2), t(F16, 16, 9, 2)
    raises_assert("ggml_can_mul_mat(k, q)", eng.ggml_flash_attn_ext, ctx, q, t(F16, 8, 9, 2), v,
                  None, 1.0, 0.0, 0.0)
    raises_assert("mask->type == GGML_TYPE_F16", eng.ggml_flash_attn_ext, ctx, q, k, v,
                  t(F32, 9, 5), 1.0, 0.0, 0.0)
    raises_assert("q->ne[2] % mask->ne[2] == 0", eng.ggml_flash_attn_ext, ctx, q, k, v,
                  t(F16, 9, 5, 3), 1.0, 0.0, 0.0)
    raises_assert("a->op == GGML_OP_FLASH_ATTN_EXT", eng.ggml_flash_attn_ext_set_prec, a, 10)
    fa_node = eng.ggml_flash_attn_ext(ctx, q, k, v, None, 1.0, 0.0, 0.0)
    raises_assert("a->src[0]->ne[2] == sinks->ne[0]", eng.ggml_flash_attn_ext_add_sinks, fa_node,
                  t(F32, 5))


def test_constructor_records():
    ctx = new_ctx()
    a = eng.ggml_new_tensor_3d(ctx, F32, 8, 6, 3)
    eng.ggml_set_name(a, "x")
    r = eng.ggml_diag_mask_inf_inplace(ctx, a, 2)
    assert (r.op, r.name, r.view_src, int(r.op_params[0])) == (GGMLOp.DIAG_MASK_INF, "x (view)",
                                                              a, 2)
    c = eng.ggml_new_tensor_1d(ctx, I64, 2)
    b = eng.ggml_new_tensor_3d(ctx, F32, 8, 2, 3)
    s = eng.ggml_set_rows(ctx, a, b, c)
    assert [s.src[i] for i in range(3)] == [b, c, a]  # ggml's legacy order
    p = eng.ggml_pool_2d(ctx, a, 1, 3, 3, 2, 2, 1.7, 0.5)
    assert [int(x) for x in p.op_params[:7]] == [1, 3, 3, 2, 2, 1, 0]  # paddings truncated


def test_compute_time_asserts():
    ctx = new_ctx()
    a = eng.ggml_new_tensor_2d(ctx, F32, 4, 5)
    idx = eng.ggml_new_tensor_1d(ctx, I32, 3)
    eng.set_data(idx, [0, 5, 1])
    with pytest.raises(GGMLAssertionError, match=r"i01 >= 0 && i01 < ne01"):
        compute(ctx, eng.ggml_get_rows(ctx, a, idx))

    ctx = new_ctx()
    a, b = eng.ggml_new_tensor_2d(ctx, F32, 4, 5), eng.ggml_new_tensor_2d(ctx, F32, 4, 2)
    idx = eng.ggml_new_tensor_1d(ctx, I64, 2)
    eng.set_data(idx, [1, -1])
    with pytest.raises(GGMLAssertionError, match=r"i1 >= 0 && i1 < ne1"):
        compute(ctx, eng.ggml_set_rows(ctx, a, b, idx))

    ctx = new_ctx()
    with pytest.raises(GGMLAssertionError, match=r"n_past >= 0"):
        compute(ctx, eng.ggml_diag_mask_inf(ctx, eng.ggml_new_tensor_2d(ctx, F32, 4, 4), -1))

    ctx = new_ctx()
    x, pos = eng.ggml_new_tensor_3d(ctx, F32, 8, 2, 3), eng.ggml_new_tensor_1d(ctx, I32, 3)
    eng.set_data(pos, [0, 1, 2])
    with pytest.raises(GGMLAssertionError, match=r"n_dims % 2 == 0"):
        compute(ctx, eng.ggml_rope(ctx, x, pos, 5, 0))
    with pytest.raises(GGMLAssertionError, match=r"n_dims <= ne0"):
        compute(ctx, eng.ggml_rope(ctx, x, pos, 10, 0))


def test_not_supported_types():
    """What the engine refuses where ggml would read out of bounds or has no kernel (a quantized
    K/V for FLASH_ATTN_EXT is computed now: tests/conformance/test_flash_attn.py)."""
    ctx = new_ctx()
    q, k = eng.ggml_new_tensor_3d(ctx, F32, 16, 4, 2), eng.ggml_new_tensor_3d(ctx, F16, 16, 9, 2)
    mask = eng.ggml_new_tensor_2d(ctx, F16, 9, 3)  # fewer rows than queries: ggml would overread
    with pytest.raises(GGMLNotSupportedError, match="smaller than"):
        compute(ctx, eng.ggml_flash_attn_ext(ctx, q, k, k, mask, 1.0, 0.0, 0.0))
    ctx = new_ctx()
    with pytest.raises(GGMLNotSupportedError, match="PAD"):
        compute(ctx, eng.ggml_pad(ctx, eng.ggml_new_tensor_2d(ctx, F16, 4, 4), 1, 1, 0, 0))
    ctx = new_ctx()
    with pytest.raises(GGMLNotSupportedError, match="SOFT_MAX"):
        compute(ctx, eng.ggml_soft_max(ctx, eng.ggml_new_tensor_2d(ctx, F16, 4, 4)))


# --- thread-count invariance -----------------------------------------------------------------

@pytest.mark.parametrize("case", ["soft_max", "rope", "conv_direct", "im2col", "get_rows"])
def test_results_identical_for_1_to_4_threads(case):
    build, leaves = {
        "soft_max": (lambda g, ctx, a, m: g.ggml_soft_max_ext(ctx, a, m, 0.5, 8.0),
                     [Leaf(F32, (32, 6, 4, 2)), Leaf(F16, (32, 8, 2, 1))]),
        "rope": (lambda g, ctx, a, b: g.ggml_rope(ctx, a, b, 32, NEOX),
                 [Leaf(F32, (32, 4, 7)), idx_leaf(I32, (7,), 50)]),
        "conv_direct": (lambda g, ctx, a, b: g.ggml_conv_2d_direct(ctx, a, b, 1, 1, 1, 1, 1, 1),
                        [Leaf(F32, (3, 3, 4, 5)), Leaf(F32, (9, 7, 4, 2))]),
        "im2col": (lambda g, ctx, a, b: g.ggml_im2col(ctx, a, b, 1, 1, 1, 1, 1, 1, True, int(F16)),
                   [Leaf(F16, (3, 3, 5, 2)), Leaf(F32, (9, 8, 5, 2))]),
        "get_rows": (with_add(lambda g, ctx, a, b: g.ggml_get_rows(ctx, a, b)),
                     [Leaf(Q4_0, (64, 9)), idx_leaf(I32, (11,), 9)]),
    }[case]
    first = engine_result(build, leaves, 1)
    for n in (2, 3, 4):
        assert engine_result(build, leaves, n) == first, f"{n} threads differ from 1"
