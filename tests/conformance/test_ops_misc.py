"""The small ops against real ggml: cumsum, diag, tri, fill, roll, add_id, add_cast, pad_reflect_1d,
solve_tri, Segment Anything's window and relative-position ops, the composed and transposed
convolutions and the rope_custom wrappers — results bit for bit at 1 and 3 threads, each thread's
rows as ggml splits them, and ggml's asserts; an empty view at the end of a pool."""

from __future__ import annotations

import numpy as np
import pytest

from engine import ggml as eng
from engine.core.errors import GGMLAssertionError
from engine.core.optable import GGMLOp
from engine.core.types import GGMLType
from tests.support.graphs import Leaf, check_op, engine_shares

F32, F16, I32, Q8_0 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.Q8_0
THREADS = [1, 3]


def dr_split(nr, nth):
    dr = (nr + nth - 1) // nth
    return [(min(dr * i, nr), min(dr * i + dr, nr)) for i in range(nth)]


@pytest.mark.parametrize("n_threads", THREADS)
def test_cumsum(n_threads):
    check_op(lambda g, ctx, a: g.ggml_cumsum(ctx, a), [Leaf(F32, (37, 5, 3))], n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_cumsum(ctx, a), [Leaf(F32, (9, 6, 2), permute=(0, 2, 1, 3))], n_threads,
             exact=True)


@pytest.mark.parametrize("n_threads", THREADS)
def test_diag(n_threads):
    check_op(lambda g, ctx, a: g.ggml_diag(ctx, a), [Leaf(F32, (7, 1, 3, 2))], n_threads, exact=True)


@pytest.mark.parametrize("tri", [0, 1, 2, 3])
@pytest.mark.parametrize("n_threads", THREADS)
def test_tri(tri, n_threads):
    assert eng.GGML_TRI_TYPE_LOWER == 3 and eng.GGML_TRI_TYPE_UPPER_DIAG == 0
    check_op(lambda g, ctx, a: g.ggml_tri(ctx, a, tri), [Leaf(F32, (6, 6, 4))], n_threads, exact=True)


@pytest.mark.parametrize("t", [F32, F16])
@pytest.mark.parametrize("n_threads", THREADS)
def test_fill(t, n_threads):
    check_op(lambda g, ctx, a: g.ggml_fill(ctx, a, 0.3), [Leaf(t, (5, 7, 2))], n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_fill_inplace(ctx, a, -2.5), [Leaf(t, (5, 7))], n_threads, exact=True)


@pytest.mark.parametrize("shifts", [(1, 0, 0, 0), (-2, 1, 0, 0), (3, -2, 1, 1), (0, 0, -1, 0)])
@pytest.mark.parametrize("n_threads", THREADS)
def test_roll(shifts, n_threads):
    check_op(lambda g, ctx, a: g.ggml_roll(ctx, a, *shifts), [Leaf(F32, (5, 4, 3, 2))], n_threads, exact=True)


@pytest.mark.parametrize("n_threads", THREADS)
def test_add_id(n_threads):
    ids = np.array([[2, 0], [1, 3], [3, 3], [0, 1], [2, 1]], np.int32)  # [n_used=2, n_tokens=5]
    leaves = [Leaf(F32, (8, 2, 5)), Leaf(F32, (8, 4)), Leaf(I32, (2, 5), values=ids)]
    check_op(lambda g, ctx, a, b, i: g.ggml_add_id(ctx, a, b, i), leaves, n_threads, exact=True)


@pytest.mark.parametrize("n_threads", THREADS)
def test_add_cast(n_threads):
    check_op(lambda g, ctx, a, b: g.ggml_add_cast(ctx, a, b, int(F32)), [Leaf(F16, (16, 3)), Leaf(F32, (16, 1))],
             n_threads, exact=True)
    check_op(lambda g, ctx, a, b: g.ggml_add_cast(ctx, a, b, int(F32)), [Leaf(Q8_0, (64, 3)), Leaf(F32, (64, 3))],
             n_threads, exact=True)


@pytest.mark.parametrize("pads", [(0, 0), (2, 3), (4, 4), (0, 4), (3, 0)])
@pytest.mark.parametrize("n_threads", THREADS)
def test_pad_reflect_1d(pads, n_threads):
    check_op(lambda g, ctx, a: g.ggml_pad_reflect_1d(ctx, a, *pads), [Leaf(F32, (5, 4, 2))], n_threads,
             exact=True)


@pytest.mark.parametrize("inplace", [False, True])
def test_rope_custom(inplace):
    fn = "ggml_rope_custom_inplace" if inplace else "ggml_rope_custom"
    leaves = [Leaf(F32, (16, 2, 3)), Leaf(I32, (3,), values=np.array([4, 5, 6], np.int32))]
    check_op(lambda g, ctx, a, p: getattr(g, fn)(ctx, a, p, 16, 0, 128, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0),
             leaves, 2)


