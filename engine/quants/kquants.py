"""K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and the activation type Q8_K (super-blocks of 256).

Mirrors `quantize_row_<t>_ref`, `dequantize_row_<t>` and the scale searches they use
(`make_qkx2_quants`, `make_qx_quants`, `make_q3_quants`) in ggml-quants.c. A super-block holds
16 sub-blocks of 16 (Q2_K, Q3_K, Q6_K) or 8 of 32 (Q4_K, Q5_K); each sub-block's scale (and min)
is itself quantized to 4, 6 or 8 bits against the fp16 super-scales d (and dmin).
The searches loop over their few candidate scales and vectorise over all sub-blocks at once.
Leaves out: the imatrix-weighted `quantize_row_<t>_impl` paths (make_qkx3/make_qp_quants).
"""

from __future__ import annotations

import numpy as np

from engine.quants.common import (F32, DotBlocks, Lanes, Mins, QuantKind, VecDot, absmax_signed,
                                  bit_fields, block_dtype, byte_rows, dequantize_by_lanes, f2h,
                                  f32, first_max, first_min, fp16_value, get_scale_min_k4, h2f,
                                  half_at, nearest_int, nibbles, scale_words, scaled, seq_sum,
                                  SubScales, unpack_2bit)
from engine.core.types import GGMLType as T
from engine.lanes import lanes, twin

BLOCK_Q2_K = block_dtype(("scales", "u1", 16), ("qs", "u1", 64), ("d", "<u2"), ("dmin", "<u2"))
BLOCK_Q3_K = block_dtype(("hmask", "u1", 32), ("qs", "u1", 64), ("scales", "u1", 12),
                         ("d", "<u2"))
BLOCK_Q4_K = block_dtype(("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", 12), ("qs", "u1", 128))
BLOCK_Q5_K = block_dtype(("d", "<u2"), ("dmin", "<u2"), ("scales", "u1", 12), ("qh", "u1", 32),
                         ("qs", "u1", 128))
BLOCK_Q6_K = block_dtype(("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<u2"))
BLOCK_Q8_K = block_dtype(("d", "<f4"), ("qs", "i1", 256), ("bsums", "<i2", 16))

GROUP_MAX_EPS = F32(1e-15)
_SHIFT4 = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]


def _acc(a: np.ndarray) -> np.ndarray:
    """`s = a[0]; for (i = 1..) s += a[i]` (a sum that starts from the first term)."""
    return np.add.accumulate(f32(a), axis=-1, dtype=F32)[..., -1]


# --- the scale searches --------------------------------------------------------------------------

