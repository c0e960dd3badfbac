"""The core kernels (copies, binary ops, mul_mat) against real ggml, for several thread counts."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.types import GGMLType
from tests.support.graphs import Leaf, check_op

F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32
THREADS = [1, 2, 3, 4, 8]


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("op", ["ggml_add", "ggml_sub", "ggml_mul", "ggml_div"])
def test_binary_broadcast(op, n_threads):
    def build(g, ctx, a, b):
        return getattr(g, op)(ctx, a, b)
    check_op(build, [Leaf(F32, (8, 5, 3, 2)), Leaf(F32, (4, 1, 3, 1), low=0.5, high=2)],
             n_threads, exact=True)
    check_op(build, [Leaf(F32, (6, 4, 2), permute=(0, 2, 1, 3)), Leaf(F32, (6, 1, 4))],
             n_threads, exact=True)


@pytest.mark.parametrize("types", [(F16, F16), (F16, F32), (BF16, F32), (BF16, BF16)])
def test_binary_half_types(types):
    check_op(lambda g, ctx, a, b: g.ggml_add(ctx, a, b),
             [Leaf(types[0], (16, 3)), Leaf(types[1], (16, 3))], 2, exact=True)


@pytest.mark.parametrize("n_threads", [1, 3, 4])
@pytest.mark.parametrize("src,dst", [(F32, F32), (F32, F16), (F16, F32), (F32, BF16), (BF16, F16),
                                     (F16, BF16)])
def test_cpy_and_cont(src, dst, n_threads):
    check_op(lambda g, ctx, a, b: g.ggml_cpy(ctx, a, b),
             [Leaf(src, (6, 5, 2)), Leaf(dst, (10, 6))], n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_cont(ctx, g.ggml_transpose(ctx, a)),
             [Leaf(src, (7, 3, 2))], n_threads, exact=True)
    check_op(lambda g, ctx, a: g.ggml_dup(ctx, g.ggml_permute(ctx, a, 2, 0, 1, 3)),
             [Leaf(src, (4, 3, 5))], n_threads, exact=True)


@pytest.mark.parametrize("n_threads", THREADS)
@pytest.mark.parametrize("wtype", [F32, F16, BF16])
def test_mul_mat_float(wtype, n_threads):
    def build(g, ctx, a, b):
        return g.ggml_mul_mat(ctx, a, b)
    for ne_a, ne_b in [((64, 33), (64, 7)), ((32, 16, 2, 1), (32, 20, 6, 3)), ((16, 5), (16, 1))]:
        check_op(build, [Leaf(wtype, ne_a), Leaf(F32, ne_b)], n_threads, max_nmse=1e-7)


def test_mul_mat_non_contiguous_src1():
    check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
             [Leaf(F32, (16, 9, 3)), Leaf(F32, (16, 3, 4), permute=(0, 2, 1, 3))], 2)


def test_simple_ctx():
    a = Leaf(F32, (2, 4), values=[[2, 8], [5, 1], [4, 2], [8, 6]])
    b = Leaf(F32, (2, 3), values=[[10, 5], [9, 9], [5, 4]])
    ours, _ = check_op(lambda g, ctx, x, y: g.ggml_mul_mat(ctx, x, y), [a, b], exact=True)
    from tests.support.graphs import values
    assert values(ours)[0, 0].tolist() == [[60, 55, 50, 110], [90, 54, 54, 126], [42, 29, 28, 64]]


@pytest.mark.parametrize("k", [1, 3, 4, 5, 7, 8, 13, 16, 31, 32, 33, 45, 64, 100, 384])
def test_mul_mat_f32_is_bit_exact(k):
    """Small F32 products follow ggml_vec_dot_f32's lanes, fmas and leftover handling exactly."""
    check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
             [Leaf(F32, (k, 9, 2)), Leaf(F32, (k, 5, 4))], 3, exact=True, seed=k)


@pytest.mark.parametrize("wtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_float_decoding_products_are_bit_exact(wtype, n_threads):
    """A model's token-by-token products (at most 8 activation rows) by float weights of any
    row length (2816: a feed-forward's down projection) and many rows: ggml's vec_dot (and for 2
    to 8 rows of F32, nothing else) bit for bit."""
    for ne_a, ne_b in [((2816, 40), (2816, 1)), ((4100, 12), (4100, 3)), ((1536, 300), (1536, 8))]:
        check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
                 [Leaf(wtype, ne_a), Leaf(F32, ne_b)], n_threads, exact=True, seed=ne_a[0])


