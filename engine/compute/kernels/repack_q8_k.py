"""The products of repacked Q4_K weights (q4_K_8x8) with Q8_K activations, as llama.cpp's AVX2
build computes MUL_MAT for a weight in the CPU_REPACK buffer (repack.cpp's
tensor_traits::forward_mul_mat; arch/x86/repack.cpp's ggml_quantize_mat_q8_K_4x8,
ggml_gemv_q4_K_8x8_q8_K and ggml_gemm_q4_K_8x8_q8_K).

`product` is the entry point: one plane of dst = w · xᵀ. The C loops are
engine/c/repack_q8_k.c; the functions registered with `@twin` here compute the same bits in
numpy (the engine runs them in pure-numpy mode).
"""

from __future__ import annotations

import numpy as np

from engine.compute.kernels.floatmath import fmaf_exact
from engine.lanes import lanes, twin
from engine.quants.common import get_scale_min_k4, h2f
from engine.quants.kquants import BLOCK_Q8_K
from engine.quants.repack import RepackLayout
from engine.quants.repack_kquant import BLOCK_Q4_KX8, BLOCK_Q8_KX4, Q4_K_8X8

F32 = np.float32
QK_K = 256


def product(layout: RepackLayout, packed: np.ndarray, ne00: int, ne01: int, x: np.ndarray,
            out: np.ndarray, threads: int = 1) -> None:
    """One plane of ggml's forward_mul_mat for a q4_K_8x8 weight: out (n, ne01) float32 = the
    repacked weight (packed: the buffer's bytes of the (ne01, ne00) Q4_K weight) times the n
    activation rows x (n, ne00) float32, written in place.

    What is interleaved, and why. In the buffer, each group of 8 weight rows is one row of
    block_q4_Kx8 (engine/quants/repack_kquant.py): the 8 rows' quants alternate 8 bytes at a time,
    and each sub-block's 8 scales and 8 mins sit together, so one 32-byte load holds the same 8
    quant bytes of 4 rows and the products of 8 weight rows with one activation run fill the 8
    lanes of an AVX2 register: 8 outputs at once, with no horizontal sum at the end. The
    activations get the same treatment 4 rows at a time: ggml_quantize_mat_q8_K_4x8 quantizes
    rows 4i .. 4i + 3 together into block_q8_Kx4 (their d[4], their quants alternating 8 at a
    time, their bsums regrouped), so the gemm reads 4 activation rows with one load and makes a
    tile of 4 x 8 outputs. The n - n % 4 rows of whole groups go through the gemm; the rest, one
    by one, through the gemv with plain Q8_K rows (quantize_row_q8_K, the type's from_float).

    The accumulation order (where the bits come from). Everything is integer up to one float per
    output and step: a sub-block's 32 products summed exactly, times its six-bit scale; the mins
    times the activation's sums of 32 (two int16 bsums added in int16). The gemv makes the float
    once per super-block: acc = fmaf((float)Σ_8 sub-blocks, d_w * d_x, acc), and the mins' acc_m
    = fmaf((float)Σ m * bsum, dmin_w * d_x, acc_m); the gemm once per pair of sub-blocks (4 fmaf
    a super-block, into the same two accumulators). Both end with acc - acc_m. So a row's value
    depends on whether it went through the gemm or the gemv (its place in the batch: n % 4), and
    on nothing else: neither on the threads nor on how ggml cuts the weight rows into chunks.
    """
    assert layout is Q4_K_8X8, f"{layout.name}: not a q4_K_8x8 product"
    x = np.ascontiguousarray(x, F32).reshape(-1, ne00)
    n = len(x)
    n4 = n - n % 4
    w = np.ascontiguousarray(packed).reshape(-1).view(np.uint8)
    dst = out if out.flags.c_contiguous and out.dtype == F32 else np.empty((n, ne01), F32)
    flat = dst.reshape(-1)
    if n4:
        y4 = np.empty((n4 // 4) * (ne00 // QK_K), BLOCK_Q8_KX4)
        lanes.quantize_mat_q8_k_4x8(x[:n4], y4.view(np.uint8), ne00)
        lanes.gemm_q4_k_8x8(w, y4.view(np.uint8), flat[:n4 * ne01], ne00, n4, ne01, 0, threads)
    if n > n4:
        y1 = np.empty((n - n4) * (ne00 // QK_K), BLOCK_Q8_K)
        lanes.quantize_q8_k(x[n4:], y1.view(np.uint8))
        lanes.gemv_q4_k_8x8(w, y1.view(np.uint8), flat[n4 * ne01:], ne00, n - n4, ne01, 0, threads)
    if dst is not out:
        out[...] = dst


# --- ggml_quantize_mat_q8_K_4x8 -----------------------------------------------------------------

def _max_ps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """_mm256_max_ps lane by lane: a where a > b, else b (so b where either is a NaN)."""
    return np.where(a > b, a, b)


def _iscales(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The AVX2 loop's iscale and d of each row's block (..., 256): the 8 lanes' largest |x|
    (max_ps vector after vector), whether a positive x equal to it was seen in a lane (reset where
    the lane's maximum grew), the lanes' maximum by max_ps's tree; -127/max where a lane holding
    the maximum saw it positive, else 127/max (0 for 0). d = 1/iscale."""
    vec = v.reshape(*v.shape[:-1], 8, 4, 8)  # (..., 32 elements, 4 vectors, 8 lanes)
    a = np.abs(vec)
    m = a[..., 0, 0, :]
    for j in range(1, 4):
        m = _max_ps(m, a[..., 0, j, :])
    seen = (m[..., None, :] == vec[..., 0, :, :]).any(-2)
    for sb in range(1, 8):
        prev = m
        for j in range(4):
            m = _max_ps(m, a[..., sb, j, :])
        seen = (seen & (prev == m)) | (m[..., None, :] == vec[..., sb, :, :]).any(-2)
    h = _max_ps(m[..., 4:], m[..., :4])
    mx = _max_ps(_max_ps(h[..., 0], h[..., 2]), _max_ps(h[..., 1], h[..., 3]))
    positive = (seen & (m == mx[..., None])).any(-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = np.where(mx != 0, np.where(positive, F32(-127) / mx, F32(127) / mx), F32(0))
        d = np.where(mx != 0, F32(1) / iscale, F32(0))
    return iscale.astype(F32), d.astype(F32)


def _quants(p: np.ndarray) -> np.ndarray:
    """_mm256_round_ps (nearest even), _mm256_cvtps_epi32 (INT32_MIN out of range or NaN), then
    the saturating packs to int8."""
    r = np.rint(p).astype(np.float64)
    i = np.where((r >= -2.0 ** 31) & (r < 2.0 ** 31), r, -2.0 ** 31)
    return np.clip(i, -128, 127).astype(np.int8)


@twin("quantize_mat_q8_k_4x8")
def quantize_mat_q8_k_4x8(x, out, k: int) -> None:
    """engine._lanes.quantize_mat_q8_k_4x8(x, out, k): ggml_quantize_mat_q8_K_4x8 (AVX2) of each
    group of 4 rows of k floats -> k / 256 block_q8_Kx4 a group: d[4]; the quants of element 8j + e
    of row r at qs[32 j + 8 r + e]; bsums[16 (e / 64) + 4 r + (e / 16) % 4] the sum of the 16
    quants from e (so each run of 64 elements has the 4 rows' 4 sums together)."""
    x = np.frombuffer(x, F32).reshape(-1, 4, k // QK_K, QK_K).swapaxes(1, 2)  # (g, b, r, 256)
    y = np.frombuffer(out, BLOCK_Q8_KX4).reshape(x.shape[:2])
    iscale, d = _iscales(x)
    with np.errstate(invalid="ignore", over="ignore"):
        q = _quants(x * iscale[..., None])  # (g, b, r, 256)
    y["d"] = d
    y["qs"] = q.reshape(*q.shape[:3], 32, 8).swapaxes(2, 3).reshape(*q.shape[:2], 1024)
    sums = q.reshape(*q.shape[:3], 4, 4, 16).sum(-1, dtype=np.int16)  # (g, b, r, e / 64, sub16)
    y["bsums"] = sums.swapaxes(2, 3).reshape(*q.shape[:2], 64)


# --- gemv and gemm ------------------------------------------------------------------------------

def _weights(w, nc: int, nb: int):
    """The q4_K_8x8 blocks (nc / 8, nb) decoded: quants (g, b, r, 8 sub-blocks, 32) as float64,
    scales and mins (g, b, r, 8) int64, d and dmin (g, b, r) float32. Byte 256 sb + 64 k + 8 r + e
    of qs holds element 8k + e of sub-block 2sb (low nibble) and 2sb + 1 (high nibble) of row r."""
    blk = np.frombuffer(w, BLOCK_Q4_KX8).reshape(nc // 8, nb)
    qs = blk["qs"].reshape(nc // 8, nb, 4, 1, 4, 8, 8)  # (g, b, sb, h, k, r, e)
    nib = np.concatenate([qs & 15, qs >> 4], axis=3)
    q = nib.transpose(0, 1, 5, 2, 3, 4, 6).reshape(nc // 8, nb, 8, 8, 32).astype(np.float64)
    sc, mn = get_scale_min_k4(blk["scales"].reshape(-1, 12))  # (g * b * sub-block, row)
    sc, mn = (v.reshape(nc // 8, nb, 8, 8).swapaxes(2, 3).astype(np.int64) for v in (sc, mn))
    return q, sc, mn, h2f(blk["d"]), h2f(blk["dmin"])


def _pair_sums(b16: np.ndarray) -> np.ndarray:
    """The 16 bsums (..., 16) int16 -> the 8 sub-blocks' sums of 32, added in int16 (wrapping,
    as _mm_hadd_epi16) -> int64."""
    b = b16.astype(np.int16).reshape(*b16.shape[:-1], 8, 2)
    with np.errstate(over="ignore"):
        return (b[..., 0] + b[..., 1]).astype(np.int64)


def _rows_q8_k(y, nr: int, nb: int):
    """nr rows of nb block_q8_K: quants (nr, b, 8, 32) float64, pair sums (nr, b, 8), d (nr, b)."""
    blk = np.frombuffer(y, BLOCK_Q8_K).reshape(nr, nb)
    return (blk["qs"].reshape(nr, nb, 8, 32).astype(np.float64), _pair_sums(blk["bsums"]),
            blk["d"].astype(F32))


def _rows_q8_kx4(y, nr: int, nb: int):
    """nr rows as nr / 4 rows of nb block_q8_Kx4, de-interleaved: as _rows_q8_k."""
    blk = np.frombuffer(y, BLOCK_Q8_KX4).reshape(nr // 4, nb)
    qs = blk["qs"].reshape(nr // 4, nb, 32, 4, 8).transpose(0, 3, 1, 2, 4)  # (g, r, b, j, e)
    bs = blk["bsums"].reshape(nr // 4, nb, 4, 4, 4).transpose(0, 3, 1, 2, 4)  # (g, r, b, e/64, ..)
    d = blk["d"].transpose(0, 2, 1)
    return (qs.reshape(nr, nb, 8, 32).astype(np.float64), _pair_sums(bs.reshape(nr, nb, 16)),
            d.reshape(nr, nb).astype(F32))


def _sub_block_sums(w, y, n: int, nr: int, nc: int, rows) -> tuple:
    """The integers of every (activation row, weight row, block, sub-block): the dot product of
    its 32 quants times the scale, and the min times the activation's sum (both (nr, g, r, b, 8)
    int64), and the float steps' scales d_w * d_x and dmin_w * d_x ((nr, g, r, b) float32)."""
    nb = n // QK_K
    q, sc, mn, d, dmin = _weights(w, nc, nb)
    a, bs, ad = rows(y, nr, nb)
    # exact: |each sum| < 2^16, float64 products of small integers
    dots = np.einsum("gbrsk,ybsk->ygrbs", q, a, optimize=True).astype(np.int64)
    isub = sc.transpose(0, 2, 1, 3)[None] * dots
    imin = mn.transpose(0, 2, 1, 3)[None] * bs[:, None, None]
    dd = d.transpose(0, 2, 1)[None] * ad[:, None, None, :]
    dm = dmin.transpose(0, 2, 1)[None] * ad[:, None, None, :]
    return isub, imin, dd, dm


def _accumulate(isum: np.ndarray, imin: np.ndarray, dd: np.ndarray, dm: np.ndarray,
                nr: int, nc: int) -> np.ndarray:
    """acc = fmaf((float)isum, dd, acc) and acc_m likewise step after step (the last axis), then
    acc - acc_m: (nr, nc) float32."""
    acc = np.zeros(isum.shape[:-1], F32)
    acc_m = np.zeros(isum.shape[:-1], F32)
    for s in range(isum.shape[-1]):
        acc = fmaf_exact(isum[..., s].astype(np.int32).astype(F32), dd[..., s], acc)
        acc_m = fmaf_exact(imin[..., s].astype(np.int32).astype(F32), dm[..., s], acc_m)
    return (acc - acc_m).reshape(nr, nc)


@twin("gemv_q4_k_8x8")
def gemv_q4_k_8x8(w, x, out, n: int, nr: int, nc: int, portable: int = 0, threads: int = 1) -> None:
    """engine._lanes.gemv_q4_k_8x8: ggml_gemv_q4_K_8x8_q8_K (AVX2), nr plain Q8_K rows: one
    fmaf a super-block, of the 8 sub-blocks' integer sum."""
    isub, imin, dd, dm = _sub_block_sums(w, x, n, nr, nc, _rows_q8_k)
    with np.errstate(all="ignore"):
        res = _accumulate(isub.sum(-1), imin.sum(-1), dd, dm, nr, nc)
    np.frombuffer(out, F32)[:] = res.reshape(-1)


@twin("gemm_q4_k_8x8")
def gemm_q4_k_8x8(w, x, out, n: int, nr: int, nc: int, portable: int = 0, threads: int = 1) -> None:
    """engine._lanes.gemm_q4_k_8x8: ggml_gemm_q4_K_8x8_q8_K (AVX2), nr / 4 groups of
    block_q8_Kx4 rows: one fmaf per pair of sub-blocks (4 a super-block)."""
    isub, imin, dd, dm = _sub_block_sums(w, x, n, nr, nc, _rows_q8_kx4)
    pairs = isub.reshape(*isub.shape[:-1], 4, 2).sum(-1)  # (y, g, r, b, sb)
    pmin = imin.reshape(*imin.shape[:-1], 4, 2).sum(-1)
    step = (*pairs.shape[:-2], -1)
    with np.errstate(all="ignore"):
        res = _accumulate(pairs.reshape(step), pmin.reshape(step), np.repeat(dd, 4, -1),
                          np.repeat(dm, 4, -1), nr, nc)
    np.frombuffer(out, F32)[:] = res.reshape(-1)