@pytest.mark.parametrize("n_threads", [2, 3, 4])
def test_thread_rows(n_threads):
    (s,) = engine_shares(lambda g, ctx, a: g.ggml_cumsum(ctx, a), [Leaf(F32, (8, 7, 2))], n_threads,
                         GGMLOp.CUMSUM)
    assert [tuple(x.ranges[0]) for x in s] == dr_split(14, n_threads)
    (s,) = engine_shares(lambda g, ctx, a: g.ggml_roll(ctx, a, 1, 1, 0, 0), [Leaf(F32, (8, 7, 2))], n_threads,
                         GGMLOp.ROLL)
    per = (14 + n_threads) // n_threads
    assert [tuple(x.ranges[0]) for x in s] == [(min(i * per, 14), min(i * per + per, 14)) for i in range(n_threads)]
    (s,) = engine_shares(lambda g, ctx, a: g.ggml_pad_reflect_1d(ctx, a, 1, 2), [Leaf(F32, (8, 7))], n_threads,
                         GGMLOp.PAD_REFLECT_1D)
    assert [tuple(x.ranges) for x in s] == [tuple(range(i, 7, n_threads)) for i in range(n_threads)]
    (s,) = engine_shares(lambda g, ctx, a: g.ggml_diag(ctx, a), [Leaf(F32, (8, 1, 3))], n_threads, GGMLOp.DIAG,
                         all_threads=True)
    assert [x.kind for x in s] == ["all"] + ["idle"] * (n_threads - 1)


def test_asserts():
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 20))
    a = eng.ggml_new_tensor_2d(ctx, F32, 4, 3)
    with pytest.raises(GGMLAssertionError, match=r"a->ne\[0\] == a->ne\[1\]"):
        eng.ggml_tri(ctx, a, 0)
    with pytest.raises(GGMLAssertionError, match=r"a->ne\[1\] == 1"):
        eng.ggml_diag(ctx, a)
    with pytest.raises(GGMLAssertionError, match=r"abs\(shift0\) < a->ne\[0\]"):
        eng.ggml_roll(ctx, a, 4, 0, 0, 0)
    with pytest.raises(GGMLAssertionError, match=r"p1 < a->ne\[0\]"):
        eng.ggml_pad_reflect_1d(ctx, a, 1, 4)
    with pytest.raises(GGMLAssertionError, match="a->type == GGML_TYPE_F32"):
        eng.ggml_cumsum(ctx, eng.ggml_new_tensor_1d(ctx, F16, 4))
    with pytest.raises(GGMLAssertionError, match=r"ggml_is_quantized\(a->type\)"):
        eng.ggml_add_cast(ctx, a, a, int(F16))
    with pytest.raises(GGMLAssertionError, match="ids->type == GGML_TYPE_I32"):
        eng.ggml_add_id(ctx, eng.ggml_new_tensor_3d(ctx, F32, 4, 2, 3), a, eng.ggml_new_tensor_2d(ctx, F32, 2, 3))


def lower_triangular(n: int, batch: int, seed: int = 2) -> np.ndarray:
    """Well-conditioned lower-triangular matrices (numpy order: batch, row, col)."""
    rng = np.random.default_rng(seed)
    m = np.tril(rng.uniform(-1, 1, (batch, n, n))).astype(np.float32)
    m[:, np.arange(n), np.arange(n)] = rng.uniform(1.0, 2.0, (batch, n)).astype(np.float32)
    return m


@pytest.mark.parametrize("n_threads", [1, 3, 4])
def test_solve_tri(n_threads):
    leaves = [Leaf(F32, (9, 9, 2), values=lower_triangular(9, 2)), Leaf(F32, (5, 9, 2))]
    check_op(lambda g, ctx, a, b: g.ggml_solve_tri(ctx, a, b, True, True, False), leaves, n_threads, exact=True)
    big = [Leaf(F32, (14, 14, 1), values=lower_triangular(14, 1, seed=4)), Leaf(F32, (3, 14, 1))]
    check_op(lambda g, ctx, a, b: g.ggml_solve_tri(ctx, a, b, True, True, False), big, n_threads, exact=True)


def test_solve_tri_solves():
    a, b = lower_triangular(6, 1)[0], np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 20))
    ta, tb = eng.ggml_new_tensor_2d(ctx, F32, 6, 6), eng.ggml_new_tensor_2d(ctx, F32, 3, 6)
    eng.set_data(ta, a)
    eng.set_data(tb, b)
    x = eng.ggml_solve_tri(ctx, ta, tb, True, True, False)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, x)
    eng.ggml_graph_compute_with_ctx(ctx, gf, 2)
    np.testing.assert_allclose(a @ eng.to_numpy(x), b, atol=1e-5)
    with pytest.raises(GGMLAssertionError, match=r"lower && left && !uni"):
        eng.ggml_solve_tri(ctx, ta, tb, True, False, False)