@pytest.mark.parametrize("k", [1, 5, 8, 31, 32, 33, 45, 64, 100, 384])
def test_mul_mat_f16_is_bit_exact(k):
    """Small F16 products (src1 converted to F16, or F16 already) follow ggml_vec_dot_f16
    exactly: the F32 lanes over widened halves, the leftovers in double."""
    check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
             [Leaf(F16, (k, 9, 2)), Leaf(F32, (k, 5, 4))], 3, exact=True, seed=k)
    check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
             [Leaf(F16, (k, 7)), Leaf(F16, (k, 3))], 2, exact=True, seed=k + 1)


@pytest.mark.parametrize("n_threads", [1, 3])
@pytest.mark.parametrize("k", [1, 5, 8, 31, 32, 33, 45, 64, 100, 384])
def test_mul_mat_bf16_is_bit_exact(k, n_threads):
    """Small BF16 products (src1 converted to BF16 as ggml_cpu_fp32_to_bf16 rounds, or BF16
    already) follow ggml_vec_dot_bf16 exactly: 4 accumulators of 8 lanes over widened bf16,
    their own reduction, the leftovers in double."""
    check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
             [Leaf(BF16, (k, 9, 2)), Leaf(F32, (k, 5, 4))], n_threads, exact=True, seed=k)
    check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
             [Leaf(BF16, (k, 7)), Leaf(BF16, (k, 3))], n_threads, exact=True, seed=k + 1)


def test_mul_mat_bf16_fuses_as_the_oracle():
    """ggml_vec_dot_bf16 writes a mul and an add; gcc fuses them into one fma. A product is exact
    in float, so only one that overflows tells: 2^64 · 2^64 added to -1.5 · 2^127 is 2^126
    fused, inf apart."""
    w = np.zeros((2, 64), np.float32)
    w[:, 0], w[:, 32] = -2.0 ** 127, 2.0 ** 64
    x = np.zeros((1, 64), np.float32)
    x[0, 0], x[0, 32] = 1.5, 2.0 ** 64
    ours, _ = check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
                       [Leaf(BF16, (64, 2), values=w), Leaf(F32, (64, 1), values=x)], 1,
                       exact=True)
    from tests.support.graphs import values
    assert values(ours).ravel().tolist() == [2.0 ** 126] * 2


# (weights, src1) shapes: llama.cpp's build sends the first three to tinyBLAS (two or more src1
# rows, k a multiple of 8, rows a multiple of 4), the others to ggml_vec_dot_bf16
LLAMAFILE_CASES = [((64, 32), (64, 7)), ((256, 16, 2), (256, 5, 4)), ((40, 12), (40, 3)),
                   ((36, 12), (36, 3)), ((64, 30), (64, 3)), ((100, 32), (100, 1))]


def test_mul_mat_bf16_in_llama_cpps_build(tmp_path):
    """BF16 weights by F32 src1 (converted to BF16) and by BF16 src1, computed by llama.cpp's own
    ggml (GGML_USE_LLAMAFILE) and by the engine planned as that build: the same bits, whether
    tinyBLAS or ggml_vec_dot_bf16 takes the product, with 1 and 3 threads, on the engine's
    prepared path (unwatched) and on its general one (watched, thread by thread)."""
    from engine.core.types import fp32_to_bf16_bits
    from tests.support.llamacpp_ggml import MulMat, mul_mat_many

    rng = np.random.default_rng(8)
    jobs = []
    for ne_w, ne_x in LLAMAFILE_CASES:
        w = fp32_to_bf16_bits(rng.uniform(-1, 1, tuple(reversed(ne_w))).astype(np.float32))
        x = rng.uniform(-1, 1, tuple(reversed(ne_x))).astype(np.float32)
        for n_threads in (1, 3):
            jobs.append(MulMat(int(BF16), w.view(np.uint8), ne_w, x, n_threads))
            jobs.append(MulMat(int(BF16), w.view(np.uint8), ne_w, fp32_to_bf16_bits(x),
                               n_threads, int(BF16)))
    for job, theirs in zip(jobs, mul_mat_many(jobs, tmp_path)):
        for watched in (False, True):
            ours = _llamafile_mul_mat(job, watched)
            np.testing.assert_array_equal(
                ours.view(np.uint32), theirs.view(np.uint32),
                err_msg=f"{job.ne_w} x {job.x.shape} src1 type {job.xtype}, {job.n_threads} "
                        f"threads, watched={watched}")


