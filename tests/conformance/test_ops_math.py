"""The math and activation ops (engine/ops/math.py and their kernels) against real ggml.

Each op is built on both engines from the same seeded leaves; the result's type, ne, nb, op,
op_params, name and the context's used memory must be identical, and the values bit-identical
(`exact`) or, where the engine's expf/logf/sinf/cosf/erff may differ from glibc's by an ulp, within
NMSE 1e-7. Every case runs on 1-4 threads. Thread shares are read back through the compute observer
and compared with ggml's split for the op, written out here from ops.cpp independently of the
kernels. Misuse is checked on the engine (condition text), and a few cases also on real ggml in a
child process, since ggml aborts.
"""

from __future__ import annotations

import ggml as real
import numpy as np
import pytest

from engine import ggml as eng
from engine.compute.kernels import floatmath as fm
from engine.core.errors import GGMLAssertionError, GGMLNotSupportedError
from engine.core.optable import GGMLOp
from engine.core.types import GGMLType, fp16_bits_to_fp32
from tests.conformance.test_misuse import real_ggml_failure
from tests.support import graphs
from tests.support.graphs import Leaf, check_op, leaf_bytes, run, values

F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32
THREADS = [1, 2, 3, 4]
UNARY = ["abs", "sgn", "neg", "step", "tanh", "elu", "relu", "sigmoid", "gelu", "gelu_erf",
         "gelu_quick", "silu", "hardswish", "hardsigmoid", "exp", "expm1", "softplus", "floor",
         "ceil", "round", "trunc"]
# ops whose values go through expf/logf/sinf/cosf (or erff, which calls expf): the engine rounds the
# float64 result once, glibc is within about half an ulp, so a few elements may differ by one ulp.
# Everything else (tanh, elu, the fp16 GELU tables, AVX2 v_silu, FMAs, the double sums) is exact.
NEAR = {"sigmoid", "exp", "expm1", "softplus", "gelu_erf", "silu", "log", "sin", "cos"}
GLU = ["reglu", "geglu", "swiglu", "geglu_erf", "geglu_quick"]
GLU_NEAR = {"swiglu", "geglu_erf"}  # silu's scalar tail uses expf; erff uses expf above 1.25


def nb(g, t, i):
    """t->nb[i] on either engine."""
    return int(t.nb[i]) if g is eng else int(t.contents.nb[i])


# --- element-wise ----------------------------------------------------------------------------

@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("name", UNARY + ["sqr", "sqrt", "log", "sin", "cos"])
def test_unary_f32(name, n_threads):
    low = 0.01 if name in ("sqrt", "log") else -12
    leaves = [Leaf(F32, (37, 5, 3), low=low, high=12)]
    check_op(lambda g, ctx, a: getattr(g, f"ggml_{name}")(ctx, a), leaves, n_threads,
             exact=name not in NEAR)


@pytest.mark.parametrize("name", UNARY + ["sqr", "sqrt", "log"])
@pytest.mark.parametrize("type_", [F16, BF16])
def test_unary_half(name, type_):
    if type_ == BF16 and name in ("gelu", "gelu_erf", "gelu_quick", "silu"):
        return  # ggml has F32 and F16 kernels only for these (it aborts); see test_not_supported
    low = 0.01 if name in ("sqrt", "log") else -4
    check_op(lambda g, ctx, a: getattr(g, f"ggml_{name}")(ctx, a),
             [Leaf(type_, (37, 5, 3), low=low, high=4)], 2, exact=name not in NEAR)


def test_unary_inplace_and_views():
    for name in ("relu", "gelu", "silu", "sqr", "exp"):
        check_op(lambda g, ctx, a: getattr(g, f"ggml_{name}_inplace")(ctx, a),
                 [Leaf(F32, (16, 6), name="x")], 2, exact=name not in NEAR - {"silu"})
    # rows contiguous but dims permuted: the generic row walk follows nb1..nb3
    for name in ("tanh", "gelu", "silu", "sqr"):  # rows of 24: silu without a scalar tail
        check_op(lambda g, ctx, a: getattr(g, f"ggml_{name}")(ctx, a),
                 [Leaf(F32, (24, 5, 3), permute=(0, 2, 1, 3))], 3, exact=True)
    check_op(lambda g, ctx, a: g.ggml_unary(ctx, a, eng.GGML_UNARY_OP_ELU),
             [Leaf(F32, (9, 4))], 1, exact=True)


