"""ggml's CPU dot products, reproduced operation by operation (AVX2 build): F32, F16, and the
quantized Q4_0, Q5_0, Q8_0 (with Q8_0 activations), Q4_K and Q6_K (with Q8_K activations).

Each output of mul_mat is one `ggml_vec_dot_*` call, and these emulate that call's arithmetic for
whole tiles at once: the same lanes, the same fused multiply-adds, the same horizontal sums. Their
results equal real ggml's bit for bit (tested), where a BLAS product only agrees to rounding.
They cost more than BLAS, so mul_mat uses them for products up to EXACT_MACS multiply-adds with
rows of at most 1024 (F32, F16) or 4096 (quantized) elements; larger products use BLAS, within
rounding.

- ggml_vec_dot_f32: 4 accumulators of 8 lanes over steps of 32, fma per lane, reduced pairwise,
  then the leftover elements as gcc's code does them (vector products summed in order, the last
  few by fma).
- ggml_vec_dot_f16: the same lanes over halves widened to float (F16C); the leftovers each
  rounded to float and summed in double.
- ggml_vec_dot_q{4,5,8}_0_q8_0: per block, 8 lanes each summing 4 int8 products (exact
  integers), times d = d_x*d_y by fma into 8 lane accumulators; hsum_float_8 at the end.
- ggml_vec_dot_q4_K_q8_K, ggml_vec_dot_q6_K_q8_K: per super-block, 8 integer lanes of scaled
  products (and 4 lanes of mins for Q4_K), then the same fma and horizontal sums.
"""

from __future__ import annotations

import numpy as np

from engine import _lanes as _lanes_c
from engine.types import GGMLType, TYPE_TRAITS

F32, F64 = np.float32, np.float64
EXACT_MACS = 1 << 25  # mul_mats up to this many multiply-adds follow ggml's vec_dot exactly


def _hsum8(acc: np.ndarray) -> np.ndarray:
    """hsum_float_8: (hi + lo), then (r0 + r2) + (r1 + r3)."""
    r = acc[..., 4:] + acc[..., :4]
    return (r[..., 0] + r[..., 2]) + (r[..., 1] + r[..., 3])


def vec_dot_f16(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16(K, w row, x row) for every pair: w (n0, K), x (n1, K) fp16 values
    (given as float32 or float16) -> (n1, n0).

    The F16C build widens each 8 halves to floats and runs the F32 loop (GGML_F32Cx8 = the F32
    lanes, fmas and reduction); the leftovers are added in double, each product rounded to float
    first: sumf += (ggml_float)(x[i]*y[i])."""
    return _float_dot(w, x, False)


def _float_dot(w: np.ndarray, x: np.ndarray, tiny: bool) -> np.ndarray:
    """engine._lanes.float_dot: every pair's product in C, (n1, n0) float32. Half weights whose
    rows are contiguous (a KV cache's view) go as they lie: C widens them, row stride and all."""
    x = np.ascontiguousarray(x, F32)
    n0, k = w.shape
    out = np.empty((x.shape[0], n0), F32)
    if w.dtype == np.float16 and n0 and w.strides[1] == 2 and w.strides[0] % 2 == 0 \
            and w.strides[0] >= 2 * k:
        ld = w.strides[0] // 2
        span = np.lib.stride_tricks.as_strided(w.view(np.uint16)[0], shape=((n0 - 1) * ld + k,),
                                               strides=(2,))
        _lanes_c.float_dot(span, x, out, n0, x.shape[0], k, tiny, ld)
        return out
    w = np.ascontiguousarray(w, F32)
    _lanes_c.float_dot(w, x, out, n0, x.shape[0], k, tiny)
    return out


def vec_dot_f32(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32(K, w row, x row) for every pair: w (n0, K), x (n1, K) -> (n1, n0), in C
    (engine._lanes.dot_f32, without the GIL)."""
    w = np.ascontiguousarray(w, F32)
    x = np.ascontiguousarray(x, F32)
    (n0, k), n1 = w.shape, x.shape[0]
    out = np.empty((n1, n0), F32)
    _lanes_c.dot_f32(w, x, out, n0, n1, k)
    return out


def vec_dot_tinyblas(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """llamafile's tinyBLAS (AVX2, FMA) for every pair: w (n0, K), x (n1, K) float values (F32,
    or F16 widened), K a multiple of 8 -> (n1, n0). One 8-lane accumulator per output, an fma
    per 8 elements along K, then the same horizontal sum as hsum_float_8."""
    return _float_dot(w, x, True)


def vec_dot_f32_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 of each row of a with the same row of b (broadcast against each other,
    elements on the last axis): (..., K), (..., K) -> (...), in C."""
    a, b = np.broadcast_arrays(np.asarray(a, F32), np.asarray(b, F32))
    shape, k = a.shape[:-1], a.shape[-1]
    a2, b2 = (np.ascontiguousarray(v).reshape(-1, k) for v in (a, b))
    out = np.empty(a2.shape[0], F32)
    _lanes_c.dot_f32(a2, b2, out, a2.shape[0], a2.shape[0], k, True)
    return out.reshape(shape)


# --- quantized weights, their raw blocks ------------------------------------------------------

EXACT_QUANT = frozenset({GGMLType.Q4_0, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K})


def vec_dot_quant(type_: GGMLType, w: np.ndarray, x: np.ndarray, portable: bool = False,
                  threads: int = 1) -> np.ndarray:
    """ggml's AVX2 vec_dot of every weight row with every activation row, in C without the GIL
    (engine._lanes.quant_dot): w (n0, row_bytes) raw blocks of type_ (rows may lie any distance
    apart, as in a tensor's view), x (n1, row_bytes) raw blocks of its vec_dot_type -> (n1, n0).

    Legacy types (ggml_vec_dot_q{4,5,8}_0_q8_0): lane L of each block of 32 sums the products of
    elements 4L..4L+3; acc = fma(x.d*y.d, lanes, acc) per block.
    Q4_K (ggml_vec_dot_q4_K_q8_K): lane L of a super-block sums elements 4L..4L+3 of each of its
    8 runs of 32, times the runs' six-bit scales; acc = fma(y.d*x.d, lanes, acc); the mins go
    through 4 lanes, acc_m = fma(-y.d*x.dmin, sum of min*(q8 sums), acc_m), added as
    (m0 + m2) + (m1 + m3).
    Q6_K (ggml_vec_dot_q6_K_q8_K): the same lanes of sc*q (q unsigned), minus
    32*(bsums[2L]*sc[2L] + bsums[2L+1]*sc[2L+1]).
    The result is hsum_float_8(acc) (+ the mins). The lane sums are exact integers, so the
    vector instructions (where the CPU has AVX2, FMA and F16C) and the portable loop
    (`portable`, and other CPUs) give the same bits. `threads`: the weight rows shared out
    between up to that many threads in C (each output is its own row's: the same bits)."""
    ts = TYPE_TRAITS[type_]
    n0, row_bytes = w.shape
    nb = row_bytes // ts.type_size
    if n0 and not (w.strides[1] == 1 and w.strides[0] >= row_bytes):
        w = np.ascontiguousarray(w)
    ldw = w.strides[0] if n0 > 1 else row_bytes
    span = np.lib.stride_tricks.as_strided(w[0], shape=((n0 - 1) * ldw + row_bytes,), strides=(1,)) \
        if n0 else w.reshape(-1)
    x = np.ascontiguousarray(x, np.uint8)
    out = np.empty((len(x), n0), F32)
    _lanes_c.quant_dot(int(type_), span, ldw, x, x.shape[1], out, n0, len(x), nb, portable, threads)
    return out