def _llamafile_mul_mat(job, watched: bool) -> np.ndarray:
    """The engine's ggml_mul_mat of a job, planned as llama.cpp's build plans it."""
    from engine.compute.plan import llamafile_build
    from tests.support.llamacpp_ggml import engine_product

    return engine_product(job, watched, llamafile_build())


@pytest.mark.parametrize("wtype", [GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q4_K, GGMLType.Q6_K])
@pytest.mark.parametrize("n_threads", [1, 3])
def test_mul_mat_quantized_is_bit_exact(wtype, n_threads):
    """Q4_0/Q5_0 with Q8_0 activations and Q4_K/Q6_K with Q8_K ones follow ggml's AVX2 vec_dot:
    the same integer lanes, fmas per block and horizontal sums."""
    for ne_a, ne_b in [((256, 5), (256, 3)), ((512, 40), (512, 7)), ((1024, 9, 2), (1024, 4, 2)),
                       ((4096, 3), (4096, 1))]:
        check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
                 [Leaf(wtype, ne_a), Leaf(F32, ne_b)], n_threads, exact=True, seed=ne_a[0])


def test_quantized_decode_of_a_large_matrix_is_bit_exact():
    """One activation row against a matrix past EXACT_MACS (a model's output projection) still
    takes the exact path."""
    check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
             [Leaf(GGMLType.Q8_0, (640, 60000)), Leaf(F32, (640, 1))], 2, exact=True)


@pytest.mark.parametrize("n_threads", [1, 4])
def test_mul_mat_q8_0_is_bit_exact(n_threads):
    """Q8_0 weights with Q8_0 activations follow ggml_vec_dot_q8_0_q8_0 (AVX2) exactly."""
    from engine.core.types import GGMLType

    # the last pair makes the emulation split 300 weight rows into units of 131 (EXACT_UNIT_PAIRS)
    for ne_a, ne_b in [((64, 33), (64, 7)), ((384, 40), (384, 13)), ((1536, 24), (1536, 5)),
                       ((32, 300), (32, 1000))]:
        check_op(lambda g, ctx, a, b: g.ggml_mul_mat(ctx, a, b),
                 [Leaf(GGMLType.Q8_0, ne_a), Leaf(F32, ne_b)], n_threads, exact=True)


def test_changed_weights_are_followed():
    """A write to the weights (same tensor, other bytes) between two computes: the second result
    is the new weights' (nothing derived from the first bytes is kept)."""
    import numpy as np

    from engine import ggml as eng
    from tests.support.graphs import leaf_bytes

    rng = np.random.default_rng(3)
    first, second = (leaf_bytes(Leaf(GGMLType.Q4_K, (512, 6)), rng) for _ in range(2))
    xs = rng.standard_normal((2, 512)).astype(np.float32)

    def product(weights: bytes):
        ctx = eng.ggml_init(eng.ggml_init_params(1 << 22))
        w = eng.ggml_new_tensor_2d(ctx, GGMLType.Q4_K, 512, 6)
        x = eng.ggml_new_tensor_2d(ctx, GGMLType.F32, 512, 2)
        eng.data_bytes(w)[:] = np.frombuffer(weights, np.uint8)
        eng.set_data(x, xs)
        gf = eng.ggml_new_graph(ctx)
        out = eng.ggml_mul_mat(ctx, w, x)
        eng.ggml_build_forward_expand(gf, out)
        return ctx, gf, w, out

    ctx, gf, w, out = product(first)
    eng.ggml_graph_compute_with_ctx(ctx, gf, 2)
    before = eng.to_numpy(out).copy()
    eng.data_bytes(w)[:] = np.frombuffer(second, np.uint8)  # same tensor, new weights
    eng.ggml_graph_compute_with_ctx(ctx, gf, 2)
    ctx2, gf2, _, out2 = product(second)
    eng.ggml_graph_compute_with_ctx(ctx2, gf2, 1)
    assert not np.array_equal(before, eng.to_numpy(out))
    np.testing.assert_array_equal(eng.to_numpy(out), eng.to_numpy(out2))