def test_silu_simd_and_tail():
    """Rows of 64 go entirely through the emulated AVX2 v_silu (exact, overflow lanes included);
    61 leaves a 5-float tail computed with expf."""
    for ne0 in (64, 61):
        check_op(lambda g, ctx, a: g.ggml_silu(ctx, a), [Leaf(F32, (ne0, 40), low=-100, high=100)],
                 2, exact=ne0 == 64)
    check_op(lambda g, ctx, a, b: g.ggml_swiglu_split(ctx, a, b),
             [Leaf(F32, (64, 40), low=-100, high=100), Leaf(F32, (64, 40))], 2, exact=True)


def test_gelu_tables_match_ggml():
    """Every fp16 input through ggml's gelu/gelu_quick f16 kernels is a table entry."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(256, 256)
    leaf = Leaf(F16, (256, 256), values=fp16_bits_to_fp32(bits))
    for name, table in (("gelu", fm.gelu_table()), ("gelu_quick", fm.gelu_quick_table())):
        rng = np.random.default_rng(0)
        res = run(real, lambda g, ctx, a: getattr(g, f"ggml_{name}")(ctx, a), [leaf],
                  [leaf_bytes(leaf, rng)], 1)
        assert np.array_equal(np.frombuffer(res["raw"], np.uint16), table), name


def test_gelu_clamps_at_ten():
    x = np.array([-10.5, -10.0, -9.99, 9.99, 10.0, 10.5, 0.0, -0.0], np.float32)
    check_op(lambda g, ctx, a: g.ggml_gelu(ctx, a), [Leaf(F32, (8,), values=x)], 1, exact=True)


@pytest.mark.parametrize("n_threads", [1, 3])
def test_xielu_and_leaky_relu(n_threads):
    check_op(lambda g, ctx, a: g.ggml_xielu(ctx, a, 0.8, 0.8, 0.5, -1e-6),
             [Leaf(F32, (38, 50, 3), low=-3, high=3)], n_threads, exact=True)
    for t in (F32, F16):
        check_op(lambda g, ctx, a: g.ggml_leaky_relu(ctx, a, 0.1, False), [Leaf(t, (67, 5, 3))],
                 n_threads, exact=True)
        check_op(lambda g, ctx, a: g.ggml_leaky_relu(ctx, a, 0.1, True), [Leaf(t, (6, 5))],
                 n_threads, exact=True)


@pytest.mark.parametrize("n_threads", THREADS)
def test_clamp_scale(n_threads):
    for t in (F32, F16):
        check_op(lambda g, ctx, a: g.ggml_clamp(ctx, a, -0.3, 0.5), [Leaf(t, (67, 5, 3))],
                 n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_scale(ctx, a, 0.3), [Leaf(F32, (67, 5, 3))], n_threads,
             exact=True)
    check_op(lambda g, ctx, a: g.ggml_scale_bias(ctx, a, 0.3, 0.7), [Leaf(F32, (67, 5, 3))],
             n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_scale_inplace(ctx, a, -2.5), [Leaf(F32, (40, 3))],
             n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_scale_bias_inplace(ctx, a, 1.5, -1.0), [Leaf(F32, (33, 3))],
             n_threads, exact=True)


@pytest.mark.parametrize("n_threads", THREADS)
def test_add1_acc_set(n_threads):
    for a_t, b_t in ((F32, F32), (F16, F32), (F16, F16), (BF16, F32), (BF16, BF16)):
        check_op(lambda g, ctx, a, b: g.ggml_add1(ctx, a, b),
                 [Leaf(a_t, (13, 5, 3)), Leaf(b_t, (1,))], n_threads, exact=True)
    a, b = Leaf(F32, (13, 5, 3)), Leaf(F32, (4, 3, 2))
    check_op(lambda g, ctx, x, y: g.ggml_acc(ctx, x, y, nb(g, x, 1), nb(g, x, 2), nb(g, x, 3), 8),
             [a, b], n_threads, exact=True)
    check_op(lambda g, ctx, x, y: g.ggml_acc_inplace(ctx, x, y, 2 * nb(g, x, 1), nb(g, x, 2),
                                                     nb(g, x, 3), 4), [a, b], n_threads, exact=True)
    check_op(lambda g, ctx, x, y: g.ggml_set(ctx, x, y, nb(g, x, 1), nb(g, x, 2), nb(g, x, 3), 12),
             [a, b], n_threads, exact=True)
    check_op(lambda g, ctx, x, y: g.ggml_set_2d(ctx, x, y, 104, 12),
             [a, Leaf(F32, (4, 2))], n_threads, exact=True)
    check_op(lambda g, ctx, x, y: g.ggml_set_2d_inplace(ctx, x, y, 52, 0),
             [a, Leaf(F32, (4, 2))], n_threads, exact=True)
    check_op(lambda g, ctx, x, y: g.ggml_set_1d(ctx, x, y, 12),
             [Leaf(I32, (13, 5), low=-9, high=9), Leaf(I32, (7,), low=-9, high=9)], n_threads,
             exact=True)
    check_op(lambda g, ctx, x, y: g.ggml_set_1d_inplace(ctx, x, y, 40),
             [Leaf(F32, (13, 5)), Leaf(F32, (7,))], n_threads, exact=True)


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("name", GLU)
def test_glu(name, n_threads):
    for t in (F32, F16):
        exact = name not in GLU_NEAR
        check_op(lambda g, ctx, a: getattr(g, f"ggml_{name}")(ctx, a),
                 [Leaf(t, (38, 5, 3), low=-12, high=12)], n_threads, exact=exact)
        check_op(lambda g, ctx, a: getattr(g, f"ggml_{name}_swapped")(ctx, a),
                 [Leaf(t, (38, 5, 3), low=-4, high=4)], n_threads, exact=exact)
        check_op(lambda g, ctx, a, b: getattr(g, f"ggml_{name}_split")(ctx, a, b),
                 [Leaf(t, (19, 5, 3), low=-4, high=4), Leaf(t, (19, 5, 3))], n_threads, exact=exact)


def test_glu_generic_and_oai():
    check_op(lambda g, ctx, a: g.ggml_glu(ctx, a, eng.GGML_GLU_OP_SWIGLU, True),
             [Leaf(F32, (64, 7))], 2, exact=True)  # halves of 32: no scalar tail
    check_op(lambda g, ctx, a, b: g.ggml_glu_split(ctx, a, b, eng.GGML_GLU_OP_GEGLU),
             [Leaf(F32, (32, 7)), Leaf(F32, (32, 7))], 2, exact=True)
    # packed halves (the C lookup): x beyond +-10 against negative g, bit for bit (+0, not -0)
    leaves = [Leaf(F32, (64, 9), low=-14, high=14), Leaf(F32, (64, 9), low=-3, high=3)]
    datas = [leaf_bytes(leaf, np.random.default_rng(3)) for leaf in leaves]
    for n_threads in (1, 2):
        ours, theirs = (values(run(api, lambda g, ctx, a, b: g.ggml_geglu_split(ctx, a, b), leaves,
                                   datas, n_threads)) for api in (eng, real))
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    for n_threads in (1, 3):
        check_op(lambda g, ctx, a, b: g.ggml_swiglu_oai(ctx, a, b, 1.702, 7.0),
                 [Leaf(F32, (19, 5, 3), low=-9, high=9), Leaf(F32, (19, 5, 3), low=-9, high=9)],
                 n_threads)  # expf
        check_op(lambda g, ctx, a: g.ggml_swiglu_oai(ctx, a, None, 1.702, 7.0),
                 [Leaf(F32, (38, 5, 3), low=-9, high=9)], n_threads)


# --- norms -----------------------------------------------------------------------------------

@pytest.mark.parametrize("n_threads", THREADS)
def test_norms(n_threads):
    x = Leaf(F32, (67, 5, 3, 2), low=-3, high=5)
    check_op(lambda g, ctx, a: g.ggml_norm(ctx, a, 1e-5), [x], n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_rms_norm(ctx, a, 1e-6), [x], n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_l2_norm(ctx, a, 1e-6), [x], n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_group_norm(ctx, a, 3, 1e-6),
             [Leaf(F32, (9, 7, 8, 2), low=-3, high=5)], n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_rms_norm(ctx, a, 1e-6), [Leaf(F32, (4096, 3))],
             n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_norm(ctx, a, 1e-5), [Leaf(F32, (4096, 3))],
             n_threads, exact=True)


def test_norms_non_contiguous_and_inplace():
    t = Leaf(F32, (5, 67, 3), low=-3, high=5, permute=(1, 0, 2, 3))  # strided rows
    check_op(lambda g, ctx, a: g.ggml_norm(ctx, a, 1e-5), [t], 3, exact=True)
    check_op(lambda g, ctx, a: g.ggml_l2_norm(ctx, a, 1e-6), [t], 3, exact=True)
    p = Leaf(F32, (67, 5, 3), low=-3, high=5, permute=(0, 2, 1, 3))  # rows packed, dims swapped
    check_op(lambda g, ctx, a: g.ggml_rms_norm(ctx, a, 1e-6), [p], 2, exact=True)
    x = Leaf(F32, (40, 6), name="h")
    for name in ("norm_inplace", "rms_norm_inplace", "l2_norm_inplace"):
        check_op(lambda g, ctx, a: getattr(g, f"ggml_{name}")(ctx, a, 1e-5), [x], 2, exact=True)
    check_op(lambda g, ctx, a: g.ggml_group_norm_inplace(ctx, a, 2, 1e-5),
             [Leaf(F32, (4, 3, 5))], 2, exact=True)
    # rms_norm then mul: ggml's CPU fuses the pair; the values are those of the two ops
    check_op(lambda g, ctx, a, w: g.ggml_mul(ctx, g.ggml_rms_norm(ctx, a, 1e-6), w),
             [Leaf(F32, (64, 5)), Leaf(F32, (64,))], 2, exact=True)


def norm_rows_summed_in_order() -> np.ndarray:
    """Rows (4, 4096) whose norm shows the order of ggml's double sums: 1 + 2^-24 (a tie between
    two floats) and 4094 tiny values, which added left to right each vanish (the mean rounds to
    even) and added pairwise add up (it rounds up); a row of -0.0 (the sum starts at +0.0); and
    two ordinary rows."""
    x = np.random.default_rng(9).uniform(-3, 5, (4, 4096)).astype(np.float32)
    x[0, :2], x[0, 2:] = (1.0, 2.0 ** -24), 2.0 ** -60
    x[1] = -0.0
    return x


@pytest.mark.parametrize("n_threads", [1, 3])
def test_norm_sums_in_order(n_threads):
    ours, theirs = check_op(lambda g, ctx, a: g.ggml_norm(ctx, a, 1e-5),
                            [Leaf(F32, (4096, 4), values=norm_rows_summed_in_order())],
                            n_threads, exact=True)
    assert ours["raw"] == theirs["raw"]  # bit for bit: the zeros' signs too


def rms_rows_summed_in_order() -> np.ndarray:
    """Rows whose squares, added left to right in double as ggml adds them, give a mean that a
    pairwise sum rounds to the next float: 1, then 2^-12 (its square 2^-24: the sum sits halfway
    between two floats once divided), then 4094 values whose squares (2^-60) vanish one by one
    but not summed together first; the same reversed, and an ordinary row."""
    row = np.full(4096, 2.0 ** -30, np.float32)
    row[0], row[1] = 1.0, 2.0 ** -12
    ordinary = np.random.default_rng(7).standard_normal(4096).astype(np.float32)
    return np.stack([row, row[::-1].copy(), ordinary, row * 3])


@pytest.mark.parametrize("n_threads", [1, 3])
def test_rms_norm_sums_in_order(n_threads):
    ours, theirs = check_op(lambda g, ctx, a: g.ggml_rms_norm(ctx, a, 1e-6),
                            [Leaf(F32, (4096, 4), values=rms_rows_summed_in_order())],
                            n_threads, exact=True)
    assert ours["raw"] == theirs["raw"]


# --- reductions, orderings -------------------------------------------------------------------

@pytest.mark.parametrize("n_threads", THREADS)
def test_reductions(n_threads):
    x = Leaf(F32, (67, 5, 3, 2))
    for name in ("sum", "sum_rows", "mean"):
        check_op(lambda g, ctx, a: getattr(g, f"ggml_{name}")(ctx, a), [x], n_threads, exact=True)
    for t in (F16, BF16):
        check_op(lambda g, ctx, a: g.ggml_sum(ctx, a), [Leaf(t, (67, 5, 3))], n_threads,
                 exact=True)
    check_op(lambda g, ctx, a: g.ggml_sum_rows(ctx, a),
             [Leaf(F32, (6, 5, 3), permute=(0, 2, 1, 3))], n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_argmax(ctx, a), [Leaf(F32, (67, 9))], n_threads, exact=True)
    ties = np.array([[1, 3, 3, 0], [5, 5, 5, 5], [-np.inf] * 4], np.float32)
    check_op(lambda g, ctx, a: g.ggml_argmax(ctx, a), [Leaf(F32, (4, 3), values=ties)],
             n_threads, exact=True)
    ints = dict(low=0, high=3)
    check_op(lambda g, ctx, a, b: g.ggml_count_equal(ctx, a, b),
             [Leaf(I32, (67, 5), **ints), Leaf(I32, (67, 5), **ints)], n_threads, exact=True)
    # 4-d: ggml's row index formula is only right for matrices, so it does not count every equal
    # element; the engine uses the same formula and counts what ggml counts
    leaves = [Leaf(I32, (4, 2, 3, 2), **ints), Leaf(I32, (4, 2, 3, 2), **ints)]
    ours, _ = check_op(lambda g, ctx, a, b: g.ggml_count_equal(ctx, a, b), leaves, n_threads,
                       exact=True)
    rng = np.random.default_rng(0)
    a, b = (np.frombuffer(leaf_bytes(leaf, rng), np.int32) for leaf in leaves)
    assert values(ours)[0, 0, 0, 0] != np.count_nonzero(a == b)


@pytest.mark.parametrize("n_threads", THREADS)
def test_orderings(n_threads):
    x = Leaf(F32, (67, 5, 3))  # random floats: no ties, so any correct sort agrees with std::sort
    check_op(lambda g, ctx, a: g.ggml_argsort(ctx, a, eng.GGML_SORT_ORDER_ASC), [x], n_threads,
             exact=True)
    check_op(lambda g, ctx, a: g.ggml_argsort(ctx, a, eng.GGML_SORT_ORDER_DESC), [x], n_threads,
             exact=True)
    check_op(lambda g, ctx, a: g.ggml_top_k(ctx, a, 7), [x], n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_top_k(ctx, a, 1), [x], n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_argsort_top_k(ctx, a, 7), [x], n_threads, exact=True)


@pytest.mark.parametrize("n_threads", THREADS)
def test_cross_entropy_loss(n_threads):
    check_op(lambda g, ctx, a, b: g.ggml_cross_entropy_loss(ctx, a, b),
             [Leaf(F32, (67, 5, 3), low=-3, high=3), Leaf(F32, (67, 5, 3), low=0, high=1)],
             n_threads)  # expf, logf


# --- repeat, concat, out_prod, arange --------------------------------------------------------

@pytest.mark.parametrize("n_threads", THREADS)
def test_repeat_concat(n_threads):
    check_op(lambda g, ctx, a, b: g.ggml_repeat(ctx, a, b),
             [Leaf(F32, (3, 1, 2)), Leaf(F32, (6, 4, 4, 2))], n_threads, exact=True)
    for t in (F16, BF16, I32):
        check_op(lambda g, ctx, a, b: g.ggml_repeat(ctx, a, b),
                 [Leaf(t, (3, 2, 2), permute=(0, 2, 1, 3), high=9), Leaf(t, (6, 4, 4, 2))],
                 n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_repeat_4d(ctx, a, 4, 6, 2, 3), [Leaf(F32, (2, 3, 1, 1))],
             n_threads, exact=True)
    shape = (3, 4, 5, 2)
    for dim in range(4):
        other = tuple(7 if i == dim else n for i, n in enumerate(shape))
        check_op(lambda g, ctx, a, b: g.ggml_concat(ctx, a, b, dim),
                 [Leaf(F32, shape), Leaf(F32, other)], n_threads, exact=True)
    check_op(lambda g, ctx, a, b: g.ggml_concat(ctx, a, b, 1),
             [Leaf(I32, (3, 4, 5), permute=(0, 2, 1, 3), high=100), Leaf(I32, (3, 2, 4), high=100)],
             n_threads, exact=True)
    check_op(lambda g, ctx, a, b: g.ggml_concat(ctx, a, b, 2),
             [Leaf(F16, (3, 4, 5)), Leaf(F16, (3, 4, 2))], n_threads, exact=True)


@pytest.mark.parametrize("n_threads", THREADS)
def test_out_prod_arange(n_threads):
    check_op(lambda g, ctx, a, b: g.ggml_out_prod(ctx, a, b),
             [Leaf(F32, (70, 9, 2, 1)), Leaf(F32, (11, 9, 4, 3))], n_threads, exact=True)
    check_op(lambda g, ctx, a, b: g.ggml_out_prod(ctx, a, b),
             [Leaf(F32, (16, 5)), Leaf(F32, (5, 3), permute=(1, 0, 2, 3))], n_threads, exact=True)
    check_op(lambda g, ctx: g.ggml_arange(ctx, 0.3, 17.9, 0.7), [], n_threads, exact=True)
    check_op(lambda g, ctx: g.ggml_arange(ctx, -5.0, 1000.0, 1.0), [], n_threads, exact=True)


# --- thread shares ---------------------------------------------------------------------------

def engine_shares(build, leaves, n_threads, op):
    """Each thread's share of the one node with `op`, all n threads in the plan."""
    found = graphs.engine_shares(build, leaves, n_threads, op, all_threads=True)
    assert len(found) == 1
    return [(s.ith, s.kind, s.ranges) for s in found[0]]


