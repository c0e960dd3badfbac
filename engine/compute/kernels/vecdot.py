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

from engine.compute.kernels.floatmath import fmaf
from engine.quants import QUANT_KINDS
from engine.quants.common import h2f
from engine.quants.kquants import get_scale_min_k4
from engine.types import GGMLType

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


def _blocks(w: np.ndarray, type_, nb: int) -> np.ndarray:

    return np.ascontiguousarray(w).reshape(-1).view(QUANT_KINDS[type_].dtype).reshape(-1, nb)


def _dot_32_blocks(qw: np.ndarray, dw: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    """The AVX2 dot of blocks of 32 against Q8_0 activations (ggml_vec_dot_q4_0/q5_0/q8_0_q8_0):
    qw (n0, nb, 32) the weights' signed quant values as the kernel builds them in bytes, dw
    (n0, nb) their scales, x raw Q8_0 rows -> (n1, n0).

    Lane l of block b sums the 4 neighbouring products 4l..4l+3 (maddubs, then madd); then
    acc = fma(x.d·y.d, lanes, acc) per block, and hsum_float_8(acc)."""

    nb = k // 32
    bx = _blocks(x, GGMLType.Q8_0, nb)
    n0, n1 = len(qw), len(bx)
    dx = h2f(bx["d"])  # (n1, nb)
    # for all row pairs at once the lanes are a rank-4 matrix product, exact in float32
    # (|sum| <= 4*128*127)
    qw = qw.reshape(n0, nb, 8, 4).transpose(1, 2, 3, 0).astype(F32)  # (nb, 8, 4, n0)
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


def vec_dot_q8_0(w: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    """ggml_vec_dot_q8_0_q8_0 for every pair of rows of raw Q8_0 blocks -> (n1, n0)."""

    bw = _blocks(w, GGMLType.Q8_0, k // 32)
    return _dot_32_blocks(bw["qs"], h2f(bw["d"]), x, k)


def vec_dot_q4_0(w: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    """ggml_vec_dot_q4_0_q8_0: the weights' nibbles (low nibbles are elements 0-15, high ones
    16-31) minus 8 (bytes_from_nibbles_32, then _mm256_sub_epi8)."""

    bw = _blocks(w, GGMLType.Q4_0, k // 32)
    qs = bw["qs"]  # (n0, nb, 16)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8) - np.int8(8)
    return _dot_32_blocks(q, h2f(bw["d"]), x, k)


def vec_dot_q5_0(w: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    """ggml_vec_dot_q5_0_q8_0: each nibble, or'ed with 0xF0 where its bit in qh is clear
    (bytes_from_bits_32 and andnot): nibble + 16·bit - 16 as a signed byte."""

    bw = _blocks(w, GGMLType.Q5_0, k // 32)
    qs = bw["qs"]  # (n0, nb, 16)
    nib = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int16)
    qh = bw["qh"].view("<u4").reshape(qs.shape[:-1])  # (n0, nb)
    bits = (qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1
    q = (nib + 16 * bits.astype(np.int16) - 16).astype(np.int8)
    return _dot_32_blocks(q, h2f(bw["d"]), x, k)


def _k_lanes(qw: np.ndarray, qx: np.ndarray) -> np.ndarray:
    """The 8 integer lanes of a K-quant dot for every super-block and row pair -> (nb, 8, n1, n0)
    (float64, exact). qw (n0, nb, R, 8, 4): the weights' scaled integer values, R runs of 32
    bytes, lane L holding bytes 4L..4L+3 of each run; qx (n1, nb, R, 8, 4) the activations'.

    For a few activation rows (token-by-token decoding) the products are summed in int32 in place
    (no copy of the weights); for many, as matrix products of the regrouped weights in float64.
    """
    n0, nb = qw.shape[:2]
    n1 = qx.shape[0]
    if n1 <= 4:
        qw = qw.astype(np.int32, copy=False)
        lanes = np.stack([np.einsum("obrlt,brlt->blo", qw, qx[i].astype(np.int32))
                          for i in range(n1)], axis=2)  # (nb, 8, n1, n0)
        return lanes.astype(F64)
    w = qw.transpose(1, 3, 2, 4, 0).reshape(nb, 8, -1, n0).astype(F64)
    x = qx.transpose(1, 3, 0, 2, 4).reshape(nb, 8, n1, -1).astype(F64)
    return np.matmul(x, w)


def vec_dot_q4_k(w: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    """ggml_vec_dot_q4_K_q8_K (AVX2) for every pair of rows of raw Q4_K and Q8_K blocks -> (n1, n0).

    Per super-block of 256: the 8 integer lanes of `sumi` (lane L holds bytes 4L..4L+3 of each
    32-byte run: 4 elements of the low-nibble sub-block 2j and 4 of the high-nibble sub-block
    2j+1, times their 6-bit scales, for j = 0..3), then acc = fma(d, lanes, acc) with
    d = y.d·x.d; the mins go through 4 lanes: acc_m = fma(-y.d·x.dmin, Σ min·q8 sums, acc_m).
    The result is hsum_float_8(acc) + ((m0 + m2) + (m1 + m3)). The lane sums are exact integers
    (_k_lanes); so are the mins' (below 2^24, formed in float32).
    """

    nb = k // 256
    bw, bx = _blocks(w, GGMLType.Q4_K, nb), _blocks(x, GGMLType.Q8_K, nb)
    n0, n1 = len(bw), len(bx)
    sc, mins = (a.reshape(n0, nb, 8).astype(F32)
                for a in get_scale_min_k4(bw["scales"].reshape(-1, 12)))
    qs = bw["qs"].reshape(n0, nb, 4, 32)
    q4 = np.stack([qs & 0x0F, qs >> 4], axis=3).astype(np.int16)  # (n0, nb, j, half, 32)
    q4 *= sc.reshape(n0, nb, 4, 2, 1).astype(np.int16)  # sub-block 2j + half times its scale
    lanes = _k_lanes(q4.reshape(n0, nb, 8, 8, 4), bx["qs"].reshape(n1, nb, 8, 8, 4))
    q8s = bx["bsums"].reshape(n1, nb, 8, 2).sum(axis=-1, dtype=np.int32)  # _mm_hadd_epi16
    prod_x = q8s.reshape(n1, nb, 4, 2).transpose(1, 2, 0, 3).astype(F32)  # (nb, 4, n1, 2)
    prod_w = mins.reshape(n0, nb, 4, 2).transpose(1, 2, 3, 0)  # (nb, 4, 2, n0)
    yd = bx["d"].astype(F32)  # (n1, nb)
    xd, xdmin = h2f(bw["d"]), h2f(bw["dmin"])  # (n0, nb)
    acc = np.zeros((8, n1, n0), F32)
    acc_m = np.zeros((4, n1, n0), F32)
    fma = np.empty((8, n1, n0), F64)
    fma_m = np.empty((4, n1, n0), F64)
    d = np.empty((n1, n0), F32)
    with np.errstate(all="ignore"):
        for b in range(nb):
            np.multiply(-yd[:, b, None], xdmin[None, :, b], out=d)  # dmin = -y.d * x.dmin
            np.multiply(np.matmul(prod_x[b], prod_w[b]), d, out=fma_m, dtype=F64)
            fma_m += acc_m
            acc_m[...] = fma_m
            np.multiply(yd[:, b, None], xd[None, :, b], out=d)  # d = y.d * x.d
            np.multiply(lanes[b], d, out=fma)
            fma += acc
            acc[...] = fma
        m = (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3])
        return _hsum8(np.moveaxis(acc, 0, -1)) + m


def vec_dot_q6_k(w: np.ndarray, x: np.ndarray, k: int) -> np.ndarray:
    """ggml_vec_dot_q6_K_q8_K (AVX2) for every pair of rows of raw Q6_K and Q8_K blocks -> (n1, n0).

    The kernel multiplies the unsigned 6-bit values q (0..63) and removes the offset of 32
    afterwards: per super-block, integer lane L sums sc·q·q8 over bytes 4L..4L+3 of each of the
    8 runs of 32 (each element with the int8 scale of its 16), minus 32·(bsums[2L]·sc[2L] +
    bsums[2L+1]·sc[2L+1]); then acc = fma(y.d·x.d, lanes, acc) and hsum_float_8(acc). The lane
    sums are exact integers (_k_lanes)."""

    nb = k // 256
    bw, bx = _blocks(w, GGMLType.Q6_K, nb), _blocks(x, GGMLType.Q8_K, nb)
    n0, n1 = len(bw), len(bx)
    ql = bw["ql"].reshape(n0, nb, 2, 2, 32)  # (half j, run of 32 bytes, byte)
    qh = bw["qh"].reshape(n0, nb, 2, 32)
    q = np.empty((n0, nb, 2, 4, 32), np.int16)  # elements 128j + 32r + t
    q[:, :, :, 0] = (ql[:, :, :, 0] & 0x0F) | ((qh & 0x03) << 4)
    q[:, :, :, 1] = (ql[:, :, :, 1] & 0x0F) | ((qh & 0x0C) << 2)
    q[:, :, :, 2] = (ql[:, :, :, 0] >> 4) | (qh & 0x30)
    q[:, :, :, 3] = (ql[:, :, :, 1] >> 4) | ((qh & 0xC0) >> 2)
    sc = bw["scales"].astype(np.int16).reshape(n0, nb, 16)  # int8 scales, one per 16
    q = q.reshape(n0, nb, 16, 16) * sc[..., None]
    lanes = _k_lanes(q.reshape(n0, nb, 8, 8, 4), bx["qs"].reshape(n1, nb, 8, 8, 4))
    bsums = bx["bsums"].astype(F64).reshape(n1, nb, 8, 2).transpose(1, 2, 0, 3)  # (nb, 8, n1, 2)
    scp = bw["scales"].astype(F64).reshape(n0, nb, 8, 2).transpose(1, 2, 3, 0)  # (nb, 8, 2, n0)
    yd = bx["d"].astype(F32)
    xd = h2f(bw["d"])
    acc = np.zeros((8, n1, n0), F32)
    fma = np.empty((8, n1, n0), F64)
    d = np.empty((n1, n0), F32)
    with np.errstate(all="ignore"):
        for b in range(nb):
            lanes_b = lanes[b] - 32 * np.matmul(bsums[b], scp[b])  # exact integers
            np.multiply(yd[:, b, None], xd[None, :, b], out=d)
            np.multiply(lanes_b, d, out=fma)
            fma += acc
            acc[...] = fma
        return _hsum8(np.moveaxis(acc, 0, -1))
