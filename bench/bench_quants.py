"""Quantized types: dequantize throughput (vs gguf-py and ggml's to_float) and quantized mul_mat
(both engines computing a one-node graph with 2 threads), and Gemma's Q8_0 output matrix by one
row at 1 and 2 threads."""

from __future__ import annotations

import ctypes

import ggml
import gguf
import numpy as np

from bench.bench_compute import Graphs
from bench.common import best_time
from engine.quants import QUANT_KINDS, dequantize
from engine.core.types import GGMLType as T, traits

N_DEQ = 1 << 20  # elements per dequantize call
MM_K, MM_N0, MM_THREADS = 4096, 4096, 2
MM_TYPES = (T.Q4_0, T.Q4_1, T.Q5_1, T.Q8_0, T.IQ4_NL, T.Q2_K, T.Q3_K, T.IQ4_XS, T.Q4_K,
            T.Q5_K, T.Q6_K, T.IQ3_XXS, T.IQ3_S, T.IQ2_S, T.TQ2_0, T.TQ1_0, T.MXFP4,
            T.IQ1_M)  # mul_mat's weights
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
    """Both engines compute the same one-node graph with the same thread count."""
    rng = np.random.default_rng(1)
    for t in MM_TYPES:
        w = _weights(t, MM_K * MM_N0, rng).reshape(MM_N0, -1)
        for n1 in (1, 32):
            x = rng.standard_normal((n1, MM_K)).astype(np.float32)
            g = Graphs(lambda api, ctx, a, b: api.ggml_mul_mat(ctx, a, b),
                       w.nbytes + x.nbytes * 2 + (64 << 20), [(int(t), (MM_K, MM_N0), w), x])
            ours = best_time(lambda: g.ours(MM_THREADS), repeat=3, min_time=0.0)
            theirs = best_time(lambda: g.theirs(MM_THREADS), repeat=3)
            g.close()
            report(f"mul_mat {t.name} {MM_N0}x{MM_K} by {MM_K}x{n1}, {MM_THREADS} thr",
                   ours, theirs)


def _bench_head(report) -> None:
    """A decoding step's largest product: Gemma 3 270M's tied output matrix, 262,144 rows of 640
    Q8_0 weights (178 MB, read from memory), by one activation row, 1 and 2 threads."""
    rng = np.random.default_rng(2)
    k, n0 = 640, 262144
    w = rng.integers(-127, 128, (n0 * k // 32, 34), dtype=np.int8).view(np.uint8)
    w[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)  # each block's scale
    x = rng.standard_normal((1, k)).astype(np.float32)
    g = Graphs(lambda api, ctx, a, b: api.ggml_mul_mat(ctx, a, b), w.nbytes + (64 << 20),
               [(int(T.Q8_0), (k, n0), w.reshape(-1)), x])
    for n_threads in (1, 2):
        ours = best_time(lambda: g.ours(n_threads), repeat=3, min_time=0.0)
        theirs = best_time(lambda: g.theirs(n_threads), repeat=3)
        report(f"mul_mat Q8_0 {n0}x{k} by {k}x1 (Gemma's output matrix), {n_threads} thr", ours,
               theirs)
    g.close()


def run(report) -> None:
    _bench_dequantize(report)
    _bench_mul_mat(report)
    _bench_head(report)