def dr(nr, nth):
    """ggml's generic split: [dr*ith, min(dr*ith + dr, nr)) with dr = ceil(nr/nth), per thread."""
    d = (nr + nth - 1) // nth
    return [(i, "rows", ((min(d * i, nr), min(d * i + d, nr)),)) for i in range(nth)]


def interleaved(n, nth):
    return [(i, "interleaved", tuple(range(i, n, nth))) for i in range(nth)]


def thread0(nth):
    return [(0, "all", ())] + [(i, "idle", ()) for i in range(1, nth)]


X = [Leaf(F32, (20, 7, 3))]  # 21 rows, 3 matrices of 7 rows
SHARE_CASES = [
    ("unary", lambda g, c, a: g.ggml_abs(c, a), X, GGMLOp.UNARY, lambda n: dr(21, n)),
    ("gelu", lambda g, c, a: g.ggml_gelu(c, a), X, GGMLOp.UNARY, lambda n: dr(21, n)),
    ("sqr", lambda g, c, a: g.ggml_sqr(c, a), X, GGMLOp.SQR, lambda n: dr(21, n)),
    ("glu", lambda g, c, a: g.ggml_swiglu(c, a), X, GGMLOp.GLU, lambda n: dr(21, n)),
    ("scale", lambda g, c, a: g.ggml_scale(c, a, 2.0), X, GGMLOp.SCALE, lambda n: dr(21, n)),
    ("add1", lambda g, c, a, b: g.ggml_add1(c, a, b), X + [Leaf(F32, (1,))], GGMLOp.ADD1,
     lambda n: dr(21, n)),
    ("norm", lambda g, c, a: g.ggml_norm(c, a, 1e-5), X, GGMLOp.NORM,
     lambda n: interleaved(7, n)),
    ("rms_norm", lambda g, c, a: g.ggml_rms_norm(c, a, 1e-5), X, GGMLOp.RMS_NORM,
     lambda n: interleaved(7, n)),
    ("l2_norm", lambda g, c, a: g.ggml_l2_norm(c, a, 1e-5), X, GGMLOp.L2_NORM,
     lambda n: interleaved(7, n)),
    ("group_norm", lambda g, c, a: g.ggml_group_norm(c, a, 3, 1e-5), X, GGMLOp.GROUP_NORM,
     lambda n: interleaved(3, n)),
    ("clamp", lambda g, c, a: g.ggml_clamp(c, a, 0, 1), X, GGMLOp.CLAMP,
     lambda n: interleaved(21, n)),
    ("argsort", lambda g, c, a: g.ggml_argsort(c, a, 0), X, GGMLOp.ARGSORT,
     lambda n: interleaved(21, n)),
    ("top_k", lambda g, c, a: g.ggml_top_k(c, a, 3), X, GGMLOp.TOP_K,
     lambda n: interleaved(21, n)),
    ("concat", lambda g, c, a, b: g.ggml_concat(c, a, b, 2), X + [Leaf(F32, (20, 7, 2))],
     GGMLOp.CONCAT, lambda n: interleaved(5, n)),
    ("arange", lambda g, c: g.ggml_arange(c, 0, 10, 1), [], GGMLOp.ARANGE,
     lambda n: interleaved(10, n)),
    ("sum", lambda g, c, a: g.ggml_sum(c, a), X, GGMLOp.SUM, thread0),
    ("sum_rows", lambda g, c, a: g.ggml_sum_rows(c, a), X, GGMLOp.SUM_ROWS, thread0),
    ("mean", lambda g, c, a: g.ggml_mean(c, a), X, GGMLOp.MEAN, thread0),
    ("argmax", lambda g, c, a: g.ggml_argmax(c, a), [Leaf(F32, (20, 7))], GGMLOp.ARGMAX, thread0),
    ("repeat", lambda g, c, a: g.ggml_repeat_4d(c, a, 20, 7, 6, 1), X, GGMLOp.REPEAT, thread0),
    ("leaky_relu", lambda g, c, a: g.ggml_leaky_relu(c, a, 0.1, False), X, GGMLOp.LEAKY_RELU,
     thread0),
    ("acc", lambda g, c, a, b: g.ggml_acc(c, a, b, 80, 560, 1680, 0), X + [Leaf(F32, (4, 5))],
     GGMLOp.ACC, lambda n: dr(5, n)),
    ("set", lambda g, c, a, b: g.ggml_set_1d(c, a, b, 0), X + [Leaf(F32, (4, 5))], GGMLOp.SET,
     lambda n: dr(5, n)),
    ("out_prod", lambda g, c, a, b: g.ggml_out_prod(c, a, b), [Leaf(F32, (8, 3)),
     Leaf(F32, (5, 3, 2))], GGMLOp.OUT_PROD, lambda n: dr(10, n)),
    ("count_equal", lambda g, c, a, b: g.ggml_count_equal(c, a, b),
     [Leaf(I32, (6, 9), high=3), Leaf(I32, (6, 9), high=3)], GGMLOp.COUNT_EQUAL,
     lambda n: dr(9, n)),
    ("cross_entropy", lambda g, c, a, b: g.ggml_cross_entropy_loss(c, a, b), X + X,
     GGMLOp.CROSS_ENTROPY_LOSS, lambda n: dr(21, n)),
]


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("case", SHARE_CASES, ids=[c[0] for c in SHARE_CASES])
def test_thread_shares(case, n_threads):
    _, build, leaves, op, expected = case
    assert engine_shares(build, leaves, n_threads, op) == expected(n_threads)


