"""Non-linear 4-bit types: IQ4_NL (32 elements) and IQ4_XS (256, with 6-bit sub-block scales).

Mirrors `quantize_row_iq4_nl_impl` (with `quantize_iq4_nl`, `quantize_iq4_xs` and
`quantize_row_iq4_nl_ref`) and the dequantizers in ggml-quants.c. Each element is one of the 16
levels `kvalues_iq4nl` times a scale. The scale search tries 2*ntry+1 candidates: ggml_quantize_chunk
uses ntry = 7, while IQ4_NL's from_float_ref (also the CPU's from_float) uses ntry = -1 (no search,
and no final re-quantization), so the two give different bytes.
Leaves out: the imatrix weights (w = qw*sqrt(sigma2 + x^2)); without one, w = x^2.
"""

from __future__ import annotations

import numpy as np

from engine.quants.common import (F32, KVALUES_IQ4NL, DotBlocks, Lanes, QuantKind, VecDot,
                                  absmax_signed, best_index_int8, block_dtype, byte_rows, f2h,
                                  fp16_value, h2f, half_at, nearest_int, nibble_of, nibbles,
                                  pack_nibbles, safe_inv, scaled, seq_sum, SubScales,
                                  unpack_nibbles)
from engine.core.types import GGMLType as T

BLOCK_IQ4_NL = block_dtype(("d", "<u2"), ("qs", "u1", 16))
BLOCK_IQ4_XS = block_dtype(("d", "<u2"), ("scales_h", "<u2"), ("scales_l", "u1", 4),
                           ("qs", "u1", 128))

_KV = KVALUES_IQ4NL.astype(F32)
GROUP_MAX_EPS = F32(1e-15)


def _best(x: np.ndarray | np.float32) -> np.ndarray:
    return best_index_int8(KVALUES_IQ4NL, x)


