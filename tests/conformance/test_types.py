"""Types, enums, fp16/bf16 conversion, shape queries and element access against real ggml."""

from __future__ import annotations

import ctypes

import ggml as real
import numpy as np
import pytest

from engine import ggml as eng
from engine.core.optable import GGML_GLU_OP_COUNT, GGML_OP_COUNT, GGML_UNARY_OP_COUNT, OP_TABLE, \
    GLU_OPS, UNARY_OPS
from engine.core.types import GGML_TYPE_COUNT, TYPE_TRAITS, GGMLType, bf16_bits_to_fp32, \
    fp16_bits_to_fp32, fp32_to_bf16_bits, fp32_to_fp16_bits

F32P = ctypes.POINTER(ctypes.c_float)


def test_type_traits_table():
    assert GGML_TYPE_COUNT == real.GGML_TYPE_COUNT
    for tr in TYPE_TRAITS:
        theirs = real.ggml_get_type_traits(int(tr.type)).contents
        assert (tr.type_name, tr.blck_size, tr.type_size, tr.is_quantized) == \
            (theirs.type_name.decode(), theirs.blck_size, theirs.type_size, theirs.is_quantized)
        assert eng.ggml_type_name(tr.type) == real.ggml_type_name(int(tr.type)).decode()
        name = f"GGML_TYPE_{tr.type.name}"
        if hasattr(real, name):
            assert getattr(real, name) == tr.type


def test_vec_dot_types():
    for tr in TYPE_TRAITS:
        if tr.vec_dot_type is not None and tr.type != GGMLType.Q8_1:
            assert real.ggml_get_type_traits_cpu(int(tr.type)).contents.vec_dot_type == tr.vec_dot_type


def test_op_enums():
    assert (GGML_OP_COUNT, GGML_UNARY_OP_COUNT, GGML_GLU_OP_COUNT) == \
        (real.GGML_OP_COUNT, real.GGML_UNARY_OP_COUNT, real.GGML_GLU_OP_COUNT)
    for i, (name, symbol) in enumerate(OP_TABLE):
        assert real.ggml_op_name(i).decode() == name == eng.ggml_op_name(i)
        assert real.ggml_op_symbol(i).decode() == symbol == eng.ggml_op_symbol(i)
        assert getattr(real, f"GGML_OP_{name}") == i == getattr(eng, f"GGML_OP_{name}")
    for i, name in enumerate(UNARY_OPS):
        assert real.ggml_unary_op_name(i).decode() == name
        assert getattr(real, f"GGML_UNARY_OP_{name}") == i
    for i, name in enumerate(GLU_OPS):
        assert real.ggml_glu_op_name(i).decode() == name
        assert getattr(real, f"GGML_GLU_OP_{name}") == i


def test_overheads():
    assert eng.ggml_tensor_overhead() == real.ggml_tensor_overhead()


# --- fp16 / bf16 -----------------------------------------------------------------------------

def _interesting_floats() -> np.ndarray:
    rng = np.random.default_rng(1234)
    bits = rng.integers(0, 2**32, size=700_000, dtype=np.uint64).astype(np.uint32)
    # every fp16 value, and the midpoints between neighbours (exact ties), as floats
    h = np.arange(0x7C00, dtype=np.uint32)
    f = fp16_bits_to_fp32(h.astype(np.uint16)).astype(np.float64)
    mid = ((f[:-1] + f[1:]) / 2).astype(np.float32)
    ties_neg = -mid
    # bf16 ties: low 16 bits exactly 0x8000
    bf_ties = (rng.integers(0, 2**16, size=50_000, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 65504, 65519.99, 65520,
                        1e-45, -1e-45, 6e-8, 3e-8, 2.98e-8, 1e-38, 3.4e38], dtype=np.float32)
    snan = np.array([0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7FC00001], dtype=np.uint32).view(np.float32)
    normal = (rng.standard_normal(200_000) * 1000).astype(np.float32)
    return np.concatenate([bits.view(np.float32), mid, ties_neg, bf_ties.view(np.float32),
                           special, snan, normal])