def test_results_do_not_depend_on_threads():
    """The same graph on 1..4 threads: identical bytes (each op checked against ggml above)."""
    leaves = [Leaf(F32, (64, 9, 2), low=-3, high=3), Leaf(F32, (64, 9, 2), low=0, high=1)]

    def build(g, ctx, a, b):
        h = g.ggml_mul(ctx, g.ggml_rms_norm(ctx, a, 1e-6), b)
        h = g.ggml_swiglu_split(ctx, g.ggml_gelu(ctx, h), g.ggml_scale_bias(ctx, h, 0.5, 0.1))
        return g.ggml_sum_rows(ctx, g.ggml_concat(ctx, g.ggml_norm(ctx, h, 1e-5), h, 1))

    rng = np.random.default_rng(3)
    datas = [leaf_bytes(leaf, rng) for leaf in leaves]
    raws = {run(eng, build, leaves, datas, n)["raw"] for n in THREADS}
    assert len(raws) == 1


# --- misuse ----------------------------------------------------------------------------------

def _ctx():
    return eng.ggml_init(eng.ggml_init_params(1 << 20))


def _t(ctx, type_, *ne):
    return getattr(eng, f"ggml_new_tensor_{len(ne)}d")(ctx, int(type_), *ne)


MISUSE = [
    ("add1 non-scalar", "ggml_is_scalar(b)",
     lambda c: eng.ggml_add1(c, _t(c, F32, 4, 3), _t(c, F32, 2))),
    ("add1 not padded", "ggml_is_padded_1d(a)",
     lambda c: eng.ggml_add1(c, eng.ggml_transpose(c, _t(c, F32, 4, 3)), _t(c, F32, 1))),
    ("acc too big", "ggml_nelements(b) <= ggml_nelements(a)",
     lambda c: eng.ggml_acc(c, _t(c, F32, 4), _t(c, F32, 5), 16, 16, 16, 0)),
    ("acc f16", "a->type == GGML_TYPE_F32",
     lambda c: eng.ggml_acc(c, _t(c, F16, 4), _t(c, F32, 2), 8, 8, 8, 0)),
    ("set offset", "offset < (size_t)(1 << 30)",
     lambda c: eng.ggml_set_1d(c, _t(c, F32, 4), _t(c, F32, 2), 1 << 30)),
    ("argmax 3d", "ggml_is_matrix(a)", lambda c: eng.ggml_argmax(c, _t(c, F32, 4, 3, 2))),
    ("count_equal shapes", "ggml_are_same_shape(a, b)",
     lambda c: eng.ggml_count_equal(c, _t(c, I32, 4), _t(c, I32, 5))),
    ("repeat", "ggml_can_repeat(a, b)",
     lambda c: eng.ggml_repeat(c, _t(c, F32, 3), _t(c, F32, 4))),
    ("repeat_4d", "can_repeat", lambda c: eng.ggml_repeat_4d(c, _t(c, F32, 3), 4, 1, 1, 1)),
    ("concat dim", "dim >= 0 && dim < GGML_MAX_DIMS",
     lambda c: eng.ggml_concat(c, _t(c, F32, 3), _t(c, F32, 3), 4)),
    ("concat types", "a->type == b->type",
     lambda c: eng.ggml_concat(c, _t(c, F32, 3), _t(c, F16, 3), 0)),
    ("concat shapes", "a->ne[d] == b->ne[d]",
     lambda c: eng.ggml_concat(c, _t(c, F32, 3, 2), _t(c, F32, 3, 4), 0)),
    ("out_prod shapes", "ggml_can_out_prod(a, b)",
     lambda c: eng.ggml_out_prod(c, _t(c, F32, 3, 2), _t(c, F32, 3, 4))),
    ("out_prod transposed", "!ggml_is_transposed(a)",
     lambda c: eng.ggml_out_prod(c, eng.ggml_transpose(c, _t(c, F32, 2, 3)), _t(c, F32, 4, 2))),
    ("scale not padded", "ggml_is_padded_1d(a)",
     lambda c: eng.ggml_scale(c, eng.ggml_transpose(c, _t(c, F32, 4, 3)), 2.0)),
    ("unary strided rows", "ggml_is_contiguous_rows(a)",
     lambda c: eng.ggml_gelu(c, eng.ggml_transpose(c, _t(c, F32, 4, 3)))),
    ("glu not contiguous", "ggml_is_contiguous_1(a)",
     lambda c: eng.ggml_swiglu(c, eng.ggml_transpose(c, _t(c, F32, 4, 6)))),
    ("glu split shapes", "ggml_are_same_shape(a, b)",
     lambda c: eng.ggml_swiglu_split(c, _t(c, F32, 4, 3), _t(c, F32, 4, 2))),
    ("glu split types", "a->type == b->type",
     lambda c: eng.ggml_geglu_split(c, _t(c, F32, 4, 3), _t(c, F16, 4, 3))),
    ("arange", "stop > start", lambda c: eng.ggml_arange(c, 3.0, 3.0, 1.0)),
    ("top_k", "a->ne[0] >= k", lambda c: eng.ggml_top_k(c, _t(c, F32, 4, 3), 5)),
    ("argsort_top_k", "a->ne[0] >= k", lambda c: eng.ggml_argsort_top_k(c, _t(c, F32, 4), 5)),
    ("cross_entropy", "ggml_are_same_shape(a, b)",
     lambda c: eng.ggml_cross_entropy_loss(c, _t(c, F32, 4, 3), _t(c, F32, 4, 2))),
]