@pytest.mark.parametrize("wtype", [GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.IQ4_NL,
                                   GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.IQ4_XS, GGMLType.Q4_K,
                                   GGMLType.Q6_K, GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ2_S,
                                   GGMLType.TQ2_0, GGMLType.TQ1_0, GGMLType.MXFP4, GGMLType.IQ1_M],
                         ids=lambda t: t.name)
def test_quant_dot_equals_ggml_vec_dot_on_any_bytes(wtype):
    """engine._lanes.quant_dot against the oracle's own vec_dot (its CPU type traits), on weight
    rows of random bytes (every quant value, the scales normal halves) and on rows of extremes,
    with the vector instructions (AVX-512 VNNI's where the CPU has them, and AVX2's), with the
    portable loop, all activation rows at once (Q4_0, Q5_0 and Q8_0 by tiles) and one at a time:
    the same bits. Rows of 32-element blocks have an odd count (IQ4_NL's last one is ggml's
    scalar loop); two more activation rows hold quants of -128, which no quantizer writes, where
    ggml's sign trick (mul_sum_i8_pairs_float, mul_add_epi8) wraps."""
    import ctypes

    import ggml
    import numpy as np

    from engine.compute.kernels.vecdot import vec_dot_quant
    from engine.quants import QUANT_KINDS, from_float
    from engine.core.types import TYPE_TRAITS

    rng = np.random.default_rng(int(wtype))
    ts = TYPE_TRAITS[wtype]
    k = 1024 if ts.blck_size > 32 else 1056
    row = k // ts.blck_size * ts.type_size
    w = rng.integers(0, 256, (40, row), dtype=np.uint8)
    w[-2], w[-1] = 0x00, 0xFF  # extremes: all bits clear, all set (the integer scales too)
    blocks = w.reshape(-1).view(QUANT_KINDS[wtype].dtype)
    for field in ("d", "dmin"):
        if field in blocks.dtype.names:
            blocks[field] = rng.standard_normal(len(blocks)).astype(np.float16).view(np.uint16)
    if "e" in blocks.dtype.names:  # MXFP4's E8M0 exponent: scales of 2^-10 .. 2^10
        blocks["e"] = rng.integers(118, 139, len(blocks))
    if wtype == GGMLType.IQ1_M:  # its d, a normal half, in the top nibbles of the 4 scale words
        d = rng.standard_normal(len(blocks)).astype(np.float16).view(np.uint16)
        words = blocks["scales"].copy().view("<u2")
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | ((d >> (4 * i)) & 0x0F) << 12
        blocks["scales"] = words.view(np.uint8)
    vdt = ts.vec_dot_type
    x = from_float(vdt, (rng.standard_normal((3, k)) * 4).astype(np.float32)).view(np.uint8).reshape(3, -1)
    at = 4 if vdt == GGMLType.Q8_K else 2  # where a block's quants start
    loud = x[:1].reshape(k // TYPE_TRAITS[vdt].blck_size, -1).copy()
    loud[:, at:at + TYPE_TRAITS[vdt].blck_size] = 127  # the largest products: each fma rounds
    x = np.concatenate([x, loud.reshape(1, -1)])
    blocks = x[:2].reshape(2, k // TYPE_TRAITS[vdt].blck_size, -1).copy()
    q = blocks[:, :, at:at + TYPE_TRAITS[vdt].blck_size]
    q[rng.random(q.shape) < 0.2] = 0x80
    x = np.concatenate([x, blocks.reshape(2, -1)])
    ggml.ggml_cpu_init()  # the fp16 tables vec_dot reads
    traits = ggml.ggml_get_type_traits_cpu(int(wtype)).contents
    real = np.empty((len(x), len(w)), np.float32)
    s = ctypes.c_float()
    for i1 in range(len(x)):
        for i0 in range(len(w)):
            traits.vec_dot(k, ctypes.byref(s), 0, w[i0].ctypes.data, 0, x[i1].ctypes.data, 0, 1)
            real[i1, i0] = s.value
    for portable in (0, 1, 2):
        ours = vec_dot_quant(wtype, w, x, portable=portable)
        np.testing.assert_array_equal(ours.view(np.uint32), real.view(np.uint32), err_msg=f"portable={portable}")
        for i1 in range(len(x)):
            one = vec_dot_quant(wtype, w, x[i1:i1 + 1], portable=portable)
            np.testing.assert_array_equal(one[0].view(np.uint32), real[i1].view(np.uint32),
                                          err_msg=f"portable={portable}, row {i1} alone")
        # enough rows to be shared out between threads in C: still the oracle's bits, row by row
        many = vec_dot_quant(wtype, np.tile(w, (256, 1)), x, portable=portable, threads=3)
        np.testing.assert_array_equal(many.view(np.uint32), np.tile(real, (1, 256)).view(np.uint32),
                                      err_msg=f"threads=3, portable={portable}")


@pytest.mark.parametrize("wtype", [GGMLType.IQ4_NL, GGMLType.MXFP4], ids=lambda t: t.name)
def test_quant_dot_last_block_is_fused_as_in_ggml(wtype):
    """An odd last block of IQ4_NL or MXFP4 goes through ggml's scalar loop, sumf += d * sum,
    which the oracle fuses (vfmadd231ss): against its vec_dot on products that float cannot hold
    (activation quants of 127, their d halves of 11 significant bits, weight blocks alternating
    in sign, so that the sum before the last block is small), both C paths and the twin."""
    import ctypes

    import ggml
    import numpy as np

    from engine.compute.kernels.vecdot import quant_dot, vec_dot_quant
    from engine.quants import QUANT_KINDS

    rng = np.random.default_rng(int(wtype) + 100)
    nb, n0, n1 = 9, 48, 4
    pos, neg = (7, 15) if wtype == GGMLType.MXFP4 else (15, 0)  # a large value of each sign
    nib = np.where(np.arange(nb)[:, None] % 2 == 0, pos, neg) * np.ones((n0, nb, 32), np.uint8)
    odd = rng.random(nib.shape) < 0.2
    nib[odd] = rng.integers(0, 16, odd.sum())
    w = np.zeros((n0, nb, 18 if wtype == GGMLType.IQ4_NL else 17), np.uint8)
    w[:, :, -16:] = nib[..., :16] | nib[..., 16:] << 4
    blocks = w.reshape(-1).view(QUANT_KINDS[wtype].dtype)
    if wtype == GGMLType.MXFP4:
        blocks["e"] = rng.integers(120, 137, len(blocks))
    else:
        blocks["d"] = rng.integers(0x2000, 0x3000, len(blocks)) | 1
    x = np.full((n1, nb, 34), 127, np.uint8)
    d = (rng.integers(0x1000, 0x2000, (n1, nb)) | 1).astype("<u2")  # halves with odd mantissas
    x[:, :, :2] = d[..., None].view(np.uint8)
    w, x = w.reshape(n0, -1), x.reshape(n1, -1)
    ggml.ggml_cpu_init()
    traits = ggml.ggml_get_type_traits_cpu(int(wtype)).contents
    real = np.empty((n1, n0), np.float32)
    s = ctypes.c_float()
    for i1 in range(n1):
        for i0 in range(n0):
            traits.vec_dot(nb * 32, ctypes.byref(s), 0, w[i0].ctypes.data, 0, x[i1].ctypes.data, 0,
                           1)
            real[i1, i0] = s.value
    for portable in (False, True):
        ours = vec_dot_quant(wtype, w, x, portable=portable)
        np.testing.assert_array_equal(ours.view(np.uint32), real.view(np.uint32),
                                      err_msg=f"portable={portable}")
    twin = np.empty((n1, n0), np.float32)
    quant_dot(int(wtype), w, w.shape[1], x, x.shape[1], twin, n0, n1, nb)
    np.testing.assert_array_equal(twin.view(np.uint32), real.view(np.uint32), err_msg="twin")
