"""Quantized types: dequantize throughput (vs gguf-py and ggml's to_float) and quantized mul_mat
(vs ggml's CPU graph compute, 2 threads)."""

from __future__ import annotations

import ctypes

import ggml
import gguf
import numpy as np

from bench.common import best_time
from engine.quants import QUANT_KINDS, dequantize, from_float
from engine.quants.matmul import mul_mat_quant
from engine.types import GGMLType as T, traits

N_DEQ = 1 << 20  # elements per dequantize call
MM_K, MM_N0 = 4096, 4096
FLOAT_P = ctypes.POINTER(ctypes.c_float)


def _weights(t: T, n: int, rng: np.random.Generator) -> np.ndarray:
    """n elements of type t: quantized from normals, or random block bytes for the grid types."""
    kind = QUANT_KINDS[t]
    if kind.quantize is not None:  # ggml quantizes the big inputs faster; the bytes are the same
        x = rng.standard_normal(n).astype(np.float32)
        dst = np.zeros(n // traits(t).blck_size * traits(t).type_size, np.uint8)
        ggml.ggml_quantize_chunk(t, x.ctypes.data_as(FLOAT_P), dst.ctypes.data, 0, n // 4096,
                                 4096, None)
        return dst
    raw = rng.integers(0, 256, n // traits(t).blck_size * traits(t).type_size, dtype=np.uint8)
    if "d" in kind.dtype.names:
        raw.view(kind.dtype)["d"] = np.float16(0.01).view(np.uint16)
    return raw


def _bench_dequantize(report) -> None:
    rng = np.random.default_rng(0)
    for t, kind in QUANT_KINDS.items():
        if kind.dequantize is None or t == T.Q8_K:
            continue
        raw = _weights(t, N_DEQ, rng)
        ours = best_time(lambda: dequantize(t, raw, N_DEQ), repeat=3)
        qt = gguf.GGMLQuantizationType(int(t))
        try:
            gguf.quants.dequantize(raw, qt)
            theirs = best_time(lambda: gguf.quants.dequantize(raw, qt), repeat=3)
        except NotImplementedError:  # gguf-py has no dequantizer for this type
            theirs = None
        report(f"dequantize {t.name} 1M", ours, theirs, "gguf-py")
        out = np.empty(N_DEQ, np.float32)
        to_float = ggml.ggml_get_type_traits(t).contents.to_float
        c = best_time(lambda: to_float(raw.ctypes.data, out.ctypes.data_as(FLOAT_P), N_DEQ),
                      repeat=3)
        report(f"dequantize {t.name} 1M", ours, c, "ggml to_float")


def _bench_mul_mat(report) -> None:
    rng = np.random.default_rng(1)
    for t in (T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K):
        w = _weights(t, MM_K * MM_N0, rng).reshape(MM_N0, -1)
        for n1 in (1, 32):
            x = rng.standard_normal((n1, MM_K)).astype(np.float32)
            vdt = traits(t).vec_dot_type
            ours = best_time(lambda: mul_mat_quant(t, w, from_float(vdt, x), MM_K),
                             repeat=3, min_time=0.0)
            params = ggml.ggml_init_params(mem_size=w.nbytes + x.nbytes * 2 + (64 << 20),
                                           mem_buffer=None, no_alloc=False)
            ctx = ggml.ggml_init(params)
            a = ggml.ggml_new_tensor_2d(ctx, t, MM_K, MM_N0)
            ctypes.memmove(ggml.ggml_get_data(a), w.ctypes.data, w.nbytes)
            b = ggml.ggml_new_tensor_2d(ctx, 0, MM_K, n1)
            ctypes.memmove(ggml.ggml_get_data(b), x.ctypes.data, x.nbytes)
            gf = ggml.ggml_new_graph(ctx)
            ggml.ggml_build_forward_expand(gf, ggml.ggml_mul_mat(ctx, a, b))
            theirs = best_time(lambda: ggml.ggml_graph_compute_with_ctx(ctx, gf, 2), repeat=3)
            ggml.ggml_free(ctx)
            report(f"mul_mat {t.name} {MM_N0}x{MM_K} by {MM_K}x{n1}", ours, theirs, "ggml 2 thr")


def run(report) -> None:
    _bench_dequantize(report)
    _bench_mul_mat(report)