@pytest.mark.parametrize("case", MISUSE, ids=[m[0] for m in MISUSE])
def test_misuse_raises_ggml_condition(case):
    _, condition, bad = case
    with pytest.raises(GGMLAssertionError) as err:
        bad(_ctx())
    assert err.value.condition == condition


# the same programs on real ggml, which aborts: its message must name the engine's condition
REAL_MISUSE = [
    ("ggml_is_scalar(b)",
     "a = g.ggml_new_tensor_2d(ctx, F32, 4, 3)\nb = g.ggml_new_tensor_1d(ctx, F32, 2)\n"
     "g.ggml_add1(ctx, a, b)"),
    ("dim >= 0 && dim < GGML_MAX_DIMS",
     "a = g.ggml_new_tensor_1d(ctx, F32, 3)\ng.ggml_concat(ctx, a, a, 4)"),
    ("ggml_is_contiguous_rows(a)",
     "a = g.ggml_new_tensor_2d(ctx, F32, 4, 3)\ng.ggml_gelu(ctx, g.ggml_transpose(ctx, a))"),
    ("ggml_is_contiguous_1(a)",
     "a = g.ggml_new_tensor_2d(ctx, F32, 4, 6)\ng.ggml_swiglu(ctx, g.ggml_transpose(ctx, a))"),
    ("stop > start", "g.ggml_arange(ctx, 3.0, 3.0, 1.0)"),
]


