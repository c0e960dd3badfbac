"""mul_mat_quant against real ggml's CPU MUL_MAT (a graph computed by ggml-python)."""

from __future__ import annotations

import ctypes

import ggml
import numpy as np
import pytest

from engine.quants import QUANT_KINDS, from_float, quantize
from engine.quants.matmul import mul_mat_quant, vec_dot_ref
from engine.core.types import GGMLType as T, traits

K = 512
TYPES = [t for t, kind in QUANT_KINDS.items()
         if kind.quantize is not None and traits(t).vec_dot_type not in (None, t)]


def o_mul_mat(t: int, w: np.ndarray, k: int, x: np.ndarray, n_threads: int) -> np.ndarray:
    """ggml_mul_mat(w, x) computed by ggml: (n1, n0) float32."""
    n0, n1 = w.shape[0], x.shape[0]
    params = ggml.ggml_init_params(mem_size=w.nbytes + 4 * x.size * 2 + 4 * n0 * n1 + (16 << 20),
                                   mem_buffer=None, no_alloc=False)
    ctx = ggml.ggml_init(params)
    try:
        a = ggml.ggml_new_tensor_2d(ctx, t, k, n0)
        ctypes.memmove(ggml.ggml_get_data(a), np.ascontiguousarray(w).ctypes.data, w.nbytes)
        b = ggml.ggml_new_tensor_2d(ctx, 0, k, n1)
        x = np.ascontiguousarray(x, np.float32)
        ctypes.memmove(ggml.ggml_get_data(b), x.ctypes.data, x.nbytes)
        c = ggml.ggml_mul_mat(ctx, a, b)
        gf = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(gf, c)
        ggml.ggml_graph_compute_with_ctx(ctx, gf, n_threads)
        ptr = ctypes.cast(ggml.ggml_get_data(c), ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(ptr, shape=(n1, n0)).copy()
    finally:
        ggml.ggml_free(ctx)


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sum((a.astype(np.float64) - b) ** 2) / np.sum(b.astype(np.float64) ** 2))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_mul_mat_quant_matches_ggml_graph(t):
    rng = np.random.default_rng(int(t))
    w = quantize(t, rng.standard_normal((48, K)).astype(np.float32))
    for n1 in (1, 32):
        x = rng.standard_normal((n1, K)).astype(np.float32)
        ours = mul_mat_quant(t, w, from_float(traits(t).vec_dot_type, x), K)
        for n_threads in (1, 2):
            # the required bound is 5e-4; only the float summation order differs (~1e-13)
            assert nmse(ours, o_mul_mat(t, w, K, x, n_threads)) <= 1e-8, (n1, n_threads)


def _random_grid_weights(t: T, rng: np.random.Generator, n0: int) -> np.ndarray:
    """Random block bytes for a type we cannot quantize, with a sane fp16 super-scale."""
    kind = QUANT_KINDS[t]
    raw = rng.integers(0, 256, (n0 * K // 256) * kind.dtype.itemsize, dtype=np.uint8)
    b = raw.view(kind.dtype)
    scale = np.float16(0.01).view(np.uint16)
    if "d" in kind.dtype.names:
        b["d"] = scale
    else:  # IQ1_M: the fp16 scale lives in the top nibble of each uint16 scale word
        sc = b["scales"].view("<u2")
        sc &= 0x0FFF
        sc |= ((int(scale) >> (4 * np.arange(4))) & 0xF).astype(np.uint16) << 12
    return raw.reshape(n0, -1)


@pytest.mark.parametrize("t", [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S,
                               T.IQ1_M], ids=lambda t: t.name)
def test_mul_mat_quant_grid_types_match_ggml_graph(t):
    rng = np.random.default_rng(int(t))
    w = _random_grid_weights(t, rng, 16)
    for n1 in (1, 32):
        x = rng.standard_normal((n1, K)).astype(np.float32)
        ours = mul_mat_quant(t, w, from_float(T.Q8_K, x), K)
        assert nmse(ours, o_mul_mat(t, w, K, x, 2)) <= 1e-8, n1


@pytest.mark.parametrize("t", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_vec_dot_ref_agrees_with_mul_mat_quant(t):
    rng = np.random.default_rng(7)
    w = quantize(t, rng.standard_normal((3, K)).astype(np.float32))
    act = from_float(traits(t).vec_dot_type, rng.standard_normal((2, K)).astype(np.float32))
    fast = mul_mat_quant(t, w, act, K)
    for i1 in range(2):
        for i0 in range(3):
            assert vec_dot_ref(t, w[i0], act[i1], K) == pytest.approx(fast[i1, i0], rel=1e-5)


def test_mul_mat_quant_rejects_types_without_vec_dot():
    with pytest.raises(ValueError, match="q8_K"):
        mul_mat_quant(T.Q8_K, np.zeros((1, 292), np.uint8), np.zeros((1, 292), np.uint8), 256)