def make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep, use_mad):
    """make_qkx2_quants over groups: x, w (G, n) -> (scale (G,), the_min (G,), L (G, n)).

    Asymmetric x ~ scale*L - the_min: a first guess from [min, max], then nstep+1 candidate
    iscales solved by weighted least squares, keeping the one with the smallest error.
    """
    vmin, vmax = first_min(x), first_max(x)
    sum_w, sum_x = _acc(w), _acc(w * x)
    vmin = np.where(vmin > 0, F32(0), vmin)
    flat = vmax == vmin
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rng = vmax - vmin
        iscale = F32(nmax) / rng
        scale = F32(1) / iscale
        xm = x - vmin[:, None]
        L = np.clip(nearest_int(iscale[:, None] * xm), 0, nmax)

        def error(sc, mn, l):
            diff = sc[:, None] * l.astype(F32) + mn[:, None] - x
            return seq_sum(w * (np.abs(diff) if use_mad else diff * diff))

        best = error(scale, vmin, L)
        for step in range(nstep + 1):  # `min` moves when a candidate wins, as in C
            rng, xm = vmax - vmin, x - vmin[:, None]
            isc = (F32(rmin) + F32(rdelta) * F32(step) + F32(nmax)) / rng
            la = np.clip(nearest_int(isc[:, None] * xm), 0, nmax)
            lf = la.astype(F32)
            sum_l, sum_l2, sum_xl = seq_sum(w * lf), seq_sum(w * lf * lf), seq_sum(w * lf * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_min = np.where(pos, F32(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            cur = error(this_scale, this_min, la)
            take = (D > 0) & (cur < best)
            L = np.where(take[:, None], la, L)
            best = np.where(take, cur, best)
            scale = np.where(take, this_scale, scale)
            vmin = np.where(take, this_min, vmin)
    L = np.where(flat[:, None], 0, L)
    return np.where(flat, F32(0), scale).astype(F32), (-vmin).astype(F32), L


def make_qx_quants(x, nmax):
    """make_qx_quants(rmse_type=1, no weights) over groups: symmetric, 19 candidate iscales."""
    amax, vmax = absmax_signed(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        def trial(iscale):
            l = np.clip(nearest_int(iscale[:, None] * x), -nmax, nmax - 1)
            lf = l.astype(F32)
            return l, seq_sum(w * x * lf), seq_sum(w * lf * lf)

        l, sumlx, suml2 = trial(F32(-nmax) / vmax)
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
        best = scale * sumlx
        L = l + nmax
        for step in (*range(-9, 0), *range(1, 10)):
            l, sumlx, suml2 = trial(-(F32(nmax) + F32(0.1) * F32(step)) / vmax)
            take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            L = np.where(take[:, None], l + nmax, L)
            scale = np.where(take, sumlx / suml2, scale)
            best = np.where(take, scale * sumlx, best)
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero[:, None], 0, L)


def make_q3_quants(x, nmax):
    """make_q3_quants(do_rmse=true) over groups: up to 5 sweeps of coordinate descent on L."""
    amax, vmax = absmax_signed(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        L = np.clip(nearest_int((F32(-nmax) / vmax)[:, None] * x), -nmax, nmax - 1)
        lf = L.astype(F32)
        sumlx, suml2 = seq_sum(w * x * lf), seq_sum(w * lf * lf)
        active = ~zero
        for _ in range(5):
            changed = np.zeros(len(x), bool)
            for i in range(x.shape[1]):
                xi, wi, li = x[:, i], w[:, i], L[:, i].astype(F32)
                slx = sumlx - wi * xi * li
                sl2 = suml2 - wi * li * li
                new = np.clip(nearest_int(xi * sl2 / slx), -nmax, nmax - 1)
                nf = new.astype(F32)
                slx2 = slx + wi * xi * nf
                sl22 = sl2 + wi * nf * nf
                take = (active & (slx > 0) & (new != L[:, i]) & (sl22 > 0)
                        & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22))
                L[:, i] = np.where(take, new, L[:, i])
                sumlx = np.where(take, slx2, sumlx)
                suml2 = np.where(take, sl22, suml2)
                changed |= take
            active &= changed
            if not active.any():
                break
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero[:, None], 0, L + nmax)


# --- packing helpers ----------------------------------------------------------------------------

def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """(nb, 256) 2-bit values -> qs (nb, 64): byte 32c+l holds elements 128c + l + 32k at bits 2k."""
    q = (L.reshape(-1, 2, 4, 32) & 3) << _SHIFT4
    return q.sum(axis=2).reshape(-1, 64).astype(np.uint8)


def _hbits(qh: np.ndarray) -> np.ndarray:
    """qh / hmask (nb, 32) -> (nb, 256) 0/1: element 32k + l is bit k of qh[l]."""
    return bit_fields(np.ascontiguousarray(qh), 0, 32, 32, 1)


def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins -> the 12 scale bytes of Q4_K / Q5_K."""
    out = np.zeros((len(ls), 12), np.int64)
    out[:, 0:4], out[:, 4:8] = ls[:, :4], lm[:, :4]
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    out[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    out[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    return out.astype(np.uint8)


def q3_k_scales(scales: np.ndarray) -> np.ndarray:
    """The 16 six-bit Q3_K scales (nb, 16) as int8, minus 32: dequantize_row_q3_K's aux[4].

    Low 4 bits in the nibbles of bytes 0-7, high 2 bits in bytes 8-11 (kmask1 = 0x03030303,
    kmask2 = 0x0f0f0f0f).
    """
    a0, a1, tmp = scale_words(scales)
    aux = np.empty((len(a0), 4), "<u4")
    aux[:, 2] = ((a0 >> 4) & 0x0F0F0F0F) | (((tmp >> 4) & 0x03030303) << 4)
    aux[:, 3] = ((a1 >> 4) & 0x0F0F0F0F) | (((tmp >> 6) & 0x03030303) << 4)
    aux[:, 0] = (a0 & 0x0F0F0F0F) | (((tmp >> 0) & 0x03030303) << 4)
    aux[:, 1] = (a1 & 0x0F0F0F0F) | (((tmp >> 2) & 0x03030303) << 4)
    return aux.view(np.int8) - np.int8(32)  # (nb, 16): 0..63 - 32


# --- Q2_K --------------------------------------------------------------------------------------

def quantize_q2_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q2_K_ref: 16 x 16, 2-bit quants, 4-bit scales and mins."""
    nb = len(x)
    y = np.zeros(nb, BLOCK_Q2_K)
    xs = x.reshape(nb * 16, 16)
    scales, mins, L = make_qkx2_quants(xs, np.abs(xs), 3, -0.5, 0.1, 15, True)
    scales, mins, L = scales.reshape(nb, 16), mins.reshape(nb, 16), L.reshape(nb, 16, 16)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        ls = np.where(max_scale[:, None] > 0,
                      nearest_int((F32(15) / max_scale)[:, None] * scales), 0) & 0xFF
        lm = np.where(max_min[:, None] > 0,
                      nearest_int((F32(15) / max_min)[:, None] * mins) << 4, 0) & 0xFF
    sc = ls | lm
    y["scales"] = sc
    y["d"] = np.where(max_scale > 0, f2h(max_scale / F32(15)), 0)
    y["dmin"] = np.where(max_min > 0, f2h(max_min / F32(15)), 0)
    d = h2f(y["d"])[:, None] * (sc & 0xF).astype(F32)  # (nb, 16)
    dm = h2f(y["dmin"])[:, None] * (sc >> 4).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lq = np.clip(nearest_int((x.reshape(nb, 16, 16) + dm[..., None]) / d[..., None]), 0, 3)
    L = np.where((d != 0)[..., None], lq, L)
    y["qs"] = _pack_2bit(L.reshape(nb, 256))
    return y


def _scales_and_mins(b: np.ndarray, ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """C's `dl = d * ls` and `ml = min * lm` for the sub-block ints ls, lm (nb, n):
    float32 (2, nb, n), dl then ml."""
    n = ls.shape[-1]
    dm = np.repeat(np.stack([h2f(b["d"]), h2f(b["dmin"])]), n, axis=1)  # (2, nb * n)
    dm *= np.stack([ls, lm]).reshape(2, -1)
    return dm.reshape(2, -1, n)


def dequantize_q2_k(b: np.ndarray) -> np.ndarray:
    """dequantize_row_q2_K: d*(sc & 15)*q - dmin*(sc >> 4), sub-block = element // 16."""
    sc = b["scales"]
    dl, ml = _scales_and_mins(b, sc & 0xF, sc >> 4)  # (nb, 16) each
    y = scaled(unpack_2bit(b["qs"]).reshape(-1, 16, 16), dl)
    y -= ml[..., None]
    return y.reshape(-1, 256)


# --- Q3_K --------------------------------------------------------------------------------------

def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q3_K_ref: 16 x 16, 3-bit quants (2 low bits + hmask), 6-bit scales."""
    nb = len(x)
    y = np.zeros(nb, BLOCK_Q3_K)
    scales, L = make_q3_quants(x.reshape(nb * 16, 16), 4)
    scales, L = scales.reshape(nb, 16), L.reshape(nb, 16, 16)
    _, max_scale = absmax_signed(scales)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        iscale = F32(-32) / max_scale
        l = np.clip(((nearest_int(iscale[:, None] * scales) + 128) & 0xFF) - 128, -32, 31) + 32
    l = np.where(max_scale[:, None] != 0, l, 0)
    packed = np.zeros((nb, 12), np.int64)
    packed[:, 0:8] = (l[:, 0:8] & 0xF) | ((l[:, 8:16] & 0xF) << 4)
    for j in range(16):
        packed[:, 8 + j % 4] |= (l[:, j] >> 4) << (2 * (j // 4))
    y["scales"] = packed
    with np.errstate(divide="ignore"):
        y["d"] = np.where(max_scale != 0, f2h(F32(1) / iscale), 0)
    d = h2f(y["d"])[:, None] * q3_k_scales(y["scales"]).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lq = np.clip(nearest_int(x.reshape(nb, 16, 16) / d[..., None]), -4, 3) + 4
    L = np.where((d != 0)[..., None], lq, L).reshape(nb, 256)
    high = L > 3
    # element e's high bit goes to bit e // 32 of hmask[e % 32]
    y["hmask"] = (high.reshape(nb, 8, 32) << np.arange(8)[None, :, None]).sum(axis=1)
    y["qs"] = _pack_2bit(np.where(high, L - 4, L))
    return y


def dequantize_q3_k(b: np.ndarray) -> np.ndarray:
    """dequantize_row_q3_K: d*(sc - 32)*(q - (hmask bit ? 0 : 4))."""
    dl = h2f(b["d"])[:, None] * q3_k_scales(b["scales"]).astype(F32)  # (nb, 16)
    q = unpack_2bit(b["qs"])
    q |= _hbits(b["hmask"]) * np.uint8(4)  # hbit << 2 (numpy's uint8 << is slow)
    q -= np.uint8(4)  # (q | hbit << 2) - 4 = q - (hbit ? 0 : 4), as int8
    return scaled(q.view(np.int8).reshape(-1, 16, 16), dl).reshape(-1, 256)


# --- Q4_K / Q5_K -------------------------------------------------------------------------------

def _quantize_q45_k(x: np.ndarray, nmax: int, rmin: float, nstep: int):
    """The shared part of quantize_row_q4_K_ref / q5_K_ref: (d, dmin, scale bytes, L (nb, 256))."""
    nb = len(x)
    xs = x.reshape(nb * 8, 32)
    av_x = np.sqrt(seq_sum(xs * xs) / F32(32))
    w = av_x[:, None] + np.abs(xs)
    scales, mins, L = make_qkx2_quants(xs, w, nmax, rmin, 0.1, nstep, False)
    scales, mins, L = scales.reshape(nb, 8), mins.reshape(nb, 8), L.reshape(nb, 8, 32)
    max_scale = np.maximum(scales.max(axis=1), F32(0))
    max_min = np.maximum(mins.max(axis=1), F32(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    ls = np.minimum(63, nearest_int(inv_scale[:, None] * scales) & 0xFF)
    lm = np.minimum(63, nearest_int(inv_min[:, None] * mins) & 0xFF)
    packed = _pack_scale_min_k4(ls, lm)
    d, dmin = f2h(max_scale / F32(63)), f2h(max_min / F32(63))
    sc, m = get_scale_min_k4(packed)
    dj = h2f(d)[:, None] * sc.astype(F32)
    dm = h2f(dmin)[:, None] * m.astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        lq = np.clip(nearest_int((x.reshape(nb, 8, 32) + dm[..., None]) / dj[..., None]), 0, nmax)
    L = np.where((dj != 0)[..., None], lq, L).reshape(nb, 256)
    return d, dmin, packed, L


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q4_K_ref: 8 x 32, 4-bit quants, 6-bit scales and mins."""
    y = np.zeros(len(x), BLOCK_Q4_K)
    y["d"], y["dmin"], y["scales"], L = _quantize_q45_k(x, 15, -1.0, 20)
    L = L.reshape(-1, 4, 2, 32)  # per 64-chunk: low nibble = first 32, high = next 32
    y["qs"] = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(-1, 128)
    return y


def _q4_nibbles(qs: np.ndarray) -> np.ndarray:
    """qs (nb, 128) -> (nb, 256): per 64-chunk the 32 low nibbles, then the 32 high nibbles."""
    return nibbles(np.ascontiguousarray(qs), 0, 128, 32)


dequantize_q4_k = dequantize_by_lanes(T.Q4_K)  # dequantize_row_q4_K: d*sc*q - dmin*m, sub-block = element // 32


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q5_K_ref: as Q4_K with 5-bit quants (the 5th bit in qh)."""
    y = np.zeros(len(x), BLOCK_Q5_K)
    y["d"], y["dmin"], y["scales"], L = _quantize_q45_k(x, 31, -0.5, 15)
    high = (L > 15).reshape(-1, 8, 32)
    y["qh"] = (high << np.arange(8)[None, :, None]).sum(axis=1)
    L = (L & 0xF).reshape(-1, 4, 2, 32)
    y["qs"] = (L[:, :, 0] | (L[:, :, 1] << 4)).reshape(-1, 128)
    return y


dequantize_q5_k = dequantize_by_lanes(T.Q5_K)  # dequantize_row_q5_K: d*sc*(q4 + 16*hbit) - dmin*m


# --- Q6_K --------------------------------------------------------------------------------------

def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q6_K_ref: 16 x 16, 6-bit quants (4 in ql, 2 in qh), int8 scales."""
    nb = len(x)
    y = np.zeros(nb, BLOCK_Q6_K)
    scales, L = make_qx_quants(x.reshape(nb * 16, 16), 32)
    scales, L = scales.reshape(nb, 16), L.reshape(nb, 16, 16)
    amax, max_scale = absmax_signed(scales)
    ok = amax >= GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-128) / max_scale
        y["d"] = np.where(ok, f2h(F32(1) / iscale), 0)
        sc = ((np.minimum(127, nearest_int(iscale[:, None] * scales)) + 128) & 0xFF) - 128
        sc = np.where(ok[:, None], sc, 0)
        y["scales"] = sc
        d = h2f(y["d"])[:, None] * sc.astype(F32)
        lq = np.clip(nearest_int(x.reshape(nb, 16, 16) / d[..., None]), -32, 31) + 32
    L = np.where((d != 0)[..., None], lq, L)
    L = np.where(ok[:, None, None], L, 0).reshape(nb, 2, 4, 32)  # chunk c, quarter k, l
    y["ql"] = np.concatenate([(L[:, :, 0] & 0xF) | ((L[:, :, 2] & 0xF) << 4),
                              (L[:, :, 1] & 0xF) | ((L[:, :, 3] & 0xF) << 4)], axis=2).reshape(nb, 128)
    y["qh"] = ((L >> 4) << _SHIFT4).sum(axis=2).reshape(nb, 64)
    return y


def dequantize_q6_k(b: np.ndarray) -> np.ndarray:
    """dequantize_row_q6_K: d*sc*(q - 32), sub-block = element // 16.

    Per 128-chunk, quarter k holds the low nibbles (k < 2) or high nibbles (k >= 2) of
    ql[32*(k % 2) + l], i.e. the 64 low nibbles then the 64 high nibbles of its 64 ql bytes,
    and bits 2k of qh[l] (laid out like Q2_K's qs).
    """
    q = nibbles(byte_rows(b), 0, 128, 64)  # ql
    q |= unpack_2bit(b["qh"]) * np.uint8(16)  # the high 2 bits << 4
    q -= np.uint8(32)
    dl = h2f(b["d"])[:, None] * b["scales"].astype(F32)  # (d * sc) first, as in C
    return scaled(q.view(np.int8).reshape(-1, 16, 16), dl).reshape(-1, 256)


# --- Q8_K --------------------------------------------------------------------------------------

def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K_ref (the CPU's from_float for Q8_K too): lanes.quantize_q8_k, in C or
    its twin quantize_q8_k_into."""
    y = np.empty(len(x), BLOCK_Q8_K)
    lanes.quantize_q8_k(np.ascontiguousarray(x, dtype=F32), y.view(np.uint8))
    return y


@twin("quantize_q8_k")
def quantize_q8_k_into(x, out) -> None:
    """engine._lanes.quantize_q8_k(x, out): whole blocks of 256 floats -> Q8_K blocks in out.
    d = -max/127 as float32 (max: the signed x of the largest |x|), q = nearest_int(x/d) at most
    127, bsums per 16. ggml leaves bsums untouched for an all-zero block; here they are zero."""
    x = np.frombuffer(x, F32).reshape(-1, 256)
    y = np.frombuffer(out, BLOCK_Q8_K)
    amax, vmax = absmax_signed(x)
    ok = amax != 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-127) / vmax
        q = np.where(ok[:, None], np.minimum(127, nearest_int(iscale[:, None] * x)), 0)
        y["d"] = np.where(ok, F32(1) / iscale, F32(0))
    y["qs"] = q
    y["bsums"] = q.reshape(-1, 16, 16).sum(axis=-1)


def dequantize_q8_k(b: np.ndarray) -> np.ndarray:
    """dequantize_row_q8_K: d * q."""
    return scaled(b["qs"], b["d"])


# --- what the block explainer shows: each element's quant and the decoded sub-block scales -------

def _q2_k_quants(b: np.ndarray) -> np.ndarray:
    return unpack_2bit(b["qs"])


def _q3_k_quants(b: np.ndarray) -> np.ndarray:
    """The low 2 bits, minus 4 where the element's hmask bit is clear."""
    hbit = (b["hmask"][:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    return unpack_2bit(b["qs"]).astype(int) - np.where(hbit.reshape(-1, 256), 0, 4)


def _q4_k_quants(b: np.ndarray) -> np.ndarray:
    return _q4_nibbles(b["qs"])


def _q5_k_quants(b: np.ndarray) -> np.ndarray:
    return _q4_nibbles(b["qs"]) + 16 * _hbits(b["qh"])


def _q6_k_quants(b: np.ndarray) -> np.ndarray:
    """ql's nibbles with 2 bits of qh on top, minus 32."""
    ql = b["ql"].reshape(-1, 2, 2, 32)
    lo = np.stack([ql[:, :, 0] & 0xF, ql[:, :, 1] & 0xF, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], 2)
    hi = (b["qh"].reshape(-1, 2, 1, 32) >> _SHIFT4) & 3
    return (lo | (hi << 4)).astype(int) - 32


def _q8_k_quants(b: np.ndarray) -> np.ndarray:
    return b["qs"]


def _q2_k_scales(b: np.ndarray) -> SubScales:
    """Per 16 elements: the low nibble is the scale, the high nibble the min."""
    return SubScales(tuple(int(v & 0xF) for v in b["scales"][0]),
                     tuple(int(v >> 4) for v in b["scales"][0]))


def _q3_k_scales(b: np.ndarray) -> SubScales:
    return SubScales(tuple(int(v) for v in q3_k_scales(b["scales"])[0]))


def _q45_k_scales(b: np.ndarray) -> SubScales:
    sc, m = get_scale_min_k4(b["scales"])
    return SubScales(tuple(sc[0].tolist()), tuple(m[0].tolist()))


def _q6_k_scales(b: np.ndarray) -> SubScales:
    return SubScales(tuple(b["scales"][0].tolist()))


# --- as vec_dot multiplies them (ggml_vec_dot_q{2,3,4,5,6}_K_q8_K) ---------------------------
# Blocks (n, size) uint8 -> DotBlocks: 256 integers a block, each times the scale of its
# sub-block (as the AVX2 code multiplies them, by madd), d, and the mins apart.

def dot_blocks_q2_k(raw: np.ndarray) -> DotBlocks:
    """Q2_K: the 2-bit quants (element 128c + 32k + l at bits 2k of qs[32c + l]), each 16 times
    its 4-bit scale; the 4-bit mins apart (aux, 16), dmin their scale."""
    q = np.multiply(unpack_2bit(raw[:, 16:80]).reshape(-1, 16, 16),
                    (raw[:, :16] & 0x0F)[..., None], dtype=np.int16)
    return DotBlocks(q.reshape(-1, 256), half_at(raw, 80), half_at(raw, 82),
                     (raw[:, :16] >> 4).astype(np.int16))


def dot_blocks_q3_k(raw: np.ndarray) -> DotBlocks:
    """Q3_K: the 2 low bits, minus 4 where the hmask bit (bit r of hmask[l] for element 32r + l)
    is clear, each 16 times its six-bit scale minus 32; no mins."""
    v = unpack_2bit(raw[:, 32:96]).astype(np.int16) + 4 * bit_fields(raw, 0, 32, 32, 1) - 4
    q = np.multiply(v.reshape(-1, 16, 16), q3_k_scales(raw[:, 96:108])[..., None], dtype=np.int16)
    return DotBlocks(q.reshape(-1, 256), half_at(raw, 108))


def dot_blocks_q4_k(raw: np.ndarray) -> DotBlocks:
    """Q4_K: 8 runs of 32 (run 2j the low nibbles of qs[32j..], 2j + 1 the high ones), each times
    its six-bit scale; the 8 six-bit mins apart (aux), dmin their scale."""
    sc, m = get_scale_min_k4(raw[:, 4:16])
    u = nibbles(raw, 16, 144, 32)
    q = np.multiply(u.reshape(-1, 8, 32), sc[..., None], dtype=np.int16)
    return DotBlocks(q.reshape(-1, 256), half_at(raw, 0), half_at(raw, 2), m.astype(np.int16))


def dot_blocks_q5_k(raw: np.ndarray) -> DotBlocks:
    """Q5_K: as Q4_K, the nibble of run r plus 16 * bit r of qh[e] (element e of the run)."""
    sc, m = get_scale_min_k4(raw[:, 4:16])
    u = nibbles(raw, 48, 176, 32) | bit_fields(raw, 16, 48, 32, 1) * np.uint8(16)
    q = np.multiply(u.reshape(-1, 8, 32), sc[..., None], dtype=np.int16)
    return DotBlocks(q.reshape(-1, 256), half_at(raw, 0), half_at(raw, 2), m.astype(np.int16))


def dot_blocks_q6_k(raw: np.ndarray) -> DotBlocks:
    """Q6_K: the unsigned 6-bit values (vec_dot takes their -32 back through the block sums,
    Lanes.LESS_32) times the int8 scale of their 16; the scales apart (aux)."""
    q6 = nibbles(raw, 0, 128, 64) | unpack_2bit(raw[:, 128:192]) * np.uint8(16)
    sc = raw[:, 192:208].view(np.int8)
    q = np.multiply(q6.reshape(-1, 16, 16), sc[..., None], dtype=np.int16)
    return DotBlocks(q.reshape(-1, 256), half_at(raw, 208), aux=sc.astype(np.int16))


# --- one block, one element at a time (dequantize_row_<t>) -------------------------------------

def dequantize_ref_q2_k(b: np.void) -> list:
    """dequantize_row_q2_K, one element at a time."""
    d, dmin = F32(fp16_value(b["d"])), F32(fp16_value(b["dmin"]))
    y = []
    for e in range(256):
        c, r = divmod(e, 128)  # 128-chunk, then 4 shifts of 32 = 2 sub-blocks of 16
        shift, l = divmod(r, 32)
        sc = int(b["scales"][e // 16])
        q = (int(b["qs"][32 * c + l]) >> (2 * shift)) & 3
        y.append(d * F32(sc & 0xF) * F32(q) - dmin * F32(sc >> 4))
    return y


def dequantize_ref_q4_k(b: np.void) -> list:
    """dequantize_row_q4_K, one element at a time."""
    d, dmin = F32(fp16_value(b["d"])), F32(fp16_value(b["dmin"]))
    s = [int(v) for v in b["scales"]]
    y = []
    for e in range(256):
        j = e // 32  # sub-block; get_scale_min_k4(j)
        sc = s[j] & 63 if j < 4 else (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4)
        m = s[j + 4] & 63 if j < 4 else (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
        byte = int(b["qs"][32 * (e // 64) + e % 32])
        q = byte & 0xF if (e // 32) % 2 == 0 else byte >> 4
        y.append(d * F32(sc) * F32(q) - dmin * F32(m))
    return y


def dequantize_ref_q6_k(b: np.void) -> list:
    """dequantize_row_q6_K, one element at a time."""
    d = F32(fp16_value(b["d"]))
    y = []
    for e in range(256):
        c, r = divmod(e, 128)
        k, l = divmod(r, 32)  # quarter k of the chunk: ql low/high nibble, qh bits 2k
        ql = int(b["ql"][64 * c + l + 32 * (k % 2)])
        low = ql & 0xF if k < 2 else ql >> 4
        high = (int(b["qh"][32 * c + l]) >> (2 * k)) & 3
        y.append(d * F32(int(b["scales"][e // 16])) * F32((low | high << 4) - 32))
    return y


_WITH_MIN = "value = d × scale[sub] × q − dmin × min[sub]"
KINDS = [
    QuantKind(T.Q2_K, BLOCK_Q2_K, dequantize_q2_k, quantize_q2_k,
              fields=(("scales", "per 16: low nibble = scale, high nibble = min (4 bits each)"),
                      ("qs", "2-bit quants: byte 32c+l holds elements 128c+l+32k at bits 2k"),
                      ("d", "super-scale of the scales, fp16"),
                      ("dmin", "super-scale of the mins, fp16")),
              formula=_WITH_MIN, unpack=_q2_k_quants, sub_scales=_q2_k_scales,
              dequantize_ref=dequantize_ref_q2_k,
              vec_dot=VecDot(dot_blocks_q2_k, Lanes.PLAIN, Mins.IN_ACC)),
    QuantKind(T.Q3_K, BLOCK_Q3_K, dequantize_q3_k, quantize_q3_k,
              fields=(("hmask", "3rd bit: element e is bit e//32 of hmask[e%32] (clear = -4)"),
                      ("qs", "low 2 bits, packed like Q2_K"),
                      ("scales", "16 six-bit scales (minus 32): low nibbles, then 2-bit highs"),
                      ("d", "super-scale, fp16")),
              formula="value = d × scale[sub] × q", unpack=_q3_k_quants, sub_scales=_q3_k_scales,
              vec_dot=VecDot(dot_blocks_q3_k, Lanes.PLAIN)),
    QuantKind(T.Q4_K, BLOCK_Q4_K, dequantize_q4_k, quantize_q4_k,
              fields=(("d", "super-scale of the scales, fp16"),
                      ("dmin", "super-scale of the mins, fp16"),
                      ("scales", "8 six-bit scales and 8 six-bit mins (get_scale_min_k4)"),
                      ("qs", "4-bit quants: per 64, low nibbles = first 32, high = next 32")),
              formula=_WITH_MIN, unpack=_q4_k_quants, sub_scales=_q45_k_scales,
              dequantize_ref=dequantize_ref_q4_k,
              vec_dot=VecDot(dot_blocks_q4_k, Lanes.PLAIN, Mins.FOUR_LANES)),
    QuantKind(T.Q5_K, BLOCK_Q5_K, dequantize_q5_k, quantize_q5_k,
              fields=(("d", "super-scale of the scales, fp16"),
                      ("dmin", "super-scale of the mins, fp16"),
                      ("scales", "8 six-bit scales and 8 six-bit mins (get_scale_min_k4)"),
                      ("qh", "5th bit: element 32k+l is bit k of qh[l]"),
                      ("qs", "low 4 bits, packed like Q4_K")),
              formula=_WITH_MIN, unpack=_q5_k_quants, sub_scales=_q45_k_scales,
              vec_dot=VecDot(dot_blocks_q5_k, Lanes.PLAIN, Mins.SUMMED)),
    QuantKind(T.Q6_K, BLOCK_Q6_K, dequantize_q6_k, quantize_q6_k,
              fields=(("ql", "low 4 bits of the 6-bit quants"),
                      ("qh", "high 2 bits of the 6-bit quants"),
                      ("scales", "int8 scale per 16 elements"),
                      ("d", "super-scale, fp16")),
              formula="value = d × scale[sub] × q", unpack=_q6_k_quants, sub_scales=_q6_k_scales,
              dequantize_ref=dequantize_ref_q6_k, vec_dot=VecDot(dot_blocks_q6_k, Lanes.LESS_32)),
    QuantKind(T.Q8_K, BLOCK_Q8_K, dequantize_q8_k, quantize_q8_k,
              fields=(("d", "scale, float32"), ("qs", "int8 quants"),
                      ("bsums", "sum of each 16 quants (int16), for the K-quant min terms")),
              unpack=_q8_k_quants, traits_to_float=False, traits_from_float_ref=False),
]