@pytest.mark.parametrize("condition,body", REAL_MISUSE, ids=[m[0] for m in REAL_MISUSE])
def test_real_ggml_asserts_the_same(condition, body):
    assert f"GGML_ASSERT({condition}) failed" in real_ggml_failure(body)


def test_kernel_asserts_and_unsupported_types():
    def compute(build, *leaves):
        ctx = eng.ggml_init(eng.ggml_init_params(1 << 20))
        ts = [_t(ctx, t, *ne) for t, ne in leaves]
        for t in ts:
            eng.data_bytes(t)[:] = 0
        gf = eng.ggml_new_graph(ctx)
        eng.ggml_build_forward_expand(gf, build(ctx, *ts))
        eng.ggml_graph_compute_with_ctx(ctx, gf, 2)

    with pytest.raises(GGMLAssertionError, match=r"eps >= 0\.0f"):
        compute(lambda c, a: eng.ggml_rms_norm(c, a, -1.0), (F32, (8, 2)))
    with pytest.raises(GGMLAssertionError, match=r"src0->nb\[0\] == sizeof\(float\)"):
        compute(lambda c, a: eng.ggml_rms_norm(c, eng.ggml_transpose(c, a), 1e-5), (F32, (8, 2)))
    for build, leaf in ((lambda c, a: eng.ggml_gelu(c, a), (BF16, (8, 2))),  # ggml: F32/F16 only
                        (lambda c, a: eng.ggml_sum_rows(c, a), (F16, (8, 2))),
                        (lambda c, a: eng.ggml_norm(c, a, 1e-5), (F16, (8, 2))),
                        (lambda c, a: eng.ggml_clamp(c, a, 0, 1), (BF16, (8, 2)))):
        with pytest.raises(GGMLNotSupportedError):
            compute(build, leaf)
    with pytest.raises(GGMLNotSupportedError):  # ggml aborts on an F16 out_prod
        compute(lambda c, a, b: eng.ggml_out_prod(c, a, b), (F16, (8, 2)), (F32, (4, 2)))