def test_fp32_to_fp16_and_bf16_million_values():
    x = _interesting_floats()
    assert x.size >= 1_000_000
    n = x.size
    out = np.zeros(n, dtype=np.uint16)
    real.ggml_fp32_to_fp16_row(x.ctypes.data_as(F32P), out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)), n)
    np.testing.assert_array_equal(fp32_to_fp16_bits(x), out)
    real.ggml_fp32_to_bf16_row(x.ctypes.data_as(F32P), ctypes.cast(out.ctypes.data, ctypes.POINTER(real.ggml_bf16_t)),
                               n)
    np.testing.assert_array_equal(fp32_to_bf16_bits(x), out)


def test_fp16_and_bf16_to_fp32_every_code():
    h = np.arange(65536, dtype=np.uint16)
    out = np.zeros(65536, dtype=np.float32)
    real.ggml_fp16_to_fp32_row(h.ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)), out.ctypes.data_as(F32P), 65536)
    np.testing.assert_array_equal(fp16_bits_to_fp32(h).view(np.uint32), out.view(np.uint32))
    real.ggml_bf16_to_fp32_row(ctypes.cast(h.ctypes.data, ctypes.POINTER(real.ggml_bf16_t)), out.ctypes.data_as(F32P),
                               65536)
    np.testing.assert_array_equal(bf16_bits_to_fp32(h).view(np.uint32), out.view(np.uint32))


# --- shape queries on many tensors -----------------------------------------------------------

def _tensor_zoo(g, ctx):
    """Build the same assortment of tensors and views with either API."""
    F32, F16, Q4_0, Q4_K = (int(GGMLType.F32), int(GGMLType.F16), int(GGMLType.Q4_0),
                            int(GGMLType.Q4_K))
    a = g.ggml_new_tensor_4d(ctx, F32, 4, 3, 2, 5)
    q = g.ggml_new_tensor_2d(ctx, Q4_0, 64, 6)
    k = g.ggml_new_tensor_2d(ctx, Q4_K, 512, 3)
    h = g.ggml_new_tensor_3d(ctx, F16, 6, 1, 4)
    zoo = [a, q, k, h, g.ggml_new_tensor_1d(ctx, F32, 1), g.ggml_new_tensor_2d(ctx, F32, 0, 3)]
    for axes in [(1, 0, 2, 3), (0, 2, 1, 3), (3, 2, 1, 0), (0, 1, 3, 2)]:
        zoo.append(g.ggml_permute(ctx, a, *axes))
    zoo += [g.ggml_transpose(ctx, q), g.ggml_view_2d(ctx, a, 2, 3, 16, 8),
            g.ggml_view_3d(ctx, a, 4, 3, 2, 16, 96, 0), g.ggml_view_1d(ctx, k, 256, 144),
            g.ggml_permute(ctx, h, 0, 2, 1, 3), g.ggml_view_4d(ctx, a, 4, 1, 2, 5, 16, 48, 96, 0)]
    return zoo


QUERIES = ["ggml_nelements", "ggml_nrows", "ggml_nbytes", "ggml_nbytes_pad", "ggml_n_dims",
           "ggml_element_size", "ggml_is_contiguous", "ggml_is_contiguous_0", "ggml_is_contiguous_1",
           "ggml_is_contiguous_2", "ggml_is_contiguously_allocated", "ggml_is_contiguous_channels",
           "ggml_is_contiguous_rows", "ggml_is_transposed", "ggml_is_permuted", "ggml_is_empty",
           "ggml_is_scalar", "ggml_is_vector", "ggml_is_matrix", "ggml_is_3d"]
PAIR_QUERIES = ["ggml_are_same_shape", "ggml_are_same_stride", "ggml_can_repeat"]