@pytest.mark.parametrize("shape,w", [((3, 7, 5), 3), ((2, 6, 6), 3), ((4, 5, 9), 4)])
def test_win_part_and_unpart(shape, w):
    c, wd, h = shape
    npx, npy = -(-wd // w), -(-h // w)
    check_op(lambda g, ctx, a: g.ggml_win_part(ctx, a, w), [Leaf(F32, shape)], 2, exact=True)
    check_op(lambda g, ctx, a: g.ggml_win_unpart(ctx, a, wd, h, w), [Leaf(F32, (c, w, w, npx * npy))], 2,
             exact=True)


@pytest.mark.parametrize("t", [F16, GGMLType.BF16])
def test_get_rel_pos(t):
    check_op(lambda g, ctx, a: g.ggml_get_rel_pos(ctx, a, 5, 5), [Leaf(t, (6, 9))], 1, exact=True)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_add_rel_pos(inplace, n_threads):
    k, ne11, ne12, n_p = 4, 3, 2, 5
    fn = "ggml_add_rel_pos_inplace" if inplace else "ggml_add_rel_pos"
    leaves = [Leaf(F32, (k * k, ne11 * ne12, n_p)), Leaf(F32, (k, ne11, ne12, n_p)), Leaf(F32, (k, ne11, ne12, n_p))]
    check_op(lambda g, ctx, a, pw, ph: getattr(g, fn)(ctx, a, pw, ph), leaves, n_threads, exact=True)


@pytest.mark.parametrize("n_threads", [1, 3])
def test_conv_composites(n_threads):
    """The convolutions ggml.c composes of im2col and mul_mat: the same nodes, the same bits
    (small products: mul_mat's vec_dot emulated operation by operation)."""
    check_op(lambda g, ctx, a, b: g.ggml_conv_1d_ph(ctx, a, b, 1, 1), [Leaf(F16, (3, 4, 5)), Leaf(F32, (16, 4, 2))],
             n_threads, exact=True)
    check_op(lambda g, ctx, a, b: g.ggml_conv_1d_dw(ctx, a, b, 1, 1, 1), [Leaf(F16, (3, 1, 4)), Leaf(F32, (12, 4))],
             n_threads, exact=True)
    check_op(lambda g, ctx, a, b: g.ggml_conv_1d_dw_ph(ctx, a, b, 2, 1), [Leaf(F16, (5, 1, 3)), Leaf(F32, (14, 3))],
             n_threads, exact=True)
    check_op(lambda g, ctx, a, b: g.ggml_conv_2d_dw(ctx, a, b, 1, 1, 1, 1, 1, 1),
             [Leaf(F16, (3, 3, 1, 4)), Leaf(F32, (8, 7, 4, 2))], n_threads, exact=True)


@pytest.mark.parametrize("t", [F32, F16])
@pytest.mark.parametrize("s0", [1, 2, 3])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_conv_transpose_1d(t, s0, n_threads):
    leaves = [Leaf(t, (5, 6, 4)), Leaf(F32, (7, 4))]  # kernel [K, C_out, C_in], input [L, C_in]
    check_op(lambda g, ctx, a, b: g.ggml_conv_transpose_1d(ctx, a, b, s0, 0, 1), leaves, n_threads, exact=True)
    big = [Leaf(t, (3, 5, 40)), Leaf(F32, (9, 40))]  # C_in over the 16- and 32-float vec_dot steps
    check_op(lambda g, ctx, a, b: g.ggml_conv_transpose_1d(ctx, a, b, s0, 0, 1), big, n_threads, exact=True)


def dw_direct(s, p, d):
    return lambda g, ctx, a, b: g.ggml_conv_2d_dw_direct(ctx, a, b, s, s, p, p, d, d)


@pytest.mark.parametrize("s,p,d", [(1, 1, 1), (2, 0, 1), (1, 2, 2), (2, 1, 1)])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_conv_2d_dw_direct(s, p, d, n_threads):
    kernel = Leaf(F32, (3, 3, 1, 4))
    check_op(dw_direct(s, p, d), [kernel, Leaf(F32, (9, 7, 4, 2))], n_threads, exact=True)  # WHCN
    # channels first (CWHN): an image stored [C, W, H, N], seen as [W, H, C, N] through a permute
    check_op(dw_direct(s, p, d), [Leaf(F32, (12, 1, 3, 3), permute=(3, 2, 0, 1)),
                                  Leaf(F32, (12, 9, 7, 2), permute=(2, 0, 1, 3))], n_threads, exact=True)


@pytest.mark.parametrize("t", [F32, F16])
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_conv_transpose_2d(t, stride, n_threads):
    leaves = [Leaf(t, (3, 2, 5, 4)), Leaf(F32, (4, 3, 4, 1))]  # [KW, KH, C_out, C_in], [W, H, C_in, N]
    check_op(lambda g, ctx, a, b: g.ggml_conv_transpose_2d_p0(ctx, a, b, stride), leaves, n_threads, exact=True)
    wide = [Leaf(t, (2, 2, 3, 20)), Leaf(F32, (3, 2, 20, 1))]  # C_in over the vec_dot's 16-float steps
    check_op(lambda g, ctx, a, b: g.ggml_conv_transpose_2d_p0(ctx, a, b, stride), wide, n_threads, exact=True)


@pytest.mark.parametrize("t", [F32, F16, GGMLType.BF16])
@pytest.mark.parametrize("s0,p0", [(1, 0), (2, 1), (3, 0), (2, 0)])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_col2im_1d(t, s0, p0, n_threads):
    check_op(lambda g, ctx, a: g.ggml_col2im_1d(ctx, a, s0, 3, p0), [Leaf(t, (4 * 3, 7))], n_threads, exact=True)


@pytest.mark.parametrize("t", [F32, F16])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_im2col_3d_and_conv_3d(t, n_threads):
    ic = 3
    kernel, volume = Leaf(t, (3, 2, 2, 2 * ic)), Leaf(F32, (6, 5, 4, 2 * ic))  # OC = 2, N = 2
    for args in [(1, 1, 1, 0, 0, 0, 1, 1, 1), (2, 1, 1, 1, 1, 0, 1, 1, 1), (1, 2, 1, 1, 0, 1, 2, 1, 1)]:
        check_op(lambda g, ctx, a, b: g.ggml_im2col_3d(ctx, a, b, ic, *args, int(t)), [kernel, volume], n_threads,
                 exact=True)
        check_op(lambda g, ctx, a, b: g.ggml_conv_3d(ctx, a, b, ic, *args), [kernel, volume], n_threads,
                 exact=True)


@pytest.mark.parametrize("t", [F32, F16])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_conv_3d_direct(t, n_threads):
    c, n, oc = 3, 2, 2
    kernel, volume = Leaf(t, (3, 2, 2, c * oc)), Leaf(F32, (6, 5, 4, c * n))
    for args in [(1, 1, 1, 0, 0, 0, 1, 1, 1), (2, 1, 1, 1, 1, 0, 1, 1, 1), (1, 2, 1, 1, 0, 1, 2, 1, 1)]:
        check_op(lambda g, ctx, a, b: g.ggml_conv_3d_direct(ctx, a, b, *args, c, n, oc), [kernel, volume], n_threads,
                 exact=True)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_a_kernel_overhanging_the_input_by_less_than_a_stride(n_threads):
    """ggml sizes a convolution's output with C's division, which truncates toward zero: a kernel
    one element wider than the (padded) input, at stride 2, gives one output, not zero."""
    check_op(dw_direct(2, 0, 1), [Leaf(F32, (6, 6, 1, 4)), Leaf(F32, (5, 5, 4, 1))], n_threads, exact=True)
    c, n, oc = 2, 1, 2
    kernel, volume = Leaf(F32, (7, 2, 2, c * oc)), Leaf(F32, (6, 5, 4, c * n))
    args = (2, 1, 1, 0, 0, 0, 1, 1, 1)
    check_op(lambda g, ctx, a, b: g.ggml_conv_3d_direct(ctx, a, b, *args, c, n, oc), [kernel, volume], n_threads,
             exact=True)
    check_op(lambda g, ctx, a, b: g.ggml_im2col_3d(ctx, a, b, c, *args, int(F32)), [kernel, volume], n_threads,
             exact=True)


def test_an_empty_view_at_the_end_of_a_buffer_computes():
    """A view of zero rows just past a tensor that ends its pool (llama.cpp's recurrent memory
    views its cells after the last one, none for one sequence): ggml builds and computes it, its
    data pointer one past the pool's end; so does the engine."""
    import ggml as real

    for g in (eng, real):
        pool = g.ggml_init(g.ggml_init_params(g.ggml_tensor_overhead() + 2 * 8 * 4, None, False))
        a = g.ggml_new_tensor_2d(pool, int(F32), 8, 2)  # its data: the pool's last 64 bytes
        ctx = g.ggml_init(g.ggml_init_params(8 * g.ggml_tensor_overhead()
                                             + g.ggml_graph_overhead(), None, False))
        empty = g.ggml_view_2d(ctx, a, 8, 0, 8 * 4, 2 * 8 * 4)
        assert g.ggml_nbytes(empty) == 0
        gf = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(gf, g.ggml_scale_inplace(ctx, empty, 0.0))
        g.ggml_graph_compute_with_ctx(ctx, gf, 1)
        g.ggml_free(ctx)
        g.ggml_free(pool)