def _scale_search(x: np.ndarray, ntry: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per 32-group (G, 32): the weighted least-squares scale over 2*ntry+1 candidates.

    Returns (scale (G,), L (G, 32) of the first pass, zero mask (G,)).
    """
    w = x * x
    amax, vmax = absmax_signed(x)
    zero = amax < GROUP_MAX_EPS

    def sums(iscale):
        l = _best(iscale[:, None] * x)
        q = _KV[l]
        return l, seq_sum(w * q * x), seq_sum(w * q * q)

    d = (-vmax if ntry > 0 else vmax) / _KV[0]
    L, sumqx, sumq2 = sums(F32(1) / d)
    d = np.where(sumq2 > 0, sumqx / sumq2, F32(0))
    best = d * sumqx
    for itry in range(-ntry, ntry + 1):
        _, sumqx, sumq2 = sums(F32(itry - 127) / vmax)
        take = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
        d = np.where(take, sumqx / sumq2, d)
        best = np.where(take, d * sumqx, best)
    return np.where(zero, F32(0), d).astype(F32), L, zero


def _quantize_iq4_nl(x: np.ndarray, ntry: int) -> np.ndarray:
    y = np.zeros(len(x), BLOCK_IQ4_NL)
    d, L, zero = _scale_search(x, ntry)
    y["d"] = f2h(d)
    if ntry > 0:
        L = _best(safe_inv(d)[:, None] * x)
    else:
        # ggml leaves L as it was (the previous block's, or uninitialised memory) for a block
        # whose amax < 1e-15; the engine writes the level nearest 0 there.
        L = np.where(zero[:, None], _best(F32(0)), L)
    y["qs"] = pack_nibbles(L)
    return y


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """quantize_iq4_nl (the ggml_quantize_chunk path, ntry = 7)."""
    return _quantize_iq4_nl(x, 7)


def quantize_iq4_nl_ref(x: np.ndarray) -> np.ndarray:
    """quantize_row_iq4_nl_ref (from_float_ref and the CPU's from_float, ntry = -1)."""
    return _quantize_iq4_nl(x, -1)


def dequantize_iq4_nl(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq4_nl: d * kvalues_iq4nl[q]."""
    return scaled(nibbles(byte_rows(b), 2, 18, 16, KVALUES_IQ4NL), h2f(b["d"]))


def quantize_iq4_xs(x: np.ndarray) -> np.ndarray:
    """quantize_iq4_xs (ntry = 7; its from_float_ref is the same function)."""
    nb = len(x)
    y = np.zeros(nb, BLOCK_IQ4_XS)
    xs = x.reshape(nb, 8, 32)
    scales, _, _ = _scale_search(xs.reshape(nb * 8, 32), 7)
    scales = scales.reshape(nb, 8)
    _, max_scale = absmax_signed(scales)
    d = -max_scale / F32(32)
    y["d"] = f2h(d)
    l = np.clip(nearest_int(safe_inv(d)[:, None] * scales), -32, 31)  # (nb, 8)
    dl = d[:, None] * l.astype(F32)
    L = _best(safe_inv(dl)[..., None] * xs)  # (nb, 8, 32)
    l += 32
    y["scales_l"] = (l[:, 0::2] & 0xF) | ((l[:, 1::2] & 0xF) << 4)
    y["scales_h"] = ((l >> 4) << (2 * np.arange(8))).sum(axis=1)
    y["qs"] = pack_nibbles(L).reshape(nb, 128)
    return y


def iq4_xs_scales(b: np.ndarray) -> np.ndarray:
    """The 8 six-bit sub-block scales (nb, 8), minus 32: low nibbles of scales_l (two per byte),
    high 2 bits from scales_h (2 bits each)."""
    lo = np.stack([b["scales_l"] & 0xF, b["scales_l"] >> 4], axis=-1).reshape(-1, 8)
    hi = (b["scales_h"][:, None] >> (2 * np.arange(8, dtype=np.uint16))) & 3
    return (lo | (hi << 4)).astype(np.int16) - 32


def dequantize_iq4_xs(b: np.ndarray) -> np.ndarray:
    """dequantize_row_iq4_xs: d * (ls - 32) * kvalues_iq4nl[q]."""
    dl = h2f(b["d"])[:, None] * iq4_xs_scales(b).astype(F32)  # (nb, 8)
    q = nibbles(byte_rows(b), 8, 136, 16, KVALUES_IQ4NL)  # (nb, 256)
    return scaled(q.reshape(-1, 8, 32), dl).reshape(-1, 256)


def _iq4_nl_quants(b: np.ndarray) -> np.ndarray:
    return unpack_nibbles(b["qs"])


def _iq4_xs_quants(b: np.ndarray) -> np.ndarray:
    return unpack_nibbles(b["qs"].reshape(-1, 8, 16))


def _iq4_xs_sub_scales(b: np.ndarray) -> SubScales:
    return SubScales(tuple(iq4_xs_scales(b)[0].tolist()))


# --- as vec_dot multiplies them (ggml_vec_dot_iq4_nl_q8_0, _iq4_xs_q8_K) ----------------------

def dot_blocks_iq4_nl(raw: np.ndarray) -> DotBlocks:
    """IQ4_NL: the non-linear values kvalues_iq4nl[nibble] (low nibbles: elements 0-15)."""
    return DotBlocks(nibbles(raw, 2, 18, 16, KVALUES_IQ4NL).astype(np.int16), half_at(raw, 0))


def dot_blocks_iq4_xs(raw: np.ndarray) -> DotBlocks:
    """IQ4_XS: 8 runs of 32 of IQ4_NL's values (run r: the nibbles of qs[16r..16r+15]); each
    run's six-bit scale minus 32 apart (aux): 4 bits of scales_l, 2 of scales_h."""
    q = nibbles(raw, 8, 136, 16, KVALUES_IQ4NL).astype(np.int16)
    sh = raw[:, 2].astype(np.int16) | raw[:, 3].astype(np.int16) << 8
    lo = np.stack([raw[:, 4:8] & 0x0F, raw[:, 4:8] >> 4], axis=-1).reshape(-1, 8).astype(np.int16)
    ls = (lo | ((sh[:, None] >> (2 * np.arange(8, dtype=np.int16))) & 3) << 4) - 32
    return DotBlocks(q, half_at(raw, 0), aux=ls.astype(np.int16))


def dequantize_ref_iq4_nl(b: np.void) -> list:
    """dequantize_row_iq4_nl, one element at a time."""
    d = F32(fp16_value(b["d"]))
    return [d * F32(KVALUES_IQ4NL[nibble_of(b, j)]) for j in range(32)]


KINDS = [
    QuantKind(T.IQ4_NL, BLOCK_IQ4_NL, dequantize_iq4_nl, quantize_iq4_nl,
              quantize_ref=quantize_iq4_nl_ref,
              fields=(("d", "scale, fp16"),
                      ("qs", "level indices: low nibble = element j, high = j+16; "
                             "d*kvalues_iq4nl[q]")),
              formula="value = d × kvalues[q]", unpack=_iq4_nl_quants,
              dequantize_ref=dequantize_ref_iq4_nl,
              vec_dot=VecDot(dot_blocks_iq4_nl, Lanes.SIGNED, paired=True)),
    QuantKind(T.IQ4_XS, BLOCK_IQ4_XS, dequantize_iq4_xs, quantize_iq4_xs,
              fields=(("d", "super-scale, fp16"),
                      ("scales_h", "high 2 bits of the 8 six-bit scales (2 bits each)"),
                      ("scales_l", "low 4 bits of the 8 scales (two per byte)"),
                      ("qs", "level indices, 16 bytes per 32: low nibble j, high j+16")),
              formula="value = d × scale[sub] × kvalues[q]", unpack=_iq4_xs_quants,
              sub_scales=_iq4_xs_sub_scales,
              vec_dot=VecDot(dot_blocks_iq4_xs, Lanes.SIGNED, run_scales=True)),
]