def test_shape_queries():
    rctx = real.ggml_init(real.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=True))
    try:
        ectx = eng.ggml_init(eng.ggml_init_params(1 << 20, no_alloc=True))
        ours, theirs = _tensor_zoo(eng, ectx), _tensor_zoo(real, rctx)
        for q in QUERIES:
            assert [getattr(eng, q)(t) for t in ours] == [getattr(real, q)(t) for t in theirs], q
        for q in PAIR_QUERIES:
            mine = [getattr(eng, q)(x, y) for x in ours for y in ours]
            assert mine == [getattr(real, q)(x, y) for x in theirs for y in theirs], q
        for tr in TYPE_TRAITS:
            if not tr.removed:
                n = tr.blck_size * 7
                assert eng.ggml_row_size(tr.type, n) == real.ggml_row_size(int(tr.type), n)
        assert eng.ggml_get_max_tensor_size(ectx) == real.ggml_get_max_tensor_size(rctx)
    finally:
        real.ggml_free(rctx)


# --- element access --------------------------------------------------------------------------

@pytest.mark.parametrize("type_", [GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32,
                                   GGMLType.I16, GGMLType.I8])
def test_element_access(type_):
    real.ggml_cpu_init()  # builds the CPU's fp16 tables that ggml_get_f32_1d reads
    rctx = real.ggml_init(real.ggml_init_params(mem_size=1 << 16, mem_buffer=None, no_alloc=False))
    try:
        ectx = eng.ggml_init(eng.ggml_init_params(1 << 16))
        pairs = []
        for g, ctx in ((eng, ectx), (real, rctx)):
            t = g.ggml_new_tensor_2d(ctx, int(type_), 5, 3)
            p = g.ggml_transpose(ctx, t)  # non-contiguous: indices are unravelled
            g.ggml_set_f32(t, 2.7)
            g.ggml_set_f32_1d(t, 4, -1.5)
            g.ggml_set_i32_1d(t, 7, 99)
            g.ggml_set_f32_1d(p, 1, 65.25)
            g.ggml_set_i32_1d(p, 2, -3)
            values = [g.ggml_get_f32_1d(t, i) for i in range(15)]
            values += [g.ggml_get_i32_1d(p, i) for i in range(15)]
            pairs.append(values)
        assert pairs[0] == pairs[1]
        g.ggml_set_i32(t, 12)
        eng.ggml_set_i32(eng.ggml_get_first_tensor(ectx), 12)
        assert [eng.ggml_get_f32_1d(eng.ggml_get_first_tensor(ectx), i) for i in range(15)] == \
            [real.ggml_get_f32_1d(real.ggml_get_first_tensor(rctx), i) for i in range(15)]
    finally:
        real.ggml_free(rctx)


def test_to_numpy_matches_ggml_python():
    from ggml.utils import to_numpy as real_to_numpy

    rctx = real.ggml_init(real.ggml_init_params(mem_size=1 << 16, mem_buffer=None, no_alloc=False))
    try:
        ectx = eng.ggml_init(eng.ggml_init_params(1 << 16))
        for g, ctx in ((eng, ectx), (real, rctx)):
            a = g.ggml_new_tensor_3d(ctx, int(GGMLType.F32), 4, 3, 2)
            for i in range(24):
                g.ggml_set_f32_1d(a, i, float(i))
            g.ggml_permute(ctx, a, 2, 0, 1, 3)
        ours = [eng.to_numpy(t) for t in (eng.ggml_get_first_tensor(ectx),
                                          eng.ggml_get_next_tensor(ectx, eng.ggml_get_first_tensor(ectx)))]
        t0 = real.ggml_get_first_tensor(rctx)
        theirs = [real_to_numpy(t) for t in (t0, real.ggml_get_next_tensor(rctx, t0))]
        for o, t in zip(ours, theirs):
            assert o.shape == t.shape and o.strides == t.strides
            np.testing.assert_array_equal(o, t)
    finally:
        real.ggml_free(rctx)
