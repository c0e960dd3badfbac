"""ggml's CPU dot products for F32, F16 and Q8_0 rows, reproduced operation by operation (AVX2 build).

Each output of mul_mat is one `ggml_vec_dot_*` call, and these emulate that call's arithmetic for
whole tiles at once: the same lanes, the same fused multiply-adds, the same horizontal sums. Their
results equal real ggml's bit for bit (tested), where a BLAS product only agrees to rounding.
They cost more than BLAS, so mul_mat uses them for products up to EXACT_MACS multiply-adds with
rows of at most 1024 (F32, F16) or 4096 (Q8_0) elements; larger products use BLAS, within rounding.

- ggml_vec_dot_f32: 4 accumulators of 8 lanes over steps of 32, fma per lane, reduced pairwise,
  then the leftover elements as gcc's code does them (vector products summed in order, the last
  few by fma).
- ggml_vec_dot_f16: the same lanes over halves widened to float (F16C); the leftovers each
  rounded to float and summed in double.
- ggml_vec_dot_q8_0_q8_0: per block, 8 lanes each summing 4 int8 products (exact integers), times
  d = d_x*d_y by fma into 8 lane accumulators; hsum_float_8 at the end.
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels.floatmath import fmaf
from engine.quants.common import h2f

F32, F64 = np.float32, np.float64
EXACT_MACS = 1 << 25  # mul_mats up to this many multiply-adds follow ggml's vec_dot exactly


def _hsum8(acc: np.ndarray) -> np.ndarray:
    """hsum_float_8: (hi + lo), then (r0 + r2) + (r1 + r3)."""
    r = acc[..., 4:] + acc[..., :4]
    return (r[..., 0] + r[..., 2]) + (r[..., 1] + r[..., 3])


def _vector_part(a: np.ndarray, b: np.ndarray, np_: int) -> np.ndarray:
    """The SIMD loop over the first np_ elements (a multiple of 32) of rows a and b (float32,
    broadcast against each other, elements on the last axis): 4 accumulators of 8 float lanes,
    fma per lane, then GGML_F32x8_REDUCE -> the broadcast shape without the last axis."""
    shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    acc = np.zeros((4, *shape, 8), F32)
    for s in range(0, np_, 32):
        for j in range(4):
            acc[j] = fmaf(a[..., s + 8 * j:s + 8 * j + 8], b[..., s + 8 * j:s + 8 * j + 8], acc[j])
    # GGML_F32x8_REDUCE: x0 += x2, x1 += x3, x0 += x1; then lo + hi and two hadds
    v = (acc[0] + acc[2]) + (acc[1] + acc[3])
    t0 = v[..., :4] + v[..., 4:]
    return (t0[..., 0] + t0[..., 1]) + (t0[..., 2] + t0[..., 3])


def _dot_f16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16 of rows a and b (fp16 values as float32, broadcast, last axis K)."""
    k = a.shape[-1]
    np_ = k & ~31
    with np.errstate(all="ignore"):
        sumf = _vector_part(a, b, np_).astype(F64)
        for i in range(np_, k):
            sumf += (a[..., i] * b[..., i]).astype(F64)
    return sumf.astype(F32)


def _dot_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 of rows a and b (float32, broadcast against each other, last axis K)."""
    k = a.shape[-1]
    np_ = k & ~31
    with np.errstate(all="ignore"):
        sumf = _vector_part(a, b, np_)
        # leftovers, `sumf += x[i]*y[i]` as gcc compiled it: runs of 8, then one of 4, as a
        # vector product then in-order sums; the last (up to 3) by a contracted fma
        i = np_
        while k - i >= 8 or (k - i >= 4 and (k - i) < 8):
            step = 8 if k - i >= 8 else 4
            prod = a[..., i:i + step] * b[..., i:i + step]
            for e in range(step):
                sumf = sumf + prod[..., e]
            i += step
            if step == 4:
                break
        for i in range(i, k):
            sumf = fmaf(a[..., i], b[..., i], sumf)
    return np.asarray(sumf, F32)


def vec_dot_f16(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16(K, w row, x row) for every pair: w (n0, K), x (n1, K) fp16 values
    (given as float32 or float16) -> (n1, n0).

    The F16C build widens each 8 halves to floats and runs the F32 loop (GGML_F32Cx8 = the F32
    lanes, fmas and reduction); the leftovers are added in double, each product rounded to float
    first: sumf += (ggml_float)(x[i]*y[i])."""
    w = np.ascontiguousarray(w, F32)
    x = np.ascontiguousarray(x, F32)
    return _dot_f16(w[None, :, :], x[:, None, :])


def vec_dot_f32(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32(K, w row, x row) for every pair: w (n0, K), x (n1, K) -> (n1, n0)."""
    w = np.ascontiguousarray(w, F32)
    x = np.ascontiguousarray(x, F32)
    return _dot_f32(w[None, :, :], x[:, None, :])


def vec_dot_f32_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 of each row of a with the same row of b: (n, K), (n, K) -> (n,)."""
    return _dot_f32(np.ascontiguousarray(a, F32), np.ascontiguousarray(b, F32))


def vec_dot_q8_0(w: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    """ggml_vec_dot_q8_0_q8_0 for every pair of rows of raw Q8_0 blocks -> (n1, n0)."""
    from engine.quants import QUANT_KINDS
    from engine.types import GGMLType

    dtype = QUANT_KINDS[GGMLType.Q8_0].dtype
    nb = k // 32
    bw = np.ascontiguousarray(w).reshape(-1).view(dtype).reshape(-1, nb)
    bx = np.ascontiguousarray(x).reshape(-1).view(dtype).reshape(-1, nb)
    n0, n1 = len(bw), len(bx)
    dw, dx = h2f(bw["d"]), h2f(bx["d"])  # (n0, nb), (n1, nb)
    # lane l of block b sums the 4 neighbouring products 4l..4l+3 (maddubs, then madd): for all
    # row pairs at once that is a rank-4 matrix product, exact in float32 (|sum| <= 4*127*127)
    qw = bw["qs"].reshape(n0, nb, 8, 4).transpose(1, 2, 3, 0).astype(F32)  # (nb, 8, 4, n0)
    qx = bx["qs"].reshape(n1, nb, 8, 4).transpose(1, 2, 0, 3).astype(F32)  # (nb, 8, n1, 4)
    acc = np.zeros((8, n1, n0), F32)  # the 8 float lanes of the accumulator, per row pair
    fma = np.empty((8, n1, n0), F64)  # d*lane + acc, exact before its one rounding to float32
    d = np.empty((n1, n0), F32)
    with np.errstate(all="ignore"):
        for b in range(nb):
            lanes = np.matmul(qx[b], qw[b])  # (8, n1, n0)
            np.multiply(dx[:, b, None], dw[None, :, b], out=d)  # float32 product of the scales
            np.multiply(lanes, d, out=fma, dtype=F64)
            fma += acc
            acc[...] = fma
        return _hsum8(np.moveaxis(acc, 0, -1))
